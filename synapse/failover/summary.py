"""``experiment_summary.json``: the whole run in one file, for people and for synapse.analysis.

Total wall time and steps; each segment's devices, partition, steps and outcome; every
decision that acted, with each option's predicted ETA; per restart the recovery time
(trigger to first step on the new segment) and its measured parts; time lost to each
slowdown episode; the final accuracy.

`failover_story`: the few lines a person reads at the end of a run: what happened, what it
cost, where to look.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from synapse.failover.controller import FailoverController
from synapse.failover.segments import Segment
from synapse.rundir import EVENTS, EXPERIMENT_SUMMARY, PERFORMANCE, SEGMENTS


def write_experiment_summary(run_dir: Path, policy: str, injection: str, controller: FailoverController,
                             segments: Sequence[Segment], restarts: Sequence[Any], started_at: float,
                             last: dict[str, Any], earlier_restarts: Sequence[dict[str, Any]] = (),
                             ended_at: float | None = None) -> dict[str, Any]:
    """``policy`` and ``injection``: the names of the run's policy and injection scenario (the config's
    policy.name and injection.name); ``restarts``: the supervisor's ``Restart`` records (dataclasses);
    ``earlier_restarts``: those an earlier supervisor of a resumed run recorded (its summary's), kept first;
    ``ended_at``: the run's end (None: now; a simulated run passes its simulated clock)."""
    now = time.time() if ended_at is None else ended_at
    restart_views = [*earlier_restarts,
                     *({k: v for k, v in asdict(r).items() if k not in ("decision", "resume_path")} for r in restarts)]
    summary = {
        "policy": policy,
        "injection": injection,
        "wall_time_s": now - started_at,
        "steps": last.get("steps"),
        "total_steps": last.get("total_steps"),
        "segments": [{**s.to_dict(), "partition": s.partition, "wall_s": (s.ended_at or now) - s.started_at}
                   for s in segments],
        "decisions": [_decision_view(d) for d in controller.decisions],
        "restarts": restart_views,
        "time_lost_s": _time_lost(controller, restarts, earlier_restarts),
        "restart_cost_estimate_s": controller.restart_costs.estimate().to_dict(),
        "final_eval": last.get("final_eval") or {},
        "images_per_s_last_segment": last.get("images_per_s"),
    }
    EXPERIMENT_SUMMARY.path(run_dir).write_text(json.dumps(summary, indent=1, default=float))
    return {**last, "experiment": summary}


def _decision_view(record: dict[str, Any]) -> dict[str, Any]:
    return {"step": record["step"], "action": record["action"], "reason": record["reason"],
            "cause": record.get("cause"), "remaining_steps": record["remaining_steps"],
            "eta_s": {o["kind"]: o["eta_s"] for o in record["options"]},
            "predicted_step_s": {o["kind"]: o["predicted_step_s"] for o in record["options"]},
            "restart_cost_s": {o["kind"]: o["restart_cost_s"] for o in record["options"]},
            "chosen_devices": record["chosen"]["devices"], "alphas": record.get("alphas")}


def _time_lost(controller: FailoverController, restarts: Sequence[Any],
               earlier_restarts: Sequence[dict[str, Any]] = ()) -> dict[str, float]:
    """Seconds lost: slow steps before each action (over the healthy step time) and restart downtime."""
    slow = controller.time_lost_total_s
    downtime = (sum(r.downtime_s or 0.0 for r in restarts)
                + sum(r.get("downtime_s") or 0.0 for r in earlier_restarts))
    return {"slow_steps_s": slow, "restart_downtime_s": downtime, "total_s": slow + downtime}


def failover_story(experiment: dict[str, Any], run_dir: Path) -> list[str]:
    if not experiment:
        return []
    lines = [f"failover ({experiment['policy']} policy, injection {experiment['injection']}): "
             f"{len(experiment['segments'])} segment(s), {experiment['wall_time_s']:.1f} s in all"]
    for segment in experiment["segments"]:
        lines.append(f"  segment {segment['index']} ({segment['reason']}): devices {segment['devices']}, teacher "
                     f"{segment['teacher_counts']} / student {segment['student_counts']} blocks, steps "
                     f"{segment['start_step']}..{segment['end_step']}, {segment['outcome']}")
    for decision in experiment["decisions"]:
        etas = ", ".join(f"{kind.upper()} {eta:.1f} s" for kind, eta in decision["eta_s"].items())
        lines.append(f"  step {decision['step']}: {decision['action'].upper()} ({decision['reason']}); "
                     f"predicted time to finish: {etas}")
    for restart in experiment["restarts"]:
        if restart["recovery_s"] is not None:
            lines.append(f"  {restart['mode']} {restart['action']} into segment {restart['segment']}: "
                         f"{restart['recovery_s']:.1f} s from the {restart['trigger']} to the first step on the "
                         f"new partition, {restart['downtime_s'] or 0.0:.1f} s of it without useful steps")
    lost = experiment["time_lost_s"]
    lines.append(f"  time lost: {lost['slow_steps_s']:.1f} s to slow steps, {lost['restart_downtime_s']:.1f} s "
                 f"to restarts")
    lines.append(f"  records: {EVENTS.path(run_dir)}, {PERFORMANCE.path(run_dir)}, "
                 f"{EXPERIMENT_SUMMARY.path(run_dir)}, segment configs in {SEGMENTS.path(run_dir)}")
    return lines


def print_failover_story(experiment: dict[str, Any], run_dir: Path, log: Callable[[str], None] = print) -> None:
    for line in failover_story(experiment, run_dir):
        log(line)
