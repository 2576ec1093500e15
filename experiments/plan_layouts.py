# Run (repo root): PYTHONPATH=. python experiments/plan_layouts.py [out.json]
# (default out: experiments/results/plan_layouts_h200.json)
"""The planner's layout choice on the H200 block profiles: 2, 4 and 8 GPUs, ViT-L/16 -> ResNet-152 and
ViT-B/16 -> ResNet-50, global batch 128, 256 and 512, against pure data parallelism and one pipeline.

Every layout is priced as ``trainer.replicas=auto`` prices it (``synapse.partitioning.choose_layout``):
each (R replicas, K = N / R stages, M micro-batches) with profiles at its micro-batch, batch / (R M),
through the same cost model (the slowest replica's pipeline plus the ring all-reduce of each stage's
student gradients). The profiles were measured on one H200 in bf16 at micro-batches 16 and 32
(experiments/results/profiles_h200/); other sizes are scaled linearly from the nearest of the two
(``scale_to_micro_batch``: larger micro-batches run a GPU more efficiently than that, so layouts
with large micro-batches, pure data parallelism above all, are priced conservatively). The links
(NVLink between the GPUs of one host) are an assumption, given below: 400 GB/s and 15 us per
message for point-to-point and for the all-reduce. Two more device sets show where the choice
turns: one GPU at half speed (equal replicas would wait for it; a pipeline gives it fewer blocks,
replicas a smaller share of the batch) and
GPUs of 24 GiB (the models and a replica's activations must fit one). Predictions, not
measurements: the measured check waits for a multi-GPU machine.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

from synapse.partitioning import (
    OPTIMIZER_STATE_MULTIPLIERS,
    DeviceFacts,
    LayoutCandidate,
    ModelProfile,
    Schedule,
    StagePlanner,
    StepSpec,
    choose_layout,
    layout_shapes,
    load_profile_csv,
    scale_to_micro_batch,
)

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "experiments/results/profiles_h200/profiles"
MEASURED = (16, 32)
PAIRS = (("vit_large", "resnet152"), ("vit_base", "resnet50"))
H200_BYTES = 141e9


@functools.cache
def profile(model: str, role: str, micro_batch: int) -> ModelProfile:
    """The measured profile at ``micro_batch``, or the nearest measured one scaled to it."""
    nearest = min(MEASURED, key=lambda m: (abs(m - micro_batch), -m))
    measured = load_profile_csv(PROFILES / f"{model}_{role}_mb{nearest}_bf16_nvidia-h200_224px_3ch_100cls.csv")
    return measured if nearest == micro_batch else scale_to_micro_batch(measured, micro_batch, nearest)


def planner_for(teacher: str, student: str, batch: int, facts: DeviceFacts):
    def make(replicas: int, microbatches: int) -> StagePlanner:
        micro = batch // (replicas * microbatches)
        step = StepSpec(microbatches, Schedule.parse("1f1b"),
                        optimizer_state_multiplier=OPTIMIZER_STATE_MULTIPLIERS["adamw"])
        return StagePlanner(profile(teacher, "teacher", micro), profile(student, "student", micro), step, facts,
                            replicas=replicas)
    return make


def best(candidates: list[LayoutCandidate], keep) -> LayoutCandidate | None:
    possible = [c for c in candidates if keep(c) and math.isfinite(c.step_time_s)]
    return min(possible, key=lambda c: c.step_time_s) if possible else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(REPO / "experiments/results/plan_layouts_h200.json"))
    parser.add_argument("--bandwidth-gbps", type=float, default=400.0)
    parser.add_argument("--latency-us", type=float, default=15.0)
    parser.add_argument("--small-memory-gib", type=float, default=24.0)
    args = parser.parse_args()
    facts = DeviceFacts(lambda d: f"cuda:{d}", lambda d: H200_BYTES, args.bandwidth_gbps * 1e9,
                        link_latency_s=args.latency_us * 1e-6)
    rows = []
    small = DeviceFacts(facts.device_name, lambda d: args.small_memory_gib * (1 << 30),
                        facts.link_bandwidth_bytes_per_s, link_latency_s=facts.link_latency_s)
    # (name, device facts, alphas): H200s as they are; one of them at half speed; GPUs of less memory
    scenarios = [("H200", facts, {}), ("H200, GPU 0 at half speed", facts, {0: 2.0}),
                 (f"{args.small_memory_gib:g} GiB GPUs", small, {})]
    for scenario, device_facts, alphas in scenarios:
        for teacher, student in PAIRS:
            blocks = min(len(profile(teacher, "teacher", 16)), len(profile(student, "student", 16)))
            for batch in (128, 256, 512) if scenario == "H200" else (256,):
                make = planner_for(teacher, student, batch, device_facts)
                one_shapes = [s for s in layout_shapes(1, batch, blocks) if batch // s[2] >= 2]
                one = choose_layout(planner_for(teacher, student, batch, facts), [0], batch, one_shapes)
                for gpus in (2, 4, 8) if scenario == "H200" else (4,):
                    shapes = [s for s in layout_shapes(gpus, batch, blocks) if batch // (s[0] * s[2]) >= 2]
                    choice = choose_layout(make, list(range(gpus)), batch, shapes, alphas)
                    dp = best(list(choice.candidates), lambda c: c.stages == 1)
                    pipe = best(list(choice.candidates), lambda c: c.replicas == 1)
                    rows.append({"scenario": scenario, "teacher": teacher, "student": student, "batch": batch,
                                 "gpus": gpus, "one_gpu": one.chosen.to_dict(batch),
                                 "chosen": choice.chosen.to_dict(batch),
                                 "data_parallel": dp.to_dict(batch) if dp else None,
                                 "pipeline": pipe.to_dict(batch) if pipe else None})
    table = markdown(rows)
    print(table)
    out = Path(args.out)
    out.write_text(json.dumps({"settings": {"bandwidth_gbps": args.bandwidth_gbps, "latency_us": args.latency_us,
                                            "memory_bytes": H200_BYTES, "schedule": "1f1b", "optimizer": "adamw",
                                            "profiles": str(PROFILES.relative_to(REPO))},
                               "rows": rows, "markdown": table}, indent=1) + "\n")
    print(f"\nwrote {out}")


def markdown(rows: list[dict]) -> str:
    def cell(c: dict | None, one: float) -> str:
        if c is None:
            return "cannot run"
        return f"{c['images_per_s']:,.0f} ({c['images_per_s'] / one:.2f}x)"

    lines = ["| devices | models | batch | GPUs | chosen layout | chosen img/s (x 1 H200) | pure DP img/s "
             "| one pipeline img/s | all-reduce ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        one, c = r["one_gpu"]["images_per_s"], r["chosen"]
        shares = f", shares {c['shares']}" if c["shares"] and len(set(c["shares"])) > 1 else ""
        lines.append(f"| {r['scenario']} | {r['teacher']} -> {r['student']} | {r['batch']} | {r['gpus']} | "
                     f"{c['replicas']} x {c['stages']}, M = {c['microbatches']}{shares} | {cell(c, one)} | "
                     f"{cell(r['data_parallel'], one)} | {cell(r['pipeline'], one)} | {c['allreduce_s'] * 1e3:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
