"""Analysis of Synapse runs and sweeps: pandas frames, figures, reports.

    from synapse.analysis import load_run, load_sweep, write_report
    run = load_run("outputs/2026-01-01/12-00-00_kd")      # Run: steps, rank_timings, events, decisions, ...
    sweep = load_sweep("outputs/multirun/2026-01-01/12-00-00")   # one row per job
    write_report(run.path)                                  # <run>/report/report.md + figures

    python -m synapse.analysis report <run-or-sweep-dir>

"""
from synapse.analysis.counterfactual import decision_outcomes, option_etas, policy_regret
from synapse.analysis.figures import plot_rank_heatmap, plot_timeline
from synapse.analysis.figures_predictions import PER_ROW, plot_decision_etas, plot_plan_vs_measured, shown_decisions
from synapse.analysis.figures_sweep import SWEEP_METRICS, plot_regret, plot_sweep
from synapse.analysis.files import (
    AnalysisError,
    RecordFileError,
    RunDirError,
    SweepDirError,
    latest_run_dir,
    latest_sweep_dir,
    read_jsonl,
)
from synapse.analysis.load import Run, load_run, load_runs
from synapse.analysis.markdown import cell, markdown_table
from synapse.analysis.markers import timeline_markers
from synapse.analysis.report import job_log_lines, write_report
from synapse.analysis.style import NoDataError, save_figure
from synapse.analysis.sweep import describe_faults, load_sweep, override_value, scenario_labels
from synapse.analysis.tables import DECISION_COLUMNS, RANK_TIMING_COLUMNS, RESTART_COLUMNS, SEGMENT_COLUMNS

__all__ = ["AnalysisError", "DECISION_COLUMNS", "NoDataError", "PER_ROW", "RANK_TIMING_COLUMNS", "RESTART_COLUMNS",
           "RecordFileError", "Run", "RunDirError", "SEGMENT_COLUMNS", "SWEEP_METRICS", "SweepDirError", "cell",
           "decision_outcomes", "describe_faults", "job_log_lines", "latest_run_dir", "latest_sweep_dir", "load_run",
           "load_runs", "load_sweep", "markdown_table", "option_etas", "override_value", "plot_decision_etas",
           "plot_plan_vs_measured", "plot_rank_heatmap", "plot_regret", "plot_sweep", "plot_timeline",
           "policy_regret", "read_jsonl", "save_figure", "scenario_labels", "shown_decisions", "timeline_markers",
           "write_report"]
