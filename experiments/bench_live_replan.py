# python experiments/bench_live_replan.py [--student resnet50] [--steps 12] [--drill-step 5] [--repeats 1]
#        [--devices 4 --replicas 2 --out experiments/results/live_replan_replicas_cpu.json]
"""Live REPLAN vs restart REPLAN on the same scenario, side by side in one invocation.

Runs of train.py that differ only in ``failover.replan_mode``, interleaved: a ResNet-50 student
(25.6 M parameters, AdamW: ~300 MB of parameters and optimizer state) distilled from
resnet_mini on digits over 3 CPU ranks (or ``--devices`` as ``--replicas`` pipelines, every replica
re-cut at once), starting on the even partition, with a REPLAN drill at a fixed step (the planner's
partition differs from the even one, so blocks really move). Reported per mode: time from the
decision to the first step on the new partition (recovery_s) with its parts, and the total run time.
Target (issue #9): live >= 10x faster. The live run of median downtime is written in the form
RestartCostModel.from_benchmark reads: the supervisor's prior for the cost of a live REPLAN.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchlib import REPO, read_events, spread, train_py_summary

RUN_TIMEOUT_S = 900.0


def run(mode: str, run_dir: Path, args) -> dict:
    layout = ([f"trainer.devices={args.devices}", f"trainer.replicas={args.replicas}", "pipeline.microbatches=2"]
              if args.devices else [])
    overrides = [*layout, f"student={args.student}", "teacher=resnet_mini", "partition=even", "injection=none",
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
    parser.add_argument("--devices", type=int, default=None, help="CPU ranks (default: the trainer's, 3)")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of both modes, interleaved")
    parser.add_argument("--out", type=Path, default=REPO / "synapse" / "failover" / "priors" / "live_replan_cpu.json")
    args = parser.parse_args()
    load = os.getloadavg()
    runs: dict[str, list[dict]] = {"live": [], "restart": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for mode in ("live", "restart"):
                runs[mode].append(run(mode, Path(tmp) / f"{mode}{round_}", args))
    live, restart = (sorted(runs[m], key=lambda r: r["downtime_s"])[(args.repeats - 1) // 2] for m in runs)
    layout = (f"{args.devices} CPU ranks as {args.replicas} replicas" if args.devices else "3 CPU ranks")
    result = {"command": "python experiments/bench_live_replan.py " + " ".join(sys.argv[1:]),
              "scenario": f"{args.student} student, resnet_mini teacher, digits, {layout}, even partition, "
                          f"REPLAN drill at step {args.drill_step} of {args.steps}",
              "load_average": load, "load_average_after": os.getloadavg(), "repeats": args.repeats,
              "live": live, "restart": restart, "runs": runs,
              # a live downtime can measure 0 (the new cut's first step no slower than a healthy one)
              "speedup_downtime": restart["downtime_s"] / max(live["downtime_s"], 1e-3),
              "speedup_recovery": restart["recovery_s"] / max(live["recovery_s"], 1e-3),
              "paths": {"live": live["components"]}, "prior_weight": 1.0}
    args.out.write_text(json.dumps(result, indent=1))
    lines = [f"# Live vs restart REPLAN: {result['scenario']}", "", f"`{result['command']}`", "",
             "| mode | downtime (no useful step) | decision -> first step on the new partition | parts "
             "(the median run) | run total |", "| --- | --- | --- | --- | --- |"]
    for mode, r in (("live", live), ("restart", restart)):
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in r["components"].items())
        lines.append(f"| {mode} | {spread([x['downtime_s'] for x in runs[mode]])} s | "
                     f"{spread([x['recovery_s'] for x in runs[mode]])} s | {parts} | "
                     f"{spread([x['wall_time_s'] for x in runs[mode]], 1)} s |")
    lines += ["", "Downtime: from the end of the last step on the old partition to the end of the first on the new, "
                  "less one healthy step. Decision -> first step also holds the step already under way when the "
                  "decision came (useful work on the old partition), the same for both modes. Median (min-max, n).",
              f"The median runs: live has {result['speedup_downtime']:.1f}x less downtime (target >= 10x) and is "
              f"{result['speedup_recovery']:.1f}x faster from decision to first step; "
                  f"{live['moved_blocks']} student blocks"
                  f" ({live['moved_bytes'] / 1e6:.0f} MB with optimizer state) moved"
                  f"; load average {load} before, {result['load_average_after']} after"]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
