# python experiments/bench_profiling_overhead.py [--quick] [--accelerator cpu|cuda] [--repeats N] [OVERRIDE ...]
"""What block profiling costs: a first run against a cached one, and against one training epoch.

Profiles are measured once per (model, micro-batch, precision, hardware) and cached under
``<cache_dir>/profiles``; every pipeline run reads them (partition=auto plans with them and the
failover controller predicts with them, whatever the partition mode). Per repeat, in a cache
of its own (cache_dir, with the teacher already in it), profiles deleted first:

1. ``python train.py mode=profile``: cold (both models profiled), then cached (read);
2. a KD run of one epoch with partition=auto: cold, then cached; the difference is what a
   first run pays, and the cached run's epoch (sum of its step times) is the yardstick.

The profiler's own time is each profile's ``elapsed_s`` (its ``.details.json``), read after the
cold mode=profile run and again after the cold KD run (the same profiles, measured twice). The
process times include Python and torch start-up, which cold and cached runs share.

CPU (default): the default models (resnet_mini -> resnet_micro) on the default demo's 3 CPU
ranks, no fault; 3 repeats. --quick: one repeat, an untrained teacher.
GPU (ViT-L -> ResNet-152, synthetic ImageNet-shaped data, bf16, 4 GPUs):
    python experiments/bench_profiling_overhead.py --accelerator cuda
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchlib import REPO, TrainRunError, machine_load, markdown_table, run_train_py, write_results

RESULTS = REPO / "experiments" / "results"
RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Setup:
    base: tuple[str, ...]  # Hydra overrides of every run
    repeats: int


CPU = Setup(base=("trainer=demo", "injection=none", "injection.faults=[]", "trainer.progress=false", "report=false"),
            repeats=3)
CPU_QUICK = Setup(base=(*CPU.base, "teacher.auto_train_epochs=0"), repeats=1)
CUDA = Setup(base=("trainer=gpu", "trainer.devices=[0,1,2,3]", "teacher=vit_large", "student=resnet152",
                   "data=synthetic", "teacher.auto_train_epochs=0", "injection=none", "injection.faults=[]",
                   "trainer.progress=false", "report=false"), repeats=3)
PRESETS = {("cpu", False): CPU, ("cpu", True): CPU_QUICK,
           ("cuda", False): CUDA, ("cuda", True): replace(CUDA, repeats=1)}
KD_EPOCH = ("mode=kd", "partition=auto", "trainer.epochs=1", "trainer.max_steps=null")


def profiler_seconds(cache: Path) -> dict[str, float]:
    """Each profile's measuring time, by role, from the cache's details files."""
    seconds = {}
    for path in (cache / "profiles").glob("*.details.json"):
        details = json.loads(path.read_text())
        seconds[details["role"]] = details["elapsed_s"]
    if set(seconds) != {"teacher", "student"}:
        raise TrainRunError(f"expected a teacher and a student profile in {cache / 'profiles'}, "
                            f"found {sorted(seconds)}")
    return seconds


def epoch_seconds(run_dir: Path) -> dict[str, Any]:
    """One epoch of the KD run: the sum of its step times (training only) and its step count."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, filter(None, lines)) if r.get("kind") == "train" and r.get("epoch") == 0]
    return {"epoch_steps": len(steps), "epoch_train_s": sum(r["step_time_s"] for r in steps)}


def one_repeat(setup: Setup, cache: Path, work: Path, extra: Sequence[str]) -> dict[str, Any]:
    common = [*setup.base, f"cache_dir={cache}", *extra]
    shutil.rmtree(cache / "profiles", ignore_errors=True)
    record = {"profile_cold_process_s": run_train_py(work / "profile_cold", [*common, "mode=profile"], RUN_TIMEOUT_S)}
    record["profiler_s"] = profiler_seconds(cache)
    record["profile_cached_process_s"] = run_train_py(work / "profile_cached", [*common, "mode=profile"],
                                                      RUN_TIMEOUT_S)
    shutil.rmtree(cache / "profiles")
    record["kd_cold_process_s"] = run_train_py(work / "kd_cold", [*common, *KD_EPOCH], RUN_TIMEOUT_S)
    record["profiler_in_kd_s"] = profiler_seconds(cache)  # the same profiles, measured again by the KD run
    record["kd_cached_process_s"] = run_train_py(work / "kd_cached", [*common, *KD_EPOCH], RUN_TIMEOUT_S)
    record.update(epoch_seconds(work / "kd_cached"))
    record["profiler_total_s"] = sum(record["profiler_s"].values())
    record["profiler_in_kd_total_s"] = sum(record["profiler_in_kd_s"].values())
    record["first_run_overhead_s"] = record["kd_cold_process_s"] - record["kd_cached_process_s"]
    record["profiler_per_epoch"] = record["profiler_total_s"] / record["epoch_train_s"]
    record["profiler_in_kd_per_epoch"] = record["profiler_in_kd_total_s"] / record["epoch_train_s"]
    return record


def summarize(repeats: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("profile_cold_process_s", "profile_cached_process_s", "profiler_total_s", "profiler_in_kd_total_s",
            "kd_cold_process_s", "kd_cached_process_s", "first_run_overhead_s", "epoch_train_s", "profiler_per_epoch",
            "profiler_in_kd_per_epoch")
    return {key: statistics.median(r[key] for r in repeats) for key in keys}


def table(medians: dict[str, float]) -> str:
    rows = [("mode=profile, cold (process)", medians["profile_cold_process_s"]),
            ("mode=profile, cached (process)", medians["profile_cached_process_s"]),
            ("profiler itself in mode=profile (teacher + student)", medians["profiler_total_s"]),
            ("KD 1 epoch, partition=auto, cold cache (process)", medians["kd_cold_process_s"]),
            ("KD 1 epoch, partition=auto, cached (process)", medians["kd_cached_process_s"]),
            ("first-run overhead (cold - cached)", medians["first_run_overhead_s"]),
            ("profiler itself in the cold KD run", medians["profiler_in_kd_total_s"]),
            ("one epoch of training (sum of step times)", medians["epoch_train_s"]),
            ("profiler / epoch, mode=profile (ratio)", medians["profiler_per_epoch"]),
            ("profiler / epoch, cold KD run (ratio)", medians["profiler_in_kd_per_epoch"])]
    return markdown_table(["measure (median)", "seconds"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="about a minute and a half on a 2-core CPU")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="result JSON (a .md table is written next to it)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    setup = PRESETS[args.accelerator, args.quick]
    setup = replace(setup, repeats=args.repeats or setup.repeats)
    name = f"profiling_overhead_{args.accelerator}{'_quick' if args.quick else ''}"
    out = args.out or RESULTS / f"{name}.json"
    load_before, started = machine_load(), time.time()
    with tempfile.TemporaryDirectory(prefix="synapse_bench_profiling_") as tmp:
        cache = Path(tmp) / "cache"
        # The teacher goes into the cache first, so that no measured run pays for preparing it.
        run_train_py(Path(tmp) / "prepare", [*setup.base, f"cache_dir={cache}", *args.overrides, *KD_EPOCH],
                     RUN_TIMEOUT_S)
        repeats = []
        for index in range(setup.repeats):
            repeats.append(one_repeat(setup, cache, Path(tmp) / str(index), args.overrides))
            print(f"repeat {index}: {json.dumps(repeats[-1])}", flush=True)
    medians = summarize(repeats)
    result = {"command": "python experiments/bench_profiling_overhead.py " + " ".join(sys.argv[1:]),
              "what": __doc__.splitlines()[0], "accelerator": args.accelerator, "quick": args.quick,
              "setup": asdict(setup), "extra_overrides": args.overrides, "benchmark_wall_s": time.time() - started,
              "load_before": load_before, "load_after": machine_load(), "medians": medians, "repeats": repeats}
    md = table(medians)
    write_results(out, result, md, f"medians of {setup.repeats} repeat(s); ")
    print(md + f"-> {out}")


if __name__ == "__main__":
    main()
