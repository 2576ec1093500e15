# python experiments/bench_failover_batch.py [--quick] [--accelerator cpu|cuda] [--batch-sizes 16 32 64] [OVERRIDE ...]
"""Failover end to end against a plain pipeline, per batch size, under a slowdown of one device.

For each batch size, three ``train.py`` runs on the same devices and schedule:

* ``no_fault``: no injection (the floor);
* ``slowdown_keep``: one device computes ``factor`` x slower from step ``onset`` to the end,
  policy=keep (a plain pipeline: it never re-plans; only a hard failure would restart it);
* ``slowdown_eta``: the same fault, policy=eta (KEEP / REPLAN / DEGRADE by estimated time to
  completion).

Each run's experiment_summary.json gives the wall time (supervisor start to end: training and
restarts, not the process start, teacher preparation or profiling), the time lost (slow steps
and restart downtime), the decisions that acted and the restarts. The run directories are
numbered job folders under --runs-dir, so ``synapse.analysis`` can load them as one sweep.

CPU (default): the embedded digits with the default models (resnet_mini -> resnet_micro),
3 ranks, partition=auto, batch 16, 32, 64, a 4x slowdown of rank 2 from step 70 (the demo's).
--quick: batch 16 and 32, 80 steps, an untrained teacher and a detector that learns its
baseline in 20 steps instead of 60, so the slowdown can start at step 25.
GPU (the seed's experiment: ViT-L -> ResNet-152, batch 8 to 512, a slowdown on one GPU):
    python experiments/bench_failover_batch.py --accelerator cuda
Extra Hydra overrides after the options apply to every run (e.g. trainer.devices=[0,1,2,3]).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchlib import REPO, machine_load, markdown_table, train_py_summary, write_results

RESULTS = REPO / "experiments" / "results"
RUN_TIMEOUT_S = 3600.0
# The detector ignores 10 warm-up steps and learns its baseline over the next 50 (DetectorConfig):
# a slowdown before step ~60 is the device's normal. --quick shortens both.
QUICK_DETECTOR = ("failover.detector.warmup_steps=5", "failover.detector.baseline_window=15")


@dataclass(frozen=True)
class Setup:
    """What every run of the benchmark shares, and the fault."""

    base: tuple[str, ...]  # Hydra overrides of every run
    batch_sizes: tuple[int, ...]
    steps: int
    onset: int  # first slow step
    factor: float
    slow_rank: int


CPU = Setup(base=("trainer=demo", "partition=auto", "trainer.progress=false", "report=false"),
            batch_sizes=(16, 32, 64), steps=250, onset=70, factor=4.0, slow_rank=2)
CPU_QUICK = replace(CPU, base=(*CPU.base, "teacher.auto_train_epochs=0", *QUICK_DETECTOR), batch_sizes=(16, 32),
                    steps=80, onset=25)
# The seed: a ViT-L teacher (weights irrelevant to timing: untrained) into ResNet-152, ImageNet-shaped synthetic
# data at 224 px, bf16, 4 GPUs, the last one slowed down.
CUDA = Setup(base=("trainer=gpu", "trainer.devices=[0,1,2,3]", "teacher=vit_large", "student=resnet152",
                   "data=synthetic", "teacher.auto_train_epochs=0", "partition=auto", "pipeline.microbatches=4",
                   "trainer.progress=false", "report=false"),
             batch_sizes=(8, 16, 32, 64, 128, 256, 512), steps=300, onset=80, factor=4.0, slow_rank=3)
CUDA_QUICK = replace(CUDA, base=(*CUDA.base, *QUICK_DETECTOR), batch_sizes=(64, 256), steps=150, onset=30)
PRESETS = {("cpu", False): CPU, ("cpu", True): CPU_QUICK, ("cuda", False): CUDA, ("cuda", True): CUDA_QUICK}

# (case, policy, slowed down?), in the order they run for each batch size.
CASES = (("no_fault", "keep", False), ("slowdown_keep", "keep", True), ("slowdown_eta", "eta", True))


def slowdown(setup: Setup) -> str:
    return (f"injection.faults=[{{kind:slow_compute,rank:{setup.slow_rank},start:{setup.onset},"
            f"factor:{setup.factor}}}]")


def case_overrides(setup: Setup, batch_size: int, policy: str, slowed: bool, extra: Sequence[str]) -> list[str]:
    # injection.faults always explicit: an extra experiment=... override may bring faults of its own
    fault = ["injection=slow_compute", slowdown(setup)] if slowed else ["injection=none", "injection.faults=[]"]
    return [*setup.base, f"data.batch_size={batch_size}", f"trainer.max_steps={setup.steps}", f"policy={policy}",
            *fault, *extra]


def run_record(summary: dict[str, Any]) -> dict[str, Any]:
    """The numbers this benchmark reports, from one experiment_summary.json."""
    return {
        "wall_time_s": summary["wall_time_s"],
        "steps": summary["steps"],
        "time_lost_s": summary["time_lost_s"],
        "decisions": [{k: d[k] for k in ("step", "action", "reason")} for d in summary["decisions"]],
        "restarts": [{k: r.get(k) for k in ("action", "trigger", "mode", "recovery_s")} for r in summary["restarts"]],
        "segments": len(summary["segments"]),
        "devices_at_end": summary["segments"][-1]["devices"],
        "student_top1": (summary.get("final_eval") or {}).get("student_top1"),
    }


def compare(runs: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """One batch size's three runs side by side: what the slowdown cost, and what ETA saved over KEEP."""
    wall = {r["case"]: r["wall_time_s"] for r in runs if r["batch_size"] == batch_size}
    eta = next(r for r in runs if r["batch_size"] == batch_size and r["case"] == "slowdown_eta")
    return {"batch_size": batch_size, **{f"{case}_s": wall[case] for case, _, _ in CASES},
            "keep_over_no_fault_s": wall["slowdown_keep"] - wall["no_fault"],
            "eta_over_no_fault_s": wall["slowdown_eta"] - wall["no_fault"],
            "eta_saving_over_keep_s": wall["slowdown_keep"] - wall["slowdown_eta"],
            "eta_actions": [d["action"] for d in eta["decisions"]]}


def run_all(setup: Setup, runs_dir: Path, extra: Sequence[str]) -> list[dict[str, Any]]:
    runs, job = [], 0
    for batch_size in setup.batch_sizes:
        for case, policy, slowed in CASES:
            run_dir = runs_dir / str(job)
            summary, process_s = train_py_summary(run_dir, case_overrides(setup, batch_size, policy, slowed, extra),
                                                  RUN_TIMEOUT_S)
            record = {"batch_size": batch_size, "case": case, "policy": policy,
                      "run_dir": os.path.relpath(run_dir, REPO), "process_wall_s": process_s, **run_record(summary)}
            runs.append(record)
            print(f"batch {batch_size:4d} {case:14s} {record['wall_time_s']:7.1f} s, lost "
                  f"{record['time_lost_s']['total_s']:.1f} s, actions {[d['action'] for d in record['decisions']]}",
                  flush=True)
            job += 1
    return runs


def table(comparisons: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str:
    lost = {(r["batch_size"], r["case"]): r["time_lost_s"]["total_s"] for r in runs}
    rows = [(c["batch_size"], c["no_fault_s"], c["slowdown_keep_s"], c["slowdown_eta_s"], c["eta_saving_over_keep_s"],
             lost[c["batch_size"], "slowdown_keep"], lost[c["batch_size"], "slowdown_eta"],
             ", ".join(c["eta_actions"]) or "keep") for c in comparisons]
    note = ("\nWall time: supervisor start to end (training and restarts). Lost: slow steps over the healthy step "
            "time, plus restart downtime. Where eta did not act, its run and the keep run are the same run twice: "
            "their difference is the machine's run-to-run noise.\n")
    return markdown_table(["batch", "no fault (s)", "slowdown, keep (s)", "slowdown, eta (s)", "eta saves (s)",
                           "lost, keep (s)", "lost, eta (s)", "eta acted"], rows) + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="a few minutes on a 2-core CPU")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--runs-dir", type=Path, default=None, help="where the run directories go")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (a .md table is written next to it)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    setup = PRESETS[args.accelerator, args.quick]
    if args.batch_sizes:
        setup = replace(setup, batch_sizes=tuple(args.batch_sizes))
    name = f"failover_batch_{args.accelerator}{'_quick' if args.quick else ''}"
    runs_dir = args.runs_dir or REPO / "outputs" / "bench" / f"{name}_{time.strftime('%Y%m%d-%H%M%S')}"
    out = args.out or RESULTS / f"{name}.json"
    load_before, started = machine_load(), time.time()
    runs = run_all(setup, runs_dir, args.overrides)
    comparisons = [compare(runs, b) for b in setup.batch_sizes]
    result = {"command": "python experiments/bench_failover_batch.py " + " ".join(sys.argv[1:]),
              "what": __doc__.splitlines()[0], "accelerator": args.accelerator, "quick": args.quick,
              "setup": asdict(setup), "extra_overrides": args.overrides, "benchmark_wall_s": time.time() - started,
              "load_before": load_before, "load_after": machine_load(), "by_batch_size": comparisons, "runs": runs}
    md = table(comparisons, runs)
    write_results(out, result, md)
    print(md + f"-> {out}")


if __name__ == "__main__":
    main()
