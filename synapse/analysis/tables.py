"""Plain records in, tidy DataFrames out: the pure half of loading a run (no files here).

Every builder returns a frame with its full set of columns even when it has no rows, so code
downstream can always select columns; a run without failover simply has empty frames.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

STEP_COLUMNS = ["step", "segment", "num_devices", "devices", "step_s", "images_per_s", "loss", "lr", "epoch", "time",
                "max_compute_s", "max_comm_s", "attempts"]
RANK_TIMING_COLUMNS = ["step", "segment", "rank", "device", "part", "seconds"]
EVENT_COLUMNS = ["time", "event", "source", "step", "rank", "device"]
DECISION_COLUMNS = ["decision", "time", "step", "action", "reason", "cause", "remaining_steps", "option", "devices",
                    "predicted_step_s", "restart_cost_s", "eta_s", "chosen", "baseline_step_s", "measured_step_s"]
SEGMENT_COLUMNS = ["segment", "reason", "devices", "num_devices", "teacher_counts", "student_counts", "start_step",
                 "end_step", "started_at", "ended_at", "wall_s", "outcome", "resume"]
RESTART_COMPONENTS = ["checkpoint_save_s", "teardown_s", "launch_s", "checkpoint_load_s", "warmup_s"]
RESTART_COLUMNS = ["segment", "action", "mode", "trigger", "cause", "trigger_time", "trigger_step", "resume_step",
                   "relaunch_time", "last_step_time", "first_step", "redo_steps", "recovery_s", "downtime_s",
                   *RESTART_COMPONENTS]
EVAL_COLUMNS = ["step", "epoch", "student_top1", "student_top5", "teacher_top1", "teacher_top5", "time"]
PLAN_COLUMNS = ["rank", "predicted_compute_s", "measured_compute_s", "predicted_noncompute_s",
                "measured_noncompute_s"]
NAN = float("nan")


def frame(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """``rows`` as a DataFrame with at least ``columns`` (in that order first), empty or not."""
    df = pd.DataFrame.from_records(list(rows))
    for column in columns:
        if column not in df.columns:
            df[column] = pd.Series(dtype=object if column in ("devices", "reason", "cause") else float)
    extra = [c for c in df.columns if c not in columns]
    return df[[*columns, *extra]]


def latest_per_step(records: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """One record per step; a step recorded twice (redone after a restart) keeps its later record."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for record in records:
        if "step" in record:
            by_step[int(record["step"])] = record
    return by_step


def _max(values: Sequence[float] | None) -> float:
    return max(values) if values else NAN


def steps_frame(performance: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per optimizer step: the pipeline's timing record joined with the loss record.

    Step time and time stamp come from ``performance.jsonl`` where it exists (its time is the
    step's end; a metrics record may be written after an evaluation), else from ``metrics.jsonl``.
    ``attempts``: how many times the step ran (2: redone after a restart from an older checkpoint).
    """
    perf = latest_per_step(performance)
    train_records = [m for m in metrics if m.get("kind", "train") == "train"]
    train = latest_per_step(train_records)
    attempts = Counter(int(r["step"]) for r in (performance or train_records) if "step" in r)
    rows = []
    for step in sorted(set(perf) | set(train)):
        p, m = perf.get(step, {}), train.get(step, {})
        compute = p.get("compute_s") or m.get("compute_s") or []
        devices = p.get("devices")
        rows.append({
            "step": step, "segment": p.get("segment", NAN),
            "num_devices": len(devices) if devices else (len(compute) or NAN),
            "devices": tuple(devices) if devices else None,
            "step_s": p.get("step_seconds", m.get("step_time_s", NAN)),
            "images_per_s": p.get("images_per_s", m.get("images_per_s", NAN)),
            "loss": m.get("loss", NAN), "lr": m.get("lr", NAN), "epoch": m.get("epoch", NAN),
            "time": p.get("time", m.get("time", NAN)),
            "max_compute_s": _max(compute), "max_comm_s": _max(p.get("comm_s") or m.get("comm_s")),
            "attempts": attempts.get(step, 1),
        })
    return frame(rows, STEP_COLUMNS)


def step_clock_frame(performance: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """When each step record was written, superseded (redone) records included: maps a moment to
    the step that had just finished then."""
    records = performance or [m for m in metrics if m.get("kind", "train") == "train"]
    rows = [{"time": r["time"], "step": int(r["step"])} for r in records if "time" in r and "step" in r]
    return frame(rows, ["time", "step"]).sort_values("time", kind="stable").reset_index(drop=True)


def rank_timings_frame(performance: Sequence[Mapping[str, Any]],
                       metrics: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """Long format: one row per step x rank x clock part (teacher_fwd, ..., compute, comm, wall)."""
    records = latest_per_step(performance) or latest_per_step(m for m in metrics if m.get("compute_s"))
    rows = []
    for step, record in sorted(records.items()):
        compute, comm = record.get("compute_s") or [], record.get("comm_s") or []
        devices = record.get("devices") or list(range(len(compute)))
        parts_per_rank = record.get("ranks") or [
            {"compute": c, **({"comm": comm[r]} if r < len(comm) else {})} for r, c in enumerate(compute)]
        for rank, parts in enumerate(parts_per_rank):
            for part, seconds in parts.items():
                rows.append({"step": step, "segment": record.get("segment", 0), "rank": rank,
                             "device": devices[rank] if rank < len(devices) else NAN, "part": part,
                             "seconds": seconds})
    return frame(rows, RANK_TIMING_COLUMNS)


def events_frame(events: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """All failover events, in time order; each event's own fields are columns (NaN where absent)."""
    df = frame(events, EVENT_COLUMNS)
    return df.sort_values("time", kind="stable").reset_index(drop=True) if len(df) else df


def decisions_frame(decision_events: Sequence[Mapping[str, Any]],
                    summary_decisions: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per logged decision x option. From the event log (every logged decision, KEEPs
    included); without one, from experiment_summary.json (acting decisions only, no time)."""
    rows = []
    if decision_events:
        for index, event in enumerate(decision_events):
            chosen = (event.get("chosen") or {}).get("kind", event.get("action"))
            for option in event.get("options") or []:
                rows.append({**_decision_fields(index, event), "option": option["kind"],
                             "devices": tuple(option.get("devices") or ()),
                             "predicted_step_s": option.get("predicted_step_s", NAN),
                             "restart_cost_s": option.get("restart_cost_s", NAN), "eta_s": option.get("eta_s", NAN),
                             "chosen": option["kind"] == chosen})
    else:
        for index, decision in enumerate(summary_decisions):
            for kind, eta in (decision.get("eta_s") or {}).items():
                chosen = kind == decision.get("action")
                rows.append({**_decision_fields(index, decision), "option": kind,
                             "devices": tuple(decision.get("chosen_devices") or ()) if chosen else None,
                             "predicted_step_s": (decision.get("predicted_step_s") or {}).get(kind, NAN),
                             "restart_cost_s": (decision.get("restart_cost_s") or {}).get(kind, NAN),
                             "eta_s": eta, "chosen": chosen})
    return frame(rows, DECISION_COLUMNS)


def _decision_fields(index: int, record: Mapping[str, Any]) -> dict[str, Any]:
    return {"decision": index, "time": record.get("time", NAN), "step": record.get("step"),
            "action": record.get("action"), "reason": record.get("reason"), "cause": record.get("cause"),
            "remaining_steps": record.get("remaining_steps", NAN),
            "baseline_step_s": _number(record.get("baseline_step_s")),
            "measured_step_s": _number(record.get("measured_step_s"))}


def _number(value: Any) -> float:
    return NAN if value is None else float(value)


def segments_frame(segments: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for s in segments:
        started, ended = s.get("started_at"), s.get("ended_at")
        wall = s.get("wall_s", ended - started if started is not None and ended is not None else NAN)
        rows.append({"segment": s.get("index"), "reason": s.get("reason"), "devices": tuple(s.get("devices") or ()),
                     "num_devices": len(s.get("devices") or ()), "teacher_counts": tuple(s.get("teacher_counts") or ()),
                     "student_counts": tuple(s.get("student_counts") or ()), "start_step": s.get("start_step", NAN),
                     "end_step": _number(s.get("end_step")), "started_at": _number(started),
                     "ended_at": _number(ended), "wall_s": wall, "outcome": s.get("outcome"),
                     "resume": s.get("resume")})
    return frame(rows, SEGMENT_COLUMNS)


def restarts_frame(restarts: Sequence[Mapping[str, Any]],
                   after_restart_events: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per restart with its recovery time split into parts (one column per part).

    recovery_s: trigger (decision or failure) to the end of the first step on the new segment;
    downtime_s: last step on the old partition to the first on the new, less one healthy step;
    mode: "restart" (stop, checkpoint, relaunch) or "live" (re-partitioned without stopping).
    experiment_summary.json has the full record; without it the supervisor's
    ``first_step_after_restart`` events give the measured part."""
    rows = []
    for r in restarts:
        trigger_step, resume_step = r.get("trigger_step", NAN), r.get("resume_step", NAN)
        rows.append({**{k: r.get(k) for k in ("segment", "action", "mode", "trigger", "cause", "trigger_time",
                                               "trigger_step", "resume_step", "relaunch_time", "last_step_time",
                                               "first_step")},
                     "redo_steps": max(0, trigger_step - resume_step) if _is_number(trigger_step, resume_step) else NAN,
                     "recovery_s": _number(r.get("recovery_s")), "downtime_s": _number(r.get("downtime_s")),
                     **_components(r.get("components"))})
    if not restarts:
        for e in after_restart_events:
            rows.append({"segment": e.get("segment"), "action": e.get("action"), "mode": e.get("mode"),
                         "first_step": e.get("step"), "redo_steps": e.get("redo_steps", NAN),
                         "recovery_s": _number(e.get("recovery_s")), "downtime_s": _number(e.get("downtime_s")),
                         **_components(e.get("components"))})
    return frame(rows, RESTART_COLUMNS)


def _components(components: Mapping[str, float] | None) -> dict[str, float]:
    components = components or {}
    return {name: _number(components.get(name)) for name in RESTART_COMPONENTS}


def _is_number(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not math.isnan(v) for v in values)


def evals_frame(metrics: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    evals = latest_per_step(m for m in metrics if m.get("kind") == "eval")
    return frame((dict(record) for _, record in sorted(evals.items())), EVAL_COLUMNS).drop(columns="kind",
                                                                                           errors="ignore")


def plan_frame(comparison: Mapping[str, Any]) -> pd.DataFrame:
    """plan_vs_measured.json per pipeline stage (rank): predicted vs measured compute and the rest."""
    keys = {"predicted_compute_s": "predicted_stage_compute_s", "measured_compute_s": "measured_stage_compute_s",
            "predicted_noncompute_s": "predicted_stage_noncompute_s",
            "measured_noncompute_s": "measured_stage_noncompute_s"}
    ranks = len(comparison.get("measured_stage_compute_s") or [])
    rows = [{"rank": r, **{column: _at(comparison.get(key), r) for column, key in keys.items()}} for r in range(ranks)]
    return frame(rows, PLAN_COLUMNS)


def _at(values: Sequence[float] | None, index: int) -> float:
    return values[index] if values and index < len(values) and values[index] is not None else NAN
