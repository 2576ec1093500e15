"""The report of a sweep: the job table, the policy comparison, the regret, in ``<sweep>/report/``."""
from __future__ import annotations

import time
from pathlib import Path

from synapse.analysis.counterfactual import policy_regret
from synapse.analysis.figure_set import REPORT_DIR, REPORT_FILE, FigureSet
from synapse.analysis.figures_sweep import plot_regret, plot_sweep
from synapse.analysis.files import read_yaml
from synapse.analysis.markdown import markdown_table
from synapse.analysis.style import FORMATS
from synapse.analysis.sweep import load_sweep

JOB_HEADERS = {"job": "job", "status": "status", "batch_size": "batch", "policy": "policy", "seed": "seed",
               "slowdown": "slowdown",
               "scenario": "scenario", "wall_time_s": "wall (s)", "steps": "steps", "stages": "stages",
               "restarts": "restarts", "decisions": "acting decisions", "time_lost_s": "time lost (s)",
               "recovery_s": "recovery (s)", "final_top1": "top-1 (%)"}
REGRET_HEADERS = {"scenario": "scenario", "policy": "policy", "jobs": "jobs", "value": "mean wall (s)",
                  "best_policy": "best policy", "regret_s": "regret (s)", "regret_min_s": "fastest job",
                  "regret_max_s": "slowest job", "regret_frac": "regret (fraction)"}


def job_log_lines(sweep_dir: Path, sweep) -> list[str]:
    """A markdown line per job with links (relative to the report folder) to its logs that exist."""
    lines = []
    for job in sweep["job"]:
        folder = sweep_dir / str(job)
        links = [f"[folder](../{job}/)"]
        links += [f"[{name}](../{job}/{name})" for name in ("train.log",) if (folder / name).is_file()]
        launcher = launcher_logs(sweep_dir, folder)
        links += [f"[console {p.suffix[1:]}](../{p.relative_to(sweep_dir).as_posix()})" for p in launcher]
        if (folder / "logs").is_dir():
            links.append(f"[rank logs](../{job}/logs/)")
        lines.append(f"- job {job}: " + " · ".join(links))
    return lines


def launcher_logs(sweep_dir: Path, job_folder: Path) -> list[Path]:
    """The console output submitit kept for a job (``.submitit/<id>/<id>_0_log.out|err``), by the job id
    Hydra recorded in the job's ``.hydra/hydra.yaml``; [] for a launcher that keeps none."""
    hydra = read_yaml(job_folder / ".hydra" / "hydra.yaml") or {}
    job_id = str(((hydra.get("hydra") or {}).get("job") or {}).get("id") or "")
    folder = sweep_dir / ".submitit" / job_id
    if not job_id or not folder.is_dir():
        return []
    return sorted(folder.glob(f"{job_id}_*_log.*"))


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
        "## Regret", ("Per scenario (the same overrides apart from the policy and the seed): how much longer "
                      "each policy's runs took than the best one's on average, and its fastest and slowest job "
                      "against that average. With one job per policy the difference is a single noisy run: "
                      "repeat the jobs over seeds (e.g. `seed=0,1,2`) before reading it as a ranking."),
        markdown_table(regret, REGRET_HEADERS),
        "## Figures", figures.markdown(),
        "## Logs", ("Each job's folder, its log (`train.log`), its console as the launcher kept it, and every "
                    "pipeline rank's output (`logs/launch_<stage>/`). Per-job reports: "
                    "`python -m synapse.analysis report <sweep>/<job>`."),
        "\n".join(job_log_lines(Path(path), sweep)),
    ]
    report = out / REPORT_FILE
    report.write_text("\n\n".join(sections) + "\n")
    return report
