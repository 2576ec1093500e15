# python experiments/bench_policies.py [--policies eta,keep,replan,degrade,ski_rental] [--factor 4] [--start 50] [--repeats 3]  # noqa: E501 (a command to copy)
# Replicas (issue #34): python experiments/bench_policies.py --replicas 4 --slow-rank 3 --policies eta,keep,degrade,rebalance --repeats 3 --out experiments/results/bench_policies_replicas_cpu.json  # noqa: E501
# A replica that can shrink: python experiments/bench_policies.py --replicas 2 --devices 4 --microbatches 2 --slow-rank 3 --policies eta,keep,degrade,rebalance,shrink --repeats 3 --out experiments/results/bench_policies_shrink_cpu.json  # noqa: E501
"""Which policy finishes first? One fixed CPU scenario, full runs per policy, side by side.

Scenario: the default demo's models and data on 3 CPU ranks (partition=auto), and a strong,
long slowdown: rank 1's compute becomes ``--factor`` times slower from step ``--start`` to the
end. ``--replicas R``: R replicas of the demo's pipeline instead (``--devices`` in all, default R,
so R x 1 is data parallel; even cuts, ``--microbatches`` each, default 1), the slowdown on
``--slow-rank``; there ``degrade`` drops the slow rank's replica, ``rebalance`` gives it a smaller share
and ``shrink`` re-cuts its replica without it (K > 1). Every policy
sees exactly the same fault; total wall time is the supervisor's (first
launch to the end, restarts included). Targets (issue #6): eta within 5% of the best other
policy, and at least 20% faster than keep. Also reported: the decisions, and per restart the
recovery time (detection or decision to the first step on the new devices) and its parts.

With ``--repeats N`` the policies run in N rounds, each round in a rotated order (so a burst
of load on this shared machine falls on different policies), and the comparison uses each
policy's median wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import REPO, read_events, train_py_summary

RUN_TIMEOUT_S = 900.0


def run_policy(policy: str, run_dir: Path, factor: float, start: int, rank: int = 1,
               layout: tuple[str, ...] = ()) -> dict:
    fault = f"[{{kind:slow_compute,rank:{rank},start:{start},factor:{factor}}}]"
    summary, process_s = train_py_summary(run_dir, [f"policy={policy}", f"injection.faults={fault}",
                                                    "injection.name=bench_policies", "trainer.progress=false",
                                                    "report=false", *layout], RUN_TIMEOUT_S)
    detected = read_events(run_dir, "slowdown_detected")
    return {"policy": policy, "wall_time_s": summary["wall_time_s"], "process_s": process_s,
            "final_top1": summary["final_eval"].get("student_top1"),
            "detection": [{k: d[k] for k in ("rank", "device", "kind", "ratio", "onset_step", "detected_step",
                                             "latency_steps", "latency_s")} for d in detected],
            "decisions": [{k: d[k] for k in ("step", "action", "reason", "eta_s")} for d in summary["decisions"]],
            "restarts": [{k: r[k] for k in ("action", "trigger", "recovery_s", "components")}
                         for r in summary["restarts"]],
            "segments": [{k: s.get(k) for k in ("devices", "teacher_counts", "student_counts", "replicas", "shares",
                                                 "start_step", "end_step")} for s in summary["segments"]],
            "time_lost_s": summary["time_lost_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="eta,keep,replan,degrade,ski_rental")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--start", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1, help="R replicas of the pipeline (1: the demo's one)")
    parser.add_argument("--devices", type=int, default=None, help="CPU ranks in all (default: 3, or R)")
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--microbatches", type=int, default=1, help="with --replicas: micro-batches per step")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "bench_policies_cpu.json")
    args = parser.parse_args()
    policies = args.policies.split(",")
    devices = args.devices or (args.replicas if args.replicas > 1 else 3)
    layout = (f"trainer.devices={devices}", f"trainer.replicas={args.replicas}", "partition=even",
              f"pipeline.microbatches={args.microbatches}") if args.replicas > 1 else ()
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            order = policies[round_ % len(policies):] + policies[:round_ % len(policies)]
            for policy in order:
                run = {**run_policy(policy, Path(tmp) / f"{policy}_{round_}", args.factor, args.start,
                                    args.slow_rank, layout),
                       "round": round_, "load_average": os.getloadavg()}
                runs.append(run)
                print(f"round {round_} {policy}: {run['wall_time_s']:.1f} s", flush=True)
    by_policy = {p: statistics.median(r["wall_time_s"] for r in runs if r["policy"] == p) for p in policies}
    others = {p: t for p, t in by_policy.items() if p != "eta"}
    result = {"command": "python experiments/bench_policies.py " + " ".join(sys.argv[1:]),
              "scenario": (f"default demo models on {devices} CPU ranks"
                           + (f" as {args.replicas} replicas x {devices // args.replicas} stages" if layout else "")
                           + f", rank {args.slow_rank} compute x{args.factor} from step {args.start}"),
              "repeats": args.repeats, "median_wall_time_s": by_policy,
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "runs": runs}
    if "eta" in by_policy and others:
        best = min(others, key=others.get)
        result["eta_vs_best_other"] = by_policy["eta"] / others[best] - 1.0
        result["best_other"] = best
        if "keep" in by_policy:
            result["eta_faster_than_keep"] = 1.0 - by_policy["eta"] / by_policy["keep"]
    args.out.write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: dict) -> str:
    lines = [f"# Policies side by side: {result['scenario']}", "", f"`{result['command']}`", "",
             f"Median total wall time over {result['repeats']} interleaved round(s):", "",
             "| policy | median wall time | spread (min-max) | every run |", "| --- | --- | --- | --- |"]
    for policy, median in result["median_wall_time_s"].items():
        walls = [r["wall_time_s"] for r in result["runs"] if r["policy"] == policy]
        every = ", ".join(f"{w:.1f}" for w in walls)
        lines.append(f"| {policy} | {median:.1f} s | {min(walls):.1f}-{max(walls):.1f} s | {every} s |")
    lines += ["", "Each run:", "",
              "| round | policy | total wall time | time lost (slow steps / restarts) | decisions | "
              "recovery per restart | top-1 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for run in result["runs"]:
        lost = run["time_lost_s"]
        decisions = ", ".join(f"{d['action']}@{d['step']}" for d in run["decisions"]) or "-"
        recovery = ", ".join(f"{r['recovery_s']:.1f} s" for r in run["restarts"] if r["recovery_s"]) or "-"
        lines.append(f"| {run['round']} | {run['policy']} | {run['wall_time_s']:.1f} s | {lost['slow_steps_s']:.1f} / "
                     f"{lost['restart_downtime_s']:.1f} s | {decisions} | {recovery} | {run['final_top1']:.2f}% |")
    if "eta_vs_best_other" in result:
        lines += ["", f"eta vs the best other policy ({result['best_other']}), medians: "
                      f"{result['eta_vs_best_other']:+.1%} (target within +5%)"]
    if "eta_faster_than_keep" in result:
        lines.append(f"eta faster than keep by {result['eta_faster_than_keep']:.1%} (target >= 20%)")
    lines.append(f"load average before/after: {result['load_average_before']} / {result['load_average_after']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
