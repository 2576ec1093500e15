# python experiments/bench_pipeline.py --out experiments/results/bench_pipeline_cpu.json
"""Pipeline throughput for K = 1, 2, 3 and the measured bubble next to the schedule's theory.

Each configuration is a real run of ``synapse.app.run`` (K worker processes through
the elastic launcher, gloo on CPU). From its performance.jsonl, after ``--warmup`` steps:

* throughput = images per step / median step wall time;
* measured bubble = 1 - sum_r compute_r / (K * step wall): the share of device time the
  ranks spend not computing (schedule bubble plus stage imbalance plus communication);
* theoretical bubble of GPipe/1F1B with equal stages = (K - 1) / (M + K - 1).

K = 1 is run twice: the single-device trainer, and the pipeline runtime on one rank.
On a 2-core machine K = 3 oversubscribes the cores; the JSON records the core count.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import synapse.config  # noqa: E402,F401
from synapse.app import run  # noqa: E402
from synapse.engine import distil_on_one_device  # noqa: E402
from synapse.models import build_model  # noqa: E402
from synapse.rundir import read_jsonl  # noqa: E402


def compose_run(run_dir: Path, overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"run_dir={run_dir}", f"cache_dir={run_dir}/cache", *overrides])


def measure(run_dir: Path, k: int, warmup: int, batch: int) -> dict:
    if (run_dir / "performance.jsonl").exists():
        records = read_jsonl(run_dir / "performance.jsonl")[warmup:]
        walls = [r["step_seconds"] for r in records]
        bubbles = [1 - sum(r["compute_s"]) / (k * r["step_seconds"]) for r in records]
        return {"step_s": statistics.median(walls), "images_per_s": batch / statistics.median(walls),
                "bubble_measured": statistics.median(bubbles)}
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"][warmup:]
    step = statistics.median(r["step_time_s"] for r in records)
    return {"step_s": step, "images_per_s": batch / step, "bubble_measured": 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="resnet_mini")
    parser.add_argument("--student", default="resnet_micro")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "experiments/results/bench_pipeline_cpu.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_pipeline_"))
    teacher = work / "teacher.pt"
    torch.manual_seed(0)
    torch.save(build_model(args.teacher, 10, 1, 32).state_dict(), teacher)
    base = [f"teacher={args.teacher}", f"student={args.student}", f"teacher.checkpoint={teacher}",
            "trainer.accelerator=cpu", "trainer.progress=false", f"trainer.max_steps={args.steps}",
            f"data.batch_size={args.batch}", "checkpoint.at_epoch_end=false", "trainer.eval_every_epochs=1000"]
    rows = []
    for m in args.microbatches:
        for k, runtime in [(1, "single"), (1, "pipeline"), (2, "pipeline"), (3, "pipeline")]:
            run_dir = work / f"k{k}_{runtime}_m{m}"
            overrides = [*base, f"trainer.devices={k}", f"pipeline.microbatches={m}", "trainer.threads=1"]
            cfg = compose_run(run_dir, overrides)
            if runtime == "single":  # the single-device loop in this process: the reference the pipeline reproduces
                distil_on_one_device(cfg, run_dir, log=lambda message: None)
            else:
                run(cfg, log=lambda message: None)
            row = {"K": k, "runtime": "single-device loop" if runtime == "single" else "pipeline", "M": m,
                   **measure(run_dir, k, args.warmup, args.batch), "bubble_theory": (k - 1) / (m + k - 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"cores": os.cpu_count(), "torch": torch.__version__, "teacher": args.teacher, "student": args.student,
              "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
