"""``load_run(dir) -> Run``: one run directory as tidy pandas frames.

A ``Run`` holds what the run wrote, one frame per kind of record (see ``Run``'s fields); a
file the run did not write (a run without failover, a single-device run) gives an empty
frame with the usual columns. Times stay UNIX seconds in ``time`` columns; ``elapsed_s``
columns count from the run's start (``Run.start_time``) so plots of different runs line up.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from synapse.analysis import files, tables
from synapse.rundir import (
    CONFIG,
    EVENTS,
    EXPERIMENT_SUMMARY,
    METRICS,
    MULTIRUN,
    PERFORMANCE,
    PLAN_VS_MEASURED,
    RUN_SUMMARY,
    SEGMENT_RECORD,
    SEGMENTS,
)

HARD_FAILURE_EVENTS = ("rank_dead", "rank_hung", "probe_failed", "xid", "throttle")


@dataclass
class Run:
    """One run directory, loaded.

    steps: one row per optimizer step (latest record of a step that was redone after a restart).
    rank_timings: long format, one row per step x rank x clock part (``part``: teacher_fwd,
        student_fwd, student_bwd, loss, optimizer, compute, comm, wall).
    events: every failover event (fault, detection, decision, checkpoint, restart, health).
    decisions: one row per logged decision x option, with the option's predicted ETA.
    segments, restarts, evals: one row per segment, restart, evaluation.
    plan: per pipeline stage, the planner's prediction vs the measurement (partition=auto).
    step_clock: the end time of every step record, redone steps' first runs included.
    """

    path: Path
    steps: pd.DataFrame
    rank_timings: pd.DataFrame
    events: pd.DataFrame
    decisions: pd.DataFrame
    segments: pd.DataFrame
    restarts: pd.DataFrame
    evals: pd.DataFrame
    plan: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)  # experiment_summary.json
    run_summary: dict[str, Any] = field(default_factory=dict)  # summary.json (the last launch's)
    plan_step: dict[str, Any] = field(default_factory=dict)  # plan_vs_measured.json's step-level numbers
    config: dict[str, Any] = field(default_factory=dict)  # config.yaml
    start_time: float = math.nan
    step_clock: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["time", "step"]))
    skipped_lines: list[str] = field(default_factory=list)  # damaged record lines left out, each one's error

    @property
    def name(self) -> str:
        """The folder's name; a sweep's job is named with its sweep (``<sweep>/<job>``)."""
        if MULTIRUN.path(self.path.parent).is_file():
            return f"{self.path.parent.name}/{self.path.name}"
        return self.path.name

    @property
    def has_failover(self) -> bool:
        return bool(self.summary) or not self.events.empty

    @property
    def end_time(self) -> float:
        """When the last optimizer step finished (NaN for a run without step records)."""
        last = self.steps["time"].dropna()
        return float(last.iloc[-1]) if len(last) else math.nan

    @property
    def wall_time_s(self) -> float:
        """The experiment's wall time: from experiment_summary.json, else first to last step."""
        if "wall_time_s" in self.summary:
            return float(self.summary["wall_time_s"])
        if "wall_time_s" in self.run_summary and len(self.segments) <= 1:
            return float(self.run_summary["wall_time_s"])
        return self.end_time - self.start_time

    def step_at(self, time: float) -> int:
        """The step that had last finished at ``time`` (0 before the first), redone steps' first runs included."""
        done = self.step_clock[self.step_clock["time"] <= time]
        return int(done["step"].iloc[-1]) if len(done) else 0

    def elapsed(self, times: Any) -> Any:
        """UNIX time(s) as seconds since the run's start."""
        return times - self.start_time


def load_run(path: str | Path, skip_damaged_lines: bool = False) -> Run:
    """Load a run directory (what ``python train.py`` wrote); RunDirError if it is not one.

    A damaged line inside a record file is a RecordFileError naming it, or with
    ``skip_damaged_lines`` left out and named in ``Run.skipped_lines`` (what the report does:
    a run that trained to its end is reported over a line someone or something broke).
    """
    path = files.check_run_dir(Path(path))
    skipped: list[str] | None = [] if skip_damaged_lines else None
    metrics = files.read_jsonl(METRICS.path(path), skipped)
    performance = files.read_jsonl(PERFORMANCE.path(path), skipped)
    events = files.read_jsonl(EVENTS.path(path), skipped)
    summary = files.read_json(EXPERIMENT_SUMMARY.path(path))
    comparison = files.read_json(PLAN_VS_MEASURED.path(path))
    segments = tables.segments_frame(summary.get("segments") or _segment_records(path))
    run = Run(
        path=path,
        steps=_with_segments(tables.steps_frame(performance, metrics), segments),
        rank_timings=tables.rank_timings_frame(performance, metrics),
        events=tables.events_frame(events),
        decisions=tables.decisions_frame([e for e in events if e.get("event") == "decision"],
                                         summary.get("decisions") or ()),
        segments=segments,
        restarts=tables.restarts_frame(summary.get("restarts") or (),
                                       [e for e in events if e.get("event") == "first_step_after_restart"]),
        evals=tables.evals_frame(metrics),
        plan=tables.plan_frame(comparison),
        summary=summary,
        run_summary=files.read_json(RUN_SUMMARY.path(path)),
        plan_step={k: v for k, v in comparison.items() if not isinstance(v, list)},
        config=files.read_yaml(CONFIG.path(path)) or {},
        step_clock=tables.step_clock_frame(performance, metrics),
        skipped_lines=skipped or [],
    )
    run.start_time = _start_time(run)
    for df in (run.steps, run.events, run.decisions):
        df["elapsed_s"] = run.elapsed(df["time"].astype(float))
    return run


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
    return [load_run(p) for p in paths]


def _segment_records(path: Path) -> list[dict[str, Any]]:
    """segments/<n>/segment.json, for a run whose experiment summary is missing (killed supervisor)."""
    root = SEGMENTS.path(path)
    if not root.is_dir():
        return []
    folders = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return [record for record in (files.read_json(f / SEGMENT_RECORD.name()) for f in folders) if record]


def _with_segments(steps: pd.DataFrame, segments: pd.DataFrame) -> pd.DataFrame:
    """Fill the segment of steps whose record lacks it: the segment whose step range holds the step."""
    missing = steps["segment"].isna()
    if missing.any():
        steps.loc[missing, "segment"] = [segment_of_step(int(s), segments) for s in steps.loc[missing, "step"]]
    steps["segment"] = steps["segment"].astype(int)
    return steps


def segment_of_step(step: int, segments: pd.DataFrame) -> int:
    """Segment n runs steps start_step+1 .. end_step; a run without segment records is segment 0."""
    started = segments[segments["start_step"].astype(float) < step]
    return int(started["segment"].iloc[-1]) if len(started) else 0


def _start_time(run: Run) -> float:
    """The earliest moment the run's records know of: the first segment's start, first event, first step."""
    candidates = [run.segments["started_at"].min(), run.events["time"].min()]
    if len(run.steps):
        first = run.steps.iloc[0]
        candidates.append(first["time"] - (first["step_s"] if pd.notna(first["step_s"]) else 0.0))
    known = [float(c) for c in candidates if pd.notna(c)]
    return min(known) if known else math.nan
