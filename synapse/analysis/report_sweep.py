"""The report of a sweep: the job table, the policy comparison, the regret, in ``<sweep>/report/``."""
from __future__ import annotations

import time
from pathlib import Path

from .counterfactual import policy_regret
from .figures_sweep import plot_regret, plot_sweep
from .markdown import markdown_table
from .figure_set import REPORT_DIR, REPORT_FILE, FigureSet
from .style import FORMATS
from .sweep import load_sweep

JOB_HEADERS = {"job": "job", "status": "status", "batch_size": "batch", "policy": "policy", "slowdown": "slowdown",
               "scenario": "scenario", "wall_time_s": "wall (s)", "steps": "steps", "stages": "stages",
               "restarts": "restarts", "decisions": "acting decisions", "time_lost_s": "time lost (s)",
               "recovery_s": "recovery (s)", "final_top1": "top-1 (%)"}
REGRET_HEADERS = {"scenario": "scenario", "policy": "policy", "jobs": "jobs", "value": "wall (s)",
                  "best_policy": "best policy", "regret_s": "regret (s)", "regret_frac": "regret (fraction)"}


def write_sweep_report(path: Path, formats: tuple[str, ...] = FORMATS) -> Path:
    sweep = load_sweep(path)
    regret = policy_regret(sweep)
    out = Path(path) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    figures = FigureSet(out, formats)
    figures.draw("sweep_comparison", "Total time, time lost and recovery by batch size, slowdown and policy",
                 lambda: plot_sweep(sweep))
    figures.draw("policy_regret", "Each policy's regret against the best policy of its scenario",
                 lambda: plot_regret(regret))
    sweep.to_csv(out / "jobs.csv", index=False)
    sections = [
        f"# Sweep report: {Path(path).name}",
        (f"`{path}` — {len(sweep)} jobs, written {time.strftime('%Y-%m-%d %H:%M:%S')} by "
         f"`python -m synapse.analysis report` (every column: `jobs.csv`)"),
        "## Jobs", markdown_table(sweep, JOB_HEADERS),
        "## Regret", ("Per scenario (the same overrides apart from the policy): how much longer each policy's "
                      "run took than the best one's."), markdown_table(regret, REGRET_HEADERS),
        "## Figures", figures.markdown(),
        "Per-job reports: `python -m synapse.analysis report <sweep>/<job>`.",
    ]
    report = out / REPORT_FILE
    report.write_text("\n\n".join(sections) + "\n")
    return report
