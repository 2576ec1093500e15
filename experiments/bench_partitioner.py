# Run (repo root): PYTHONPATH=. python experiments/bench_partitioner.py [out.json] [--repeats 7]
"""Time `plan_partition` on the shared ViT-L / ResNet-152 profiles for K = 2..8 devices.

Targets (issue 4): K = 4 under 100 ms, K = 8 under 1 s. Each scenario is planned
`--repeats` times and the median wall time is reported together with the number
of DP solves the exact search needed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from synapse.partitioning import DeviceSpec, load_profile_csv, plan_partition

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILES = REPO / "tests" / "data" / "synapse_profiles"  # copies of the shared GPU profiles
TARGET_S = {4: 0.1, 8: 1.0}
GIB = 1 << 30


def scenario_alphas(name: str, k: int) -> list[float]:
    if name == "uniform":
        return [1.0] * k
    if name == "one_slow":
        return [1.5 if r == 1 else 1.0 for r in range(k)]
    return np.random.default_rng(k).uniform(1.0, 2.0, k).round(3).tolist()  # "random": seeded per K


def time_plan(teacher, student, devices, microbatches: int, repeats: int) -> tuple[list[float], object]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan = plan_partition(teacher, student, devices, microbatches)
        seconds.append(time.perf_counter() - start)
    return seconds, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(REPO / "experiments/results/bench_partitioner.json"))
    parser.add_argument("--profiles", default=str(DEFAULT_PROFILES), help="folder with the shared profile CSVs")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--memory-gib", type=float, default=80.0)
    parser.add_argument("--bandwidth-gbps", type=float, default=25.0, help="link bandwidth, GB/s")
    args = parser.parse_args()

    teacher = load_profile_csv(Path(args.profiles) / "tnet_vit_large.csv")
    student = load_profile_csv(Path(args.profiles) / "snet_resnet152.csv")
    rows = []
    for scenario in ("uniform", "one_slow", "random"):
        for k in range(2, 9):
            alphas = scenario_alphas(scenario, k)
            devices = [DeviceSpec(f"gpu{r}", alpha=a, memory_bytes=args.memory_gib * GIB,
                                  link_bandwidth_bytes_per_s=args.bandwidth_gbps * 1e9) for r, a in enumerate(alphas)]
            seconds, plan = time_plan(teacher, student, devices, args.microbatches, args.repeats)
            median = statistics.median(seconds)
            rows.append({
                "scenario": scenario, "K": k, "alphas": alphas, "median_ms": round(median * 1e3, 2),
                "min_ms": round(min(seconds) * 1e3, 2), "dp_solves": plan.dp_solves,
                "target_ms": TARGET_S[k] * 1e3 if k in TARGET_S else None,
                "meets_target": median < TARGET_S[k] if k in TARGET_S else None,
                "step_time_ms": round(plan.step_time_s * 1e3, 3),
                "teacher_counts": plan.teacher_counts, "student_counts": plan.student_counts,
            })
            print(f"{scenario:9s} K={k}  median {median * 1e3:8.1f} ms  ({plan.dp_solves:3d} DP solves)  "
                  f"step {plan.step_time_s * 1e3:8.1f} ms")
    result = {
        "microbatches": args.microbatches, "memory_gib": args.memory_gib, "bandwidth_gbps": args.bandwidth_gbps,
        "repeats": args.repeats, "python": platform.python_version(), "machine": platform.machine(), "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
