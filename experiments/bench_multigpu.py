# python experiments/bench_multigpu.py --gpus 2 --out results_dir   (on a machine with >= 2 GPUs)
"""Multi-GPU validation (issue #10): the seed's ViT-Large -> ResNet-152 distillation on real GPUs.

Every run is a real ``python train.py`` (elastic launcher, one process per GPU, NCCL), on
synthetic ImageNet-shaped images at 224 px in bf16. Parts, each written to ``--out`` as soon as
it is done (a part that fails or times out is recorded and the next one still runs):

* ``smoke``: micro models on every GPU for a few steps (the NCCL pipeline path works at all);
* ``throughput``: per batch size, the single-device trainer on one GPU against the K-GPU
  pipeline with ``partition=auto``: images/s, measured bubble (1 - sum of rank compute /
  (K x step wall)), the schedule's theoretical bubble, planner-predicted vs measured step time;
* ``kill``: rank K-1 SIGKILLed mid-run with periodic checkpoints: recovery on K-1 GPUs;
* ``failover``: a background load (separate processes looping bf16 matmuls) on GPU K-1 from a
  chosen step to the end, ``policy=eta`` against ``policy=keep`` and a run without the load:
  detection latency, the decision with every option's ETA, total time.

Profiles: the committed H200 profiles (micro-batch 16 and 32) are copied into the cache, so
``partition=auto`` plans from them instead of profiling again.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import REPO, read_jsonl

MODELS = ["teacher=vit_large", "student=resnet152", "teacher.auto_train_epochs=0"]
RUN_TIMEOUT_S = [420.0]  # per train.py run (--run-timeout)
GPU_RUN = ["trainer=gpu", "data=synthetic", "data.image_size=224", "data.num_workers=8",
           "data.synthetic_train_size=65536", "data.synthetic_val_size=256", "trainer.eval_every_epochs=1000",
           "trainer.progress=false", "report=false", "checkpoint.at_epoch_end=false"]


def train(run_dir: Path, overrides: list[str], timeout_s: float, log: Path) -> dict:
    """One ``python train.py`` run; its wall time, exit status and the tail of its output."""
    started = time.time()
    command = [sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", *overrides]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        status, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        status, output = "timeout", (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(
            errors="replace")
    with open(log, "a") as f:
        f.write(f"\n===== {' '.join(command)}\n{output}\n===== exit {status}\n")
    return {"exit": status, "process_s": time.time() - started, "tail": output[-1500:] if status != 0 else ""}


def devices(ids: list[int]) -> str:
    """The override placing a run on ``ids`` (GPU ids; a dry run on CPU takes as many ranks)."""
    if GPU_RUN[0] == "trainer=cpu":
        return f"trainer.devices={len(ids)}"
    return f"trainer.devices=[{','.join(map(str, ids))}]"


def step_stats(run_dir: Path, k: int, warmup: int, batch: int) -> dict:
    perf = [r for r in read_jsonl(run_dir / "performance.jsonl") if r.get("segment", 0) == 0][warmup:]
    if perf:
        walls = [r["step_seconds"] for r in perf]
        bubble = statistics.median(1 - sum(r["compute_s"]) / (k * r["step_seconds"]) for r in perf)
    else:  # the single-device trainer writes no performance records
        walls = [r["step_time_s"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"][warmup:]
        bubble = 0.0
    if not walls:
        return {}
    step = statistics.median(walls)
    return {"steps_measured": len(walls), "step_s": step, "images_per_s": batch / step, "bubble_measured": bubble}


def part_smoke(out: Path, gpus: list[int], log: Path) -> dict:
    run_dir = out / "runs" / "smoke"
    result = train(run_dir, ["teacher=vit_micro", "student=resnet_micro", "teacher.auto_train_epochs=0",
                             GPU_RUN[0], devices(gpus), "partition=even", "injection=none",
                             "data=synthetic", "data.image_size=32", "data.batch_size=32", "pipeline.microbatches=4",
                             "trainer.max_steps=6", "trainer.progress=false", "report=false"], 240, log)
    return {**result, "steps": len([r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"])}


def part_throughput(out: Path, gpus: list[int], batches: list[int], steps: int, warmup: int, log: Path,
                    microbatches: list[int] | None = None, partition: str = "auto", single: bool = True,
                    tag: str = "throughput") -> list[dict]:
    """Per batch size: one GPU (K = 1, the whole batch at once: the baseline) and the pipeline over
    ``gpus`` at each micro-batch count (default: micro-batches of 16 or 32 images, the profiled sizes)."""
    rows = []
    k = len(gpus)
    for batch in batches:
        counts = microbatches or [max(k, batch // 16) if batch <= 128 else batch // 32]
        cases = [("single", gpus[:1], 1, [])] if single else []
        cases += [("pipeline", gpus, m, [f"partition={partition}", "policy=keep"])
                  for m in counts]
        for name, ids, m, extra in cases:
            run_dir = out / "runs" / f"{tag}_{name}_b{batch}_m{m}"
            result = train(run_dir, [*MODELS, *GPU_RUN, devices(ids), "injection=none", f"data.batch_size={batch}",
                                     f"trainer.max_steps={steps}", f"pipeline.microbatches={m}", *extra],
                           RUN_TIMEOUT_S[0], log)
            row = {"runtime": name, "gpus": len(ids), "batch": batch, "microbatches": m, **result,
                   **step_stats(run_dir, len(ids), warmup, batch)}
            if name == "pipeline":
                row["partition_mode"] = partition
                row["bubble_theory"] = (k - 1) / (m + k - 1)
                compared = run_dir / "plan_vs_measured.json"
                if compared.exists():
                    plan = json.loads(compared.read_text())
                    row.update({key: plan[key] for key in ("predicted_step_s", "measured_step_s", "step_error")})
                perf = [r for r in read_jsonl(run_dir / "performance.jsonl")][warmup:]
                if perf:
                    row["rank_compute_s"] = [statistics.median(r["compute_s"][i] for r in perf) for i in range(k)]
                partition_file = run_dir / "partition.json"
                if partition_file.exists():
                    row["partition"] = json.loads(partition_file.read_text())
            rows.append(row)
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "tail"}), flush=True)
            write(out, tag, rows)
    return rows


def failover_summary(run_dir: Path) -> dict:
    summary_file = run_dir / "experiment_summary.json"
    if not summary_file.exists():
        return {}
    summary = json.loads(summary_file.read_text())
    events = read_jsonl(run_dir / "failover_events.jsonl")
    fields = ("rank", "device", "kind", "ratio", "onset_step", "detected_step", "latency_steps", "latency_s")
    detected = [{k: e.get(k) for k in fields} for e in events if e["event"] == "slowdown_detected"]
    return {"wall_time_s": summary["wall_time_s"], "steps": summary["steps"], "detections": detected,
            "decisions": summary["decisions"], "time_lost_s": summary["time_lost_s"],
            "restarts": [{k: r[k] for k in ("action", "mode", "trigger", "cause", "recovery_s", "downtime_s",
                                            "components", "trigger_step", "resume_step")} for r in summary["restarts"]],
            "segments": [{k: s[k] for k in ("devices", "teacher_counts", "student_counts", "start_step", "end_step",
                                          "outcome")} for s in summary["segments"]]}


def part_kill(out: Path, gpus: list[int], batch: int, log: Path, steps: int = 120) -> dict:
    run_dir = out / "runs" / "kill"
    last = len(gpus) - 1
    result = train(run_dir, [*MODELS, *GPU_RUN, devices(gpus),
                             "partition=auto", f"data.batch_size={batch}", "pipeline.microbatches=8",
                             f"trainer.max_steps={steps}", f"checkpoint.every={steps // 5}", "injection.name=kill",
                             f"injection.faults=[{{kind:kill,rank:{last},step:{steps // 2},phase:backward}}]"],
                   RUN_TIMEOUT_S[0], log)
    return {**result, **failover_summary(run_dir)}


def part_failover(out: Path, gpus: list[int], batch: int, steps: int, start: int, log: Path) -> list[dict]:
    last = len(gpus) - 1
    load = f"[{{kind:background_load,rank:{last},start:{start},workers:2,matrix_size:8192}}]"
    rows = []
    for name, extra in (("no_load", ["injection=none", "policy=keep"]),
                        ("keep", ["injection.name=background_load", f"injection.faults={load}", "policy=keep"]),
                        ("eta", ["injection.name=background_load", f"injection.faults={load}", "policy=eta"])):
        run_dir = out / "runs" / f"failover_{name}"
        result = train(run_dir, [*MODELS, *GPU_RUN, devices(gpus),
                                 "partition=auto", f"data.batch_size={batch}", f"pipeline.microbatches={batch // 32}",
                                 f"trainer.max_steps={steps}", "monitor.period_s=1", *extra], RUN_TIMEOUT_S[0], log)
        rows.append({"run": name, **result, **failover_summary(run_dir)})
        write(out, "failover", rows)
    return rows


def write(out: Path, name: str, data) -> None:
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def seed_profile_cache(cache: Path) -> None:
    target = cache / "profiles"
    target.mkdir(parents=True, exist_ok=True)
    for file in (REPO / "experiments/results/profiles_h200/profiles").iterdir():
        shutil.copy2(file, target / file.name)


def environment() -> dict:
    import torch
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "cpu_cores": os.cpu_count(), "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--parts", default="smoke,throughput,kill,failover")
    parser.add_argument("--batches", default="64,128,256")
    parser.add_argument("--microbatches", default="", help="pipeline micro-batch counts (default: 16/32 images each)")
    parser.add_argument("--partition", default="auto", help="the pipeline runs' partition: auto or even")
    parser.add_argument("--no-single", action="store_true", help="leave out the single-device baseline runs")
    parser.add_argument("--tag", default="throughput", help="name of the throughput result file and runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--failover-steps", type=int, default=240)
    parser.add_argument("--kill-steps", type=int, default=120)
    parser.add_argument("--load-start", type=int, default=60)
    parser.add_argument("--run-timeout", type=float, default=420.0, help="seconds per train.py run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="the same parts with micro models on CPU ranks: checks this script, measures nothing")
    args = parser.parse_args()
    RUN_TIMEOUT_S[0] = args.run_timeout
    if args.cpu_dry_run:
        MODELS[:] = ["teacher=vit_micro", "student=resnet_micro", "teacher.auto_train_epochs=0"]
        GPU_RUN[:] = [o.replace("trainer=gpu", "trainer=cpu").replace("224", "32") for o in GPU_RUN]
        GPU_RUN.append("trainer.threads=1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("SYNAPSE_CACHE", str(args.out / "cache"))
    args.out.mkdir(parents=True, exist_ok=True)
    seed_profile_cache(Path(os.environ["SYNAPSE_CACHE"]))
    gpus, log = list(range(args.gpus)), args.out / "train_output.log"
    write(args.out, "environment", environment())
    parts = args.parts.split(",")
    if "smoke" in parts:
        write(args.out, "smoke", part_smoke(args.out, gpus, log))
    if "throughput" in parts:
        part_throughput(args.out, gpus, [int(b) for b in args.batches.split(",")], args.steps, args.warmup, log,
                        [int(m) for m in args.microbatches.split(",") if m], args.partition, not args.no_single,
                        args.tag)
    if "kill" in parts:
        write(args.out, "kill", part_kill(args.out, gpus, 128, log, args.kill_steps))
    if "failover" in parts:
        part_failover(args.out, gpus, 128, args.failover_steps, args.load_start, log)


if __name__ == "__main__":
    main()
