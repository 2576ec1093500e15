# python experiments/bench_live_rebalance.py --repeats 3
"""A REBALANCE of replicas live against by restart, through ``train.py``, interleaved.

2 replicas of one CPU rank, the demo's models, ``policy=rebalance``, rank 1 four times slower from step 5:
the controller shares the batch out by speed once it sees the slow replica. Per run, from the supervisor's
measured restart (``first_step_after_restart``): the downtime (no useful step: from the end of the last step
on the old shares to the end of the first on the new, less one healthy step), the steps done again since the
checkpoint resumed from, the time lost (downtime + steps done again x the median step), the step the decision
came at, the shares, and the whole run's wall time. The two modes differ only in ``failover.replan_mode``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import machine_load, markdown_table, read_events, run_train_py, spread, write_results  # noqa: E402

from synapse.rundir import read_jsonl  # noqa: E402

COMMON = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.replicas=2", "partition=even",
          "pipeline.microbatches=2", "trainer.progress=false", "report=false", "checkpoint.every=20",
          "policy=rebalance", "injection=none", "injection.faults=[{kind:slow_compute,rank:1,start:5,factor:4}]"]
MODES = ("live", "restart")


def run_once(tmp: Path, mode: str, steps: int) -> dict:
    run_dir = tmp / f"{mode}_{time.time_ns()}"
    wall = run_train_py(run_dir, [*COMMON, f"trainer.max_steps={steps}", f"failover.replan_mode={mode}"],
                        timeout_s=900)
    records = read_jsonl(run_dir / "performance.jsonl")
    step_s = statistics.median(float(r["step_seconds"]) for r in records)
    [restart] = read_events(run_dir, "first_step_after_restart")
    return {"mode": mode, "wall_s": wall, "median_step_s": step_s, "downtime_s": restart["downtime_s"],
            "redo_steps": restart["redo_steps"], "lost_s": restart["downtime_s"] + restart["redo_steps"] * step_s,
            "decided_at": read_events(run_dir, "decision")[0]["step"], "first_step": restart["step"],
            "shares": records[-1]["shares"], "launches": len(read_events(run_dir, "launch_ready"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "live_rebalance_cpu.json")
    args = parser.parse_args()
    load_before, runs = machine_load(), []
    with tempfile.TemporaryDirectory() as tmp_name:
        for round_ in range(args.repeats):
            for mode in MODES:
                result = {"round": round_, "loadavg": os.getloadavg()[0], **run_once(Path(tmp_name), mode, args.steps)}
                runs.append(result)
                print(json.dumps(result), flush=True)

    def values(mode: str, key: str) -> list:
        return [r[key] for r in runs if r["mode"] == mode]
    rows = [[label, *(spread(values(mode, key)) for mode in MODES)]
            for label, key in (("downtime (s)", "downtime_s"), ("steps done again", "redo_steps"),
                               ("time lost: downtime + steps done again (s)", "lost_s"),
                               ("launches", "launches"), ("median step (s)", "median_step_s"),
                               ("whole run, wall (s)", "wall_s"))]
    result = {"what": "REBALANCE of 2 x 1 CPU replicas (rank 1 4x slow from step 5), live against by restart",
              "command": "python experiments/bench_live_rebalance.py " + " ".join(sys.argv[1:]),
              "load_before": load_before, "load_after": machine_load(), "runs": runs}
    write_results(args.out, result, markdown_table(["measure", *MODES], rows),
                  runs_note=f"{args.repeats} interleaved rounds; ")
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
