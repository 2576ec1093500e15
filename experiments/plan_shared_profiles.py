# Run (repo root): PYTHONPATH=. python experiments/plan_shared_profiles.py [out.json, default experiments/results/...]
"""Plans for the shared ViT-L teacher / ResNet-152 student profiles at K = 2, 3, 4.

For each K: all devices at alpha 1.0, then one device slowed to alpha 1.5 and
3.0. Prints a markdown table (plan vs the even split) and writes the plans as
JSON. Device memory, link bandwidth and micro-batch count are assumptions
(command-line options), the profiles are the measured ones (micro-batch 64, fp32).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from synapse.partitioning import (
    CostModel,
    DeviceSpec,
    PartitionPlan,
    StepSpec,
    even_partition,
    load_profile_csv,
    plan_partition,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILES = REPO / "tests" / "data" / "synapse_profiles"  # copies of the shared GPU profiles
GIB = 1 << 30


def row(k: int, alphas: list[float], plan: PartitionPlan, even_step_s: float) -> dict[str, object]:
    return {
        "K": k, "alphas": alphas, "plan": plan.to_dict(), "even_step_time_s": even_step_s,
        "speedup_vs_even": even_step_s / plan.step_time_s,
        "max_stage_memory_gib": max(plan.stage_memory_bytes) / GIB,
    }


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| K | alphas | teacher blocks | student blocks | stage times (ms) | step (ms) | even split (ms) | speedup "
        "| max mem (GiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        plan = r["plan"]
        times = ", ".join(f"{t * 1e3:.0f}" for t in plan["stage_times_s"])
        lines.append(
            f"| {r['K']} | {', '.join(f'{a:g}' for a in r['alphas'])} | {plan['teacher_counts']} | "
            f"{plan['student_counts']} | {times} | {plan['step_time_s'] * 1e3:.0f} | "
            f"{r['even_step_time_s'] * 1e3:.0f} | {r['speedup_vs_even']:.2f}x | {r['max_stage_memory_gib']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(REPO / "experiments/results/plan_shared_profiles.json"))
    parser.add_argument("--profiles", default=str(DEFAULT_PROFILES))
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    parser.add_argument("--memory-gib", type=float, default=80.0)
    parser.add_argument("--bandwidth-gbps", type=float, default=25.0, help="link bandwidth, GB/s")
    parser.add_argument("--slow-device", type=int, default=0, help="index of the device that gets alpha 1.5 / 3.0")
    args = parser.parse_args()

    teacher = load_profile_csv(Path(args.profiles) / "tnet_vit_large.csv")
    student = load_profile_csv(Path(args.profiles) / "snet_resnet152.csv")
    rows = []
    for k in (2, 3, 4):
        for slow_alpha in (1.0, 1.5, 3.0):
            alphas = [slow_alpha if r == args.slow_device else 1.0 for r in range(k)]
            devices = [DeviceSpec(f"gpu{r}", alpha=a, memory_bytes=args.memory_gib * GIB,
                                  link_bandwidth_bytes_per_s=args.bandwidth_gbps * 1e9) for r, a in enumerate(alphas)]
            plan = plan_partition(teacher, student, devices, args.microbatches, args.schedule)
            model = CostModel(teacher, student, devices, StepSpec(args.microbatches, args.schedule))
            even = model.evaluate(even_partition(len(teacher), k), even_partition(len(student), k))
            rows.append(row(k, alphas, plan, even.step_time_s))
    table = markdown(rows)
    print(f"M = {args.microbatches} micro-batches of 64, {args.schedule}, {args.memory_gib:g} GiB per device, "
          f"{args.bandwidth_gbps:g} GB/s links, uncalibrated model seconds\n")
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = ("microbatches", "schedule", "memory_gib", "bandwidth_gbps", "slow_device")
    settings = {name: getattr(args, name) for name in names}
    out.write_text(json.dumps({"settings": settings, "rows": rows, "markdown": table}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
