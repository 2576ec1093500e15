"""Analysis of Synapse runs and sweeps: pandas frames, figures, reports.

    from synapse.analysis import load_run, load_sweep, write_report
    run = load_run("outputs/2026-01-01/12-00-00_kd")      # Run: steps, rank_timings, events, decisions, ...
    sweep = load_sweep("outputs/multirun/2026-01-01/12-00-00")   # one row per job
    write_report(run.path)                                  # <run>/report/report.md + figures

    python -m synapse.analysis report <run-or-sweep-dir>
"""
from synapse.analysis.counterfactual import decision_outcomes, option_etas, policy_regret
from synapse.analysis.figures import plot_rank_heatmap, plot_timeline
from synapse.analysis.figures_predictions import plot_decision_etas, plot_plan_vs_measured
from synapse.analysis.figures_sweep import plot_regret, plot_sweep
from synapse.analysis.files import AnalysisError, RecordFileError, RunDirError, SweepDirError, latest_run_dir, latest_sweep_dir
from synapse.analysis.load import Run, load_run, load_runs
from synapse.analysis.markers import timeline_markers
from synapse.analysis.report import write_report
from synapse.analysis.style import NoDataError, save_figure
from synapse.analysis.sweep import load_sweep

__all__ = [
    "AnalysisError", "NoDataError", "RecordFileError", "Run", "RunDirError", "SweepDirError", "decision_outcomes",
    "latest_run_dir", "latest_sweep_dir", "load_run", "load_runs", "load_sweep", "option_etas", "plot_decision_etas", "plot_plan_vs_measured",
    "plot_rank_heatmap", "plot_regret", "plot_sweep", "plot_timeline", "policy_regret", "save_figure",
    "timeline_markers", "write_report",
]
