"""``write_report(dir)``: figures (PNG + SVG) and report.md in ``<dir>/report/``, for a run or a sweep.

    python -m synapse.analysis report outputs/2026-01-01/12-00-00_kd
    python -m synapse.analysis report outputs/multirun/2026-01-01/12-00-00

A figure whose records the run lacks (no decisions, no plan) is listed as not available with
the reason, never an error: a run without failover still gets a report.

A sweep's report holds the job table, the policy comparison and the regret. `FigureSet` is
where a report goes and the figures drawn into it.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from synapse.analysis import files
from synapse.analysis.counterfactual import decision_outcomes, option_etas, policy_regret
from synapse.analysis.figures import plot_rank_heatmap, plot_timeline
from synapse.analysis.figures_predictions import plot_decision_etas, plot_plan_vs_measured
from synapse.analysis.figures_sweep import plot_regret, plot_sweep
from synapse.analysis.files import read_yaml
from synapse.analysis.load import Run, load_run
from synapse.analysis.markdown import escape, key_value_table, markdown_table
from synapse.analysis.style import FORMATS, NoDataError, save_figure
from synapse.analysis.sweep import load_sweep
from synapse.analysis.tables import RESTART_COMPONENTS
from synapse.rundir import (
    EXPERIMENT_SUMMARY,
    HYDRA_JOB,
    LAUNCH_LOGS,
    LOG,
    LOGS,
    MULTIRUN,
    REPORT,
    REPORT_MARKDOWN,
    SUBMITIT_LOG,
    SWEEP_JOBS,
    SWEEP_REPORT,
    SWEEP_REPORT_MARKDOWN,
)


@dataclass
class FigureSet:
    """Figures drawn into one folder, and why the others could not be."""

    directory: Path
    formats: tuple[str, ...] = FORMATS
    written: dict[str, str] = field(default_factory=dict)  # name -> caption
    missing: dict[str, str] = field(default_factory=dict)  # name -> reason

    def draw(self, name: str, caption: str, plot: Callable[[], Figure]) -> None:
        try:
            fig = plot()
        except NoDataError as exc:
            self.missing[name] = str(exc)
            return
        save_figure(fig, self.directory, name, self.formats)
        self.written[name] = caption

    def markdown(self) -> str:
        lines = []
        for name, caption in self.written.items():
            links = " · ".join(f"[{fmt.upper()}]({name}.{fmt})" for fmt in self.formats)
            lines += [f"### {caption}", "", f"![{caption}]({name}.{self.formats[0]})", "", links, ""]
        for name, reason in self.missing.items():
            lines.append(f"- `{name}` not drawn: {escape(reason)}")  # the reason may quote a record
        return "\n".join(lines)


def write_report(path: str | Path, formats: tuple[str, ...] = FORMATS) -> Path:
    """Write ``<path>/report/`` (figures + report.md) for a run or a sweep directory; return report.md."""
    path = Path(path)
    if MULTIRUN.path(path).is_file() or (path.is_dir() and not files.is_run_dir(path)
                                                   and any(p.name.isdigit() for p in path.iterdir())):
        from synapse.analysis.report import write_sweep_report

        return write_sweep_report(path, formats)
    return write_run_report(load_run(path, skip_damaged_lines=True), formats)


def write_run_report(run: Run, formats: tuple[str, ...] = FORMATS) -> Path:
    out = REPORT.path(run.path)
    out.mkdir(parents=True, exist_ok=True)
    figures = FigureSet(out, formats)
    figures.draw("timeline", "Step time and throughput over steps, failover events marked", lambda: plot_timeline(run))
    figures.draw("timeline_time", "The same over wall time (restart downtime visible)",
                 lambda: plot_timeline(run, x="time"))
    figures.draw("rank_heatmap", "Compute seconds per step on each rank", lambda: plot_rank_heatmap(run))
    figures.draw("decision_etas", "Predicted ETA per option at each decision vs realised",
                 lambda: plot_decision_etas(run))
    figures.draw("plan_vs_measured", "Planner prediction vs measurement", lambda: plot_plan_vs_measured(run))
    report = REPORT_MARKDOWN.path(run.path)
    report.write_text(run_markdown(run, figures))
    return report


def run_markdown(run: Run, figures: FigureSet) -> str:
    sections = [
        f"# Run report: {run.name}",
        f"`{run.path}` — written {time.strftime('%Y-%m-%d %H:%M:%S')} by `python -m synapse.analysis report`",
        "## Summary", key_value_table(run_facts(run)),
        "## Segments", markdown_table(run.segments, {"segment": "segment", "reason": "why", "devices": "devices",
                                                 "teacher_counts": "teacher blocks", "student_counts": "student blocks",
                                                 "start_step": "from step", "end_step": "to step",
                                                 "wall_s": "wall (s)", "outcome": "outcome"},
                                   empty="_One launch without segment records (a run without failover)._"),
        "## Decisions", _decisions_markdown(run),
        "## Block calibration", _calibration_markdown(run),
        "## Restarts", _restarts_markdown(run),
        "## Time lost", _time_lost_markdown(run),
        "## Counterfactual: predicted vs realised", _counterfactual_markdown(run),
        "## Figures", figures.markdown(),
    ]
    if run.skipped_lines:  # said before anything drawn from the records
        sections[2:2] = ["## Damaged records left out",
                         "\n".join(f"- {escape(reason)}" for reason in run.skipped_lines)]
    return "\n\n".join(sections) + "\n"


def run_facts(run: Run) -> dict[str, object]:
    """The numbers a reader wants first."""
    summary, config = run.summary, run.config
    final = summary.get("final_eval") or run.run_summary.get("final_eval") or {}
    steps = run.steps
    return {
        "policy": (config.get("policy") or {}).get("name", summary.get("policy")),
        "injection": (config.get("injection") or {}).get("name", summary.get("injection")),
        "student / teacher": f"{(config.get('student') or {}).get('name')} / "
                             f"{(config.get('teacher') or {}).get('name')}",
        "wall time (s)": run.wall_time_s,
        "steps": f"{summary.get('steps', len(steps))} of "
                 f"{summary.get('total_steps', run.run_summary.get('total_steps', '?'))}",
        "segments": max(1, len(run.segments)),
        "restarts": len(run.restarts),
        "decisions logged (acting)": f"{run.decisions['decision'].nunique()} ({len(summary.get('decisions') or [])})",
        "median step time (s)": float(steps["step_s"].median()) if len(steps) else math.nan,
        "median throughput (images/s)": float(steps["images_per_s"].median()) if len(steps) else math.nan,
        "time lost (s)": (summary.get("time_lost_s") or {}).get("total_s", math.nan),
        "final student top-1 (%)": final.get("student_top1", math.nan),
    }


def _decisions_markdown(run: Run) -> str:
    if run.decisions.empty:
        return "_No failover decision was logged._"
    etas = option_etas(run)
    reasons = run.decisions.drop_duplicates("decision").set_index("decision")["reason"]
    etas["reason"] = etas["decision"].map(reasons)
    headers = {"step": "step", "action": "action"}
    headers.update({c: f"ETA {c[4:-2].upper()} (s)" for c in etas.columns if c.startswith("eta_")})
    headers["reason"] = "reason"
    note = ("Every decision the controller logged (KEEPs only when their reason changes, or every 10th); "
            "ETA: predicted time to finish the remaining steps with that option, restart included.")
    return note + "\n\n" + markdown_table(etas, headers)


def _calibration_markdown(run: Run) -> str:
    """Each stage the controller measured to calibrate the block profiles (``block_calibration`` events)."""
    events = run.events[run.events["event"] == "block_calibration"] if "event" in run.events else run.events
    rows = [{"step": event["step"], **stage, "profile_ms": 1e3 * stage["profile_s"],
             "measured_ms": 1e3 * stage["measured_s"]}
            for event in events.to_dict("records") for stage in event.get("stages") or []]
    if not rows:
        return "_No stage was measured for calibration (a run shorter than the detector's warm-up and baseline)._"
    note = ("Each placement's first steady steps: every block of a stage gets its ratio, measured / (profile x "
            "the device's slowdown); every later plan and price uses the calibrated blocks.")
    return note + "\n\n" + markdown_table(pd.DataFrame(rows), {
        "step": "at step", "rank": "rank", "device": "device", "profile_ms": "profile (ms/step)",
        "measured_ms": "measured (ms/step)", "slowdown": "device slowdown", "ratio": "stage ratio"}, digits=3)


def _restarts_markdown(run: Run) -> str:
    if run.restarts.empty:
        return "_No restart._"
    headers = {"segment": "into segment", "action": "action", "mode": "mode", "trigger": "trigger", "cause": "cause",
               "trigger_step": "at step", "resume_step": "resumed from", "redo_steps": "redone steps",
               "recovery_s": "recovery (s)", "downtime_s": "downtime (s)"}
    headers.update({c: c.removesuffix("_s").replace("_", " ") + " (s)" for c in RESTART_COMPONENTS})
    note = ("Recovery: from the decision (or failure) to the end of the first step on the new segment. Downtime: "
            "from the last step on the old partition to the first on the new, less one healthy step.")
    return note + "\n\n" + markdown_table(run.restarts, headers)


def _time_lost_markdown(run: Run) -> str:
    lost = run.summary.get("time_lost_s")
    if not lost:
        return f"_No failover summary ({EXPERIMENT_SUMMARY.template}): time lost is not known._"
    return key_value_table({"slow steps (s)": lost.get("slow_steps_s"),
                            "restart downtime (s)": lost.get("restart_downtime_s"), "total (s)": lost.get("total_s")})


def _counterfactual_markdown(run: Run) -> str:
    outcomes = decision_outcomes(run)
    if outcomes.empty:
        return "_No decision to compare._"
    note = ("Realised: wall time from the decision to the end of the last step. Error = predicted - realised of "
            "the chosen option; a decision followed by later actions did not decide the rest alone.")
    return note + "\n\n" + markdown_table(outcomes, {
        "step": "step", "action": "chosen", "predicted_eta_s": "predicted (s)",
        "realised_remaining_s": "realised (s)", "error_s": "error (s)", "error_frac": "error (fraction)",
        "later_actions": "later actions"})


JOB_HEADERS = {"job": "job", "status": "status", "batch_size": "batch", "policy": "policy", "seed": "seed",
               "slowdown": "slowdown",
               "scenario": "scenario", "wall_time_s": "wall (s)", "steps": "steps", "segments": "segments",
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
        links += [f"[{name}](../{job}/{name})" for name in (LOG.template,) if (folder / name).is_file()]
        launcher = launcher_logs(sweep_dir, folder)
        links += [f"[console {p.suffix[1:]}](../{p.relative_to(sweep_dir).as_posix()})" for p in launcher]
        if LOGS.path(folder).is_dir():
            links.append(f"[rank logs](../{job}/{LOGS.template})")
        lines.append(f"- job {job}: " + " · ".join(links))
    return lines


def launcher_logs(sweep_dir: Path, job_folder: Path) -> list[Path]:
    """The console output submitit kept for a job (``.submitit/<id>/<id>_0_log.out|err``), by the job id
    Hydra recorded in the job's ``.hydra/hydra.yaml``; [] for a launcher that keeps none."""
    hydra = read_yaml(HYDRA_JOB.path(job_folder)) or {}
    job_id = str(((hydra.get("hydra") or {}).get("job") or {}).get("id") or "")
    if not job_id:
        return []
    return sorted(Path(sweep_dir).glob(SUBMITIT_LOG.glob(job_id=job_id)))


def write_sweep_report(path: Path, formats: tuple[str, ...] = FORMATS) -> Path:
    sweep = load_sweep(path)
    regret = policy_regret(sweep)
    out = SWEEP_REPORT.path(path)
    out.mkdir(parents=True, exist_ok=True)
    figures = FigureSet(out, formats)
    figures.draw("sweep_comparison", "Total time, time lost and recovery by batch size, slowdown and policy",
                 lambda: plot_sweep(sweep))
    figures.draw("policy_regret", "Each policy's regret against the best policy of its scenario",
                 lambda: plot_regret(regret))
    sweep.to_csv(SWEEP_JOBS.path(path), index=False)
    sections = [
        f"# Sweep report: {Path(path).name}",
        (f"`{path}` — {len(sweep)} jobs, written {time.strftime('%Y-%m-%d %H:%M:%S')} by "
         f"`python -m synapse.analysis report` (every column: `{SWEEP_JOBS.name()}`)"),
        "## Jobs", markdown_table(sweep, JOB_HEADERS),
        "## Regret", ("Per scenario (the same overrides apart from the policy and the seed): how much longer "
                      "each policy's runs took than the best one's on average, and its fastest and slowest job "
                      "against that average. With one job per policy the difference is a single noisy run: "
                      "repeat the jobs over seeds (e.g. `seed=0,1,2`) before reading it as a ranking."),
        markdown_table(regret, REGRET_HEADERS),
        "## Figures", figures.markdown(),
        "## Logs", (f"Each job's folder, its log (`{LOG.template}`), its console as the launcher kept it, and every "
                    f"pipeline rank's output (`{LAUNCH_LOGS.shown}`). Per-job reports: "
                    "`python -m synapse.analysis report <sweep>/<job>`."),
        "\n".join(job_log_lines(Path(path), sweep)),
    ]
    report = SWEEP_REPORT_MARKDOWN.path(path)
    report.write_text("\n\n".join(sections) + "\n")
    return report
