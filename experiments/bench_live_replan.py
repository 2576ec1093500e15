# python experiments/bench_live_replan.py [--student resnet50] [--steps 12] [--drill-step 5]
"""Live REPLAN vs restart REPLAN on the same scenario, side by side in one invocation.

Two runs of train.py that differ only in ``failover.replan_mode``: a ResNet-50 student
(25.6 M parameters, AdamW: ~300 MB of parameters and optimizer state) distilled from
resnet_mini on digits over 3 CPU ranks, starting on the even partition, with a REPLAN drill
at a fixed step (the planner's partition differs from the even one, so blocks really move).
Reported per mode: time from the decision to the first step on the new partition
(recovery_s) with its parts, and the total run time. Target (issue #9): live >= 10x faster.
The live medians are written in the form RestartCostModel.from_benchmark reads: the
supervisor's prior for the cost of a live REPLAN.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchlib import REPO, read_events, train_py_summary

RUN_TIMEOUT_S = 900.0


def run(mode: str, run_dir: Path, args) -> dict:
    overrides = [f"student={args.student}", "teacher=resnet_mini", "partition=even", "injection=none",
                 f"trainer.max_steps={args.steps}", "data.batch_size=16", "trainer.progress=false", "report=false",
                 f"failover.replan_mode={mode}", f"failover.drills=[{{step:{args.drill_step},action:replan}}]"]
    summary, _ = train_py_summary(run_dir, overrides, RUN_TIMEOUT_S)
    moved = read_events(run_dir, "live_replan")
    [restart] = summary["restarts"]
    return {"mode": mode, "recovery_s": restart["recovery_s"], "downtime_s": restart["downtime_s"],
            "components": restart["components"],
            "wall_time_s": summary["wall_time_s"], "segments": [s["student_counts"] for s in summary["segments"]],
            "moved_blocks": moved[0]["moved_blocks"] if moved else None,
            "moved_bytes": moved[0]["moved_bytes"] if moved else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", default="resnet50")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--drill-step", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "synapse" / "failover" / "priors" / "live_replan_cpu.json")
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        live, restart = (run(mode, Path(tmp) / mode, args) for mode in ("live", "restart"))
    result = {"command": "python experiments/bench_live_replan.py " + " ".join(sys.argv[1:]),
              "scenario": f"{args.student} student, resnet_mini teacher, digits, 3 CPU ranks, even partition, "
                          f"REPLAN drill at step {args.drill_step} of {args.steps}",
              "load_average": load, "live": live, "restart": restart,
              "speedup_downtime": restart["downtime_s"] / live["downtime_s"],
              "speedup_recovery": restart["recovery_s"] / live["recovery_s"],
              "paths": {"live": live["components"]}, "prior_weight": 1.0}
    args.out.write_text(json.dumps(result, indent=1))
    lines = [f"# Live vs restart REPLAN: {result['scenario']}", "", f"`{result['command']}`", "",
             "| mode | downtime (no useful step) | decision -> first step on the new partition | parts | run total |",
             "| --- | --- | --- | --- | --- |"]
    for r in (live, restart):
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in r["components"].items())
        lines.append(f"| {r['mode']} | {r['downtime_s']:.2f} s | {r['recovery_s']:.2f} s | {parts} | "
                     f"{r['wall_time_s']:.1f} s |")
    lines += ["", "Downtime: from the end of the last step on the old partition to the end of the first on the new, "
                  "less one healthy step. Decision -> first step also holds the step already under way when the "
                  "decision came (useful work on the old partition), the same for both modes.",
              f"live has {result['speedup_downtime']:.1f}x less downtime (target >= 10x) and is "
              f"{result['speedup_recovery']:.1f}x faster from decision to first step; "
                  f"{live['moved_blocks']} student blocks"
                  f" ({live['moved_bytes'] / 1e6:.0f} MB with optimizer state) moved"
                  f"; load average {load}"]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
