# python experiments/bench_checkpoint_interval.py [--quick] [--accelerator cpu|cuda] [--intervals 0 5 10 20] [OVERRIDE]
"""What periodic checkpoints cost and what they save: checkpoint.every N against work lost to a kill.

For each interval N in checkpoint.every (0: only at epoch ends and the end of the run):

* a run that kills rank 1 at a fixed step (policy=keep: the failure degrades to the survivors):
  the steps redone after the restart (``first_step_after_restart.redo_steps``: finished steps
  after the checkpoint it resumed from) and the seconds they had taken (their step times in
  performance.jsonl), the restart's recovery time, and the periodic saves before the kill;
* without --quick, also a fault-free run: its wall time against the N=0 run's (the overhead
  of periodic checkpoints end to end) and the cost per checkpoint (``checkpoint_saved``
  events' ``seconds``, rank 0's save).

--quick runs the fault-free run for N=0 only; the overhead is then the save time measured in the
kill runs before the kill.
CPU (default): default models (resnet_mini -> resnet_micro), 3 ranks, partition=auto, batch 16
(88 steps per epoch, so N=0 keeps no checkpoint before the kill), 100 steps, the kill at step 79.
--quick: micro models, even split, 44 steps, the kill at step 39.
GPU: python experiments/bench_checkpoint_interval.py --accelerator cuda trainer.devices=[0,1,2,3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchlib import REPO, TrainRunError, machine_load, markdown_table, read_jsonl, train_py_summary, write_results

RESULTS = REPO / "experiments" / "results"
RUN_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Setup:
    base: tuple[str, ...]  # Hydra overrides of every run
    intervals: tuple[int, ...]
    steps: int
    kill_step: int
    fault_free_every_interval: bool  # False: one fault-free run, at N=0


CPU = Setup(base=("trainer=demo", "partition=auto", "data.batch_size=16", "trainer.progress=false", "report=false"),
            intervals=(0, 5, 10, 20), steps=100, kill_step=79, fault_free_every_interval=True)
CPU_QUICK = Setup(base=("trainer=cpu", "trainer.devices=3", "trainer.threads=1", "partition=even",
                        "teacher=resnet_micro", "student=resnet_micro", "teacher.auto_train_epochs=0",
                        "data.batch_size=16", "trainer.progress=false", "report=false"),
                  intervals=(0, 5, 10, 20), steps=44, kill_step=39, fault_free_every_interval=False)
CUDA = Setup(base=("trainer=gpu", "trainer.devices=[0,1,2,3]", "teacher=vit_large", "student=resnet152",
                   "data=synthetic", "teacher.auto_train_epochs=0", "partition=auto", "trainer.progress=false",
                   "report=false", "checkpoint.at_epoch_end=false"),
            intervals=(0, 10, 50, 100), steps=300, kill_step=251, fault_free_every_interval=True)
PRESETS = {("cpu", False): CPU, ("cpu", True): CPU_QUICK, ("cuda", False): CUDA,
           ("cuda", True): replace(CUDA, fault_free_every_interval=False)}


def periodic_saves(run_dir: Path, before_step: int | None = None) -> list[float]:
    """Seconds of each checkpoint saved on schedule (not the stop checkpoints of a planned restart)."""
    return [e["seconds"] for e in read_jsonl(run_dir / "failover_events.jsonl")
            if e.get("event") == "checkpoint_saved" and not e.get("for_stop")
            and (before_step is None or e["step"] < before_step)]


def save_stats(seconds: list[float]) -> dict[str, Any]:
    return {"saves": len(seconds), "save_s_median": statistics.median(seconds) if seconds else None,
            "save_s_total": sum(seconds)}


def lost_work(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The kill's restart: steps redone, the seconds they had first taken, and the recovery time."""
    if not summary["restarts"]:
        raise TrainRunError(f"{run_dir}: no restart; the kill did not happen")
    restart = summary["restarts"][0]
    first = next(e for e in read_jsonl(run_dir / "failover_events.jsonl")
                 if e.get("event") == "first_step_after_restart" and e["segment"] == restart["segment"])
    redone = [r["step_seconds"] for r in read_jsonl(run_dir / "performance.jsonl")
              if r.get("segment", 0) == 0 and restart["resume_step"] < r["step"] <= restart["trigger_step"]]
    return {"resume_step": restart["resume_step"], "trigger_step": restart["trigger_step"],
            "redo_steps": first["redo_steps"], "redo_s": sum(redone), "recovery_s": restart["recovery_s"],
            "restart_action": restart["action"]}


def run_interval(setup: Setup, every: int, runs_dir: Path, job: int, extra: Sequence[str],
                 fault_free: bool) -> dict[str, Any]:
    common = [*setup.base, f"trainer.max_steps={setup.steps}", f"checkpoint.every={every}", "policy=keep", *extra]
    row: dict[str, Any] = {"every": every}
    if fault_free:
        run_dir = runs_dir / str(job)
        summary, _ = train_py_summary(run_dir, [*common, "injection=none", "injection.faults=[]"], RUN_TIMEOUT_S)
        row["fault_free"] = {"run_dir": os.path.relpath(run_dir, REPO), "wall_time_s": summary["wall_time_s"],
                             **save_stats(periodic_saves(run_dir))}
        job += 1
    kill = f"injection.faults=[{{kind:kill,rank:1,step:{setup.kill_step},phase:forward}}]"
    run_dir = runs_dir / str(job)
    summary, _ = train_py_summary(run_dir, [*common, "injection=kill_rank", kill], RUN_TIMEOUT_S)
    row["kill"] = {"run_dir": os.path.relpath(run_dir, REPO), "wall_time_s": summary["wall_time_s"],
                   **lost_work(run_dir, summary), **save_stats(periodic_saves(run_dir, before_step=setup.kill_step))}
    return row


def add_overheads(rows: list[dict[str, Any]], fault_free_everywhere: bool) -> None:
    """Overhead against N=0 (rows[0]), all rows on one basis: the fault-free runs where every interval has one
    (end to end and in save time), else the kill runs' saves before the kill (save time only)."""
    basis = "fault_free" if fault_free_everywhere else "kill"
    base = rows[0]
    for row in rows:
        row["cost_basis"] = basis
        row["overhead_saves_s"] = row[basis]["save_s_total"] - base[basis]["save_s_total"]
        row["overhead_wall_s"] = (row[basis]["wall_time_s"] - base[basis]["wall_time_s"]
                                  if fault_free_everywhere else None)


def table(rows: list[dict[str, Any]]) -> str:
    dash = lambda v: "-" if v is None else v  # noqa: E731
    body = []
    for r in rows:
        cost, kill = r[r["cost_basis"]], r["kill"]
        ms_per_save = None if cost["save_s_median"] is None else cost["save_s_median"] * 1e3
        body.append((r["every"], cost["saves"], dash(ms_per_save), r["overhead_saves_s"], dash(r["overhead_wall_s"]),
                     kill["resume_step"], kill["redo_steps"], kill["redo_s"], kill["recovery_s"]))
    return markdown_table(["checkpoint.every", "saves", "ms per save", "extra save time (s)", "wall overhead (s)",
                           "resumed from step", "steps redone", "redone (s)", "recovery (s)"], body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="about two minutes on a 2-core CPU")
    parser.add_argument("--intervals", type=int, nargs="+", default=None, help="checkpoint.every values (0 first)")
    parser.add_argument("--runs-dir", type=Path, default=None, help="where the run directories go")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (a .md table is written next to it)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    setup = PRESETS[args.accelerator, args.quick]
    if args.intervals:
        setup = replace(setup, intervals=tuple(args.intervals))
    if setup.intervals[0] != 0:
        parser.error(f"--intervals {list(setup.intervals)}: the first must be 0, the reference (e.g. 0 5 10)")
    name = f"checkpoint_interval_{args.accelerator}{'_quick' if args.quick else ''}"
    runs_dir = args.runs_dir or REPO / "outputs" / "bench" / f"{name}_{time.strftime('%Y%m%d-%H%M%S')}"
    out = args.out or RESULTS / f"{name}.json"
    load_before, started = machine_load(), time.time()
    rows = []
    for every in setup.intervals:
        fault_free = setup.fault_free_every_interval or every == 0
        rows.append(run_interval(setup, every, runs_dir, 2 * len(rows), args.overrides, fault_free))
        print(f"checkpoint.every={every}: {json.dumps(rows[-1]['kill'])}", flush=True)
    add_overheads(rows, setup.fault_free_every_interval)
    result = {"command": "python experiments/bench_checkpoint_interval.py " + " ".join(sys.argv[1:]),
              "what": __doc__.splitlines()[0], "accelerator": args.accelerator, "quick": args.quick,
              "setup": asdict(setup), "extra_overrides": args.overrides, "benchmark_wall_s": time.time() - started,
              "load_before": load_before, "load_after": machine_load(), "intervals": rows}
    md = table(rows)
    write_results(out, result, md)
    print(md + f"-> {out}")


if __name__ == "__main__":
    main()
