"""What happened when: the moments a timeline marks, from a run's events and restarts.

One row per marker: its ``kind`` (below), the step and time where it starts and ends (a
restart spans from its trigger to the first step on the new segment; the others are points),
and a short label a person can read on the plot.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from synapse.analysis.load import HARD_FAILURE_EVENTS, Run
from synapse.analysis.tables import frame

FAULT_ONSET = "fault_onset"
FAULT_CLEARED = "fault_cleared"
DETECTION = "detection"
RECOVERY = "recovery"
DECISION = "decision"  # an action: replan / degrade / replace
KEEP = "keep"  # a logged KEEP decision
CHECKPOINT = "checkpoint"
FAILURE = "failure"  # a hard failure seen by the health monitor
RESTART = "restart"
MARKER_KINDS = (FAULT_ONSET, FAULT_CLEARED, DETECTION, RECOVERY, KEEP, DECISION, CHECKPOINT, FAILURE, RESTART)
MARKER_COLUMNS = ["kind", "step", "end_step", "time", "end_time", "label", "short"]


def timeline_markers(run: Run) -> pd.DataFrame:
    """Every marker of the run, in time order (``elapsed_s`` and ``end_elapsed_s`` added)."""
    rows = [row for event in run.events.to_dict("records") for row in _event_markers(event, run)]
    rows += [_restart_marker(r) for r in run.restarts.to_dict("records")]
    markers = frame(rows, MARKER_COLUMNS)
    markers = markers.sort_values(["time", "step"], kind="stable").reset_index(drop=True)
    markers["elapsed_s"] = run.elapsed(markers["time"].astype(float))
    markers["end_elapsed_s"] = run.elapsed(markers["end_time"].astype(float))
    return markers


def _event_markers(event: Mapping[str, Any], run: Run) -> list[dict[str, Any]]:
    name, time = event["event"], event["time"]
    step = _step_of(event, run)

    def point(kind: str, label: str) -> list[dict[str, Any]]:
        return [{"kind": kind, "step": step, "end_step": step, "time": time, "end_time": time, "label": label,
                 "short": _short_label(kind, event)}]

    if name == "fault_injected":
        return point(FAULT_ONSET, _fault_label(event))
    if name == "fault_cleared" and event.get("reason") != "worker_exit":  # a worker exiting ends nothing
        return point(FAULT_CLEARED, f"fault cleared on rank {_int_text(event.get('rank'))}")
    if name == "slowdown_detected":
        return point(DETECTION, f"slowdown: rank {_int_text(event.get('rank'))} {event.get('kind')} "
                                f"x{event.get('ratio', math.nan):.1f}, "
                                f"{_int_text(event.get('latency_steps'))} steps late")
    if name == "slowdown_recovered":
        return point(RECOVERY, f"rank {_int_text(event.get('rank'))} recovered")
    if name == "decision":
        action = str(event.get("action"))
        return point(KEEP if action == "keep" else DECISION, f"{action.upper()} at step {step:.0f}")
    if name == "checkpoint_saved":
        return point(CHECKPOINT, f"checkpoint {step:.0f}" + (" (for the restart)" if event.get("for_stop") else ""))
    if name in HARD_FAILURE_EVENTS and event.get("hard"):
        return point(FAILURE, f"{name.replace('_', ' ')}: rank {_int_text(event.get('rank'))}")
    return []


def _short_label(kind: str, event: Mapping[str, Any]) -> str:
    """The few words written next to a marker's line on a plot."""
    if kind == FAULT_ONSET:
        return f"{event.get('kind', 'fault')} r{_int_text(event.get('rank'))}"
    if kind in (DECISION, KEEP):
        return str(event.get("action")).upper()
    return {DETECTION: "detected", RECOVERY: "recovered", FAILURE: event["event"].replace("_", " ")}.get(kind, "")


def _fault_label(event: Mapping[str, Any]) -> str:
    kind, rank = event.get("kind", "fault"), _int_text(event.get("rank"))
    factor = event.get("factor")
    return f"{kind} on rank {rank}" + (f" x{factor:g}" if isinstance(factor, (int, float)) else "")


def _int_text(value: Any) -> str:
    return str(int(value)) if isinstance(value, (int, float)) and not math.isnan(value) else "?"


def _restart_marker(restart: Mapping[str, Any]) -> dict[str, Any]:
    recovery = restart.get("recovery_s")
    start = restart.get("trigger_time")
    known = isinstance(recovery, (int, float)) and not math.isnan(recovery)
    how = restart.get("action") if restart.get("mode") in (None, "restart") else f"{restart.get('action')}, live"
    label = f"restart -> segment {restart.get('segment')} ({how}" + (
        f", {recovery:.1f} s)" if known else ")")
    return {"kind": RESTART, "step": restart.get("trigger_step"), "end_step": restart.get("first_step"),
            "time": start, "end_time": start + recovery if known and start is not None else start, "label": label,
            "short": f"restart {recovery:.1f} s" if known else "restart"}


def _step_of(event: Mapping[str, Any], run: Run) -> float:
    """The event's step; for events that carry none (health), the last step finished before it."""
    for key in ("detected_step", "step"):
        value = event.get(key)
        if isinstance(value, (int, float)) and not math.isnan(value):
            return float(value)
    return float(run.step_at(event["time"]))
