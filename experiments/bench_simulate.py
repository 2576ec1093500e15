# python experiments/bench_simulate.py [--steps 10000] [--devices 64] [--layouts 64x1,8x8] [--policy eta]
#                                     [--repeats 1]
"""How fast mode=simulate is: a ``--steps``-step run of ``--devices`` simulated H200s (ViT-L ->
ResNet-152 on the H200 block profiles), one per layout (R replicas x K stages), timed end to end
in this process (config, planner, first plan, the steps, the records) and for the steps alone,
``--repeats`` times per layout (the table gives each run; the machine is shared, so CPU time too).
The issue's target: 10,000 steps of 64 GPUs in under 30 s on one core. One slowdown (device 5
compute x3 for 500 steps from the middle step) makes the controller decide as in a real run.
Writes experiments/results/simulate_speed.{json,md}.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hydra import compose, initialize_config_dir  # noqa: E402

import synapse.config  # noqa: E402, F401  (registers the config schema)
from synapse.app import run  # noqa: E402
from synapse.conf import CONF_DIR  # noqa: E402

H200 = REPO / "experiments" / "results" / "profiles_h200" / "profiles"
MODELS = ("teacher=vit_large", "student=resnet152", "data=synthetic", "trainer.accelerator=cuda",
          f"simulate.teacher_profile={H200 / 'vit_large_teacher_mb32_bf16_nvidia-h200_224px_3ch_100cls.csv'}",
          f"simulate.student_profile={H200 / 'resnet152_student_mb32_bf16_nvidia-h200_224px_3ch_100cls.csv'}")


def simulate(overrides: list[str], run_dir: Path) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench_simulate"):
        cfg = compose(config_name="config", overrides=[f"run_dir={run_dir}", "mode=simulate", "report=false",
                                                       *MODELS, *overrides])
    began, cpu_began = time.perf_counter(), time.process_time()
    result = run(cfg, log=lambda line: None)["simulation"]
    # CPU time too: this machine is shared, and its wall time follows the others' load
    return {**result, "total_s": time.perf_counter() - began, "cpu_s": time.process_time() - cpu_began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--layouts", default="64x1,8x8", help="RxK per run, comma-separated")
    parser.add_argument("--policy", default="eta")
    parser.add_argument("--repeats", type=int, default=1, help="runs per layout (n)")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "simulate_speed.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="synapse-bench-simulate-") as tmp:
        for layout, repeat in itertools.product(args.layouts.split(","), range(args.repeats)):
            replicas, stages = (int(x) for x in layout.split("x"))
            start = args.steps // 2
            fault = f"injection.faults=[{{kind:slow_compute,rank:5,start:{start},end:{start + 500},factor:3}}]"
            overrides = [f"trainer.devices={replicas * stages}", f"trainer.replicas={replicas}",
                         f"trainer.max_steps={args.steps}", f"data.batch_size={replicas * 4 * 32}",
                         "pipeline.microbatches=4", "partition=auto", f"policy={args.policy}", "injection.name=bench",
                         fault, "failover.max_restarts=100"]
            result = simulate(overrides, Path(tmp) / f"{layout}_{repeat}")
            runs.append({"layout": layout, "steps": result["steps"], "total_s": result["total_s"],
                         "cpu_s": result["cpu_s"], "load_average": os.getloadavg()[0],
                         "steps_s": result["simulate_s"], "decisions": result["decisions"],
                         "ms_per_step": 1e3 * result["simulate_s"] / max(1, result["steps"])})
            print(json.dumps(runs[-1]), flush=True)
    record = {"command": " ".join(["python experiments/bench_simulate.py", *sys.argv[1:]]), "runs": runs,
              "machine": f"{os.cpu_count()} cores (shared), load average {os.getloadavg()[0]:.2f} at the end",
              "target": "10,000 steps x 64 GPUs under 30 s on one core"}
    args.out.write_text(json.dumps(record, indent=1))
    def decided(run: dict) -> str:
        return ", ".join(f"{d['action']}@{d['step']}" for d in run["decisions"]) or "-"

    rows = "\n".join(f"| {r['layout']} | {r['steps']} | {r['total_s']:.1f} s | {r['cpu_s']:.1f} s | "
                     f"{r['steps_s']:.1f} s | {r['ms_per_step']:.2f} | {r['load_average']:.1f} | {decided(r)} |"
                     for r in runs)
    args.out.with_suffix(".md").write_text(
        f"# mode=simulate speed: {args.devices} simulated H200s, ViT-L -> ResNet-152\n\n`{record['command']}`; "
        f"{record['machine']}; {args.repeats} run(s) per layout (n={args.repeats})\n\n"
        f"| layout (R x K) | steps | total (wall) | total (CPU) | "
        f"steps alone (wall) | ms/step (wall) | load average after | decisions |\n"
        f"| --- | --- | --- | --- | --- | --- | --- | --- |\n{rows}\n")


if __name__ == "__main__":
    main()
