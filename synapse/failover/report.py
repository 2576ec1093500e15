"""The few lines a person reads at the end of a run: what happened, what it cost, where to look."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def failover_story(experiment: dict[str, Any], run_dir: Path) -> list[str]:
    if not experiment:
        return []
    lines = [f"failover ({experiment['policy']} policy, injection {experiment['injection']}): "
             f"{len(experiment['stages'])} stage(s), {experiment['wall_time_s']:.1f} s in all"]
    for stage in experiment["stages"]:
        lines.append(f"  stage {stage['index']} ({stage['reason']}): devices {stage['devices']}, teacher "
                     f"{stage['teacher_counts']} / student {stage['student_counts']} blocks, steps "
                     f"{stage['start_step']}..{stage['end_step']}, {stage['outcome']}")
    for decision in experiment["decisions"]:
        etas = ", ".join(f"{kind.upper()} {eta:.1f} s" for kind, eta in decision["eta_s"].items())
        lines.append(f"  step {decision['step']}: {decision['action'].upper()} ({decision['reason']}); "
                     f"predicted time to finish: {etas}")
    for restart in experiment["restarts"]:
        if restart["recovery_s"] is not None:
            lines.append(f"  {restart['mode']} {restart['action']} into stage {restart['stage']}: "
                         f"{restart['recovery_s']:.1f} s from the {restart['trigger']} to the first step on the "
                         f"new partition, {restart['downtime_s'] or 0.0:.1f} s of it without useful steps")
    lost = experiment["time_lost_s"]
    lines.append(f"  time lost: {lost['slow_steps_s']:.1f} s to slow steps, {lost['restart_downtime_s']:.1f} s "
                 f"to restarts")
    lines.append(f"  records: {run_dir / 'failover_events.jsonl'}, {run_dir / 'performance.jsonl'}, "
                 f"{run_dir / 'experiment_summary.json'}, stage configs in {run_dir / 'stages'}")
    return lines


def print_failover_story(experiment: dict[str, Any], run_dir: Path, log: Callable[[str], None] = print) -> None:
    for line in failover_story(experiment, run_dir):
        log(line)
