"""partition=auto: profile the models (or reuse cached profiles), plan the partition for the
configured devices, record the plan, and afterwards compare it with what the run measured.

The planner itself is pure (synapse.planner); this module is the glue that feeds it
measured profiles and device facts, and writes ``plan.json`` and ``plan_vs_measured.json``.
"""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from ..config import resolve_accelerator, resolve_devices
from ..engine.device import default_threads
from ..engine.metrics import read_jsonl
from ..pipeline.partition import StagePartition
from ..planner.cost_model import OPTIMIZER_STATE_MULTIPLIERS, DeviceSpec, cpu_contention
from ..planner.partitioner import PartitionPlan, plan_partition
from ..planner.profile import load_profile_csv
from ..profiling import profile_for_config

# Bytes of optimizer state per parameter byte (cost model's memory term).
_OPTIMIZER_STATE = {"sgd": OPTIMIZER_STATE_MULTIPLIERS["sgd_momentum"], "adamw": OPTIMIZER_STATE_MULTIPLIERS["adamw"]}


def profile_device(cfg: DictConfig) -> str:
    """Where profiles are measured: the run's first device."""
    if resolve_accelerator(cfg.trainer) == "cuda":
        return f"cuda:{resolve_devices(cfg.trainer)[0]}"
    return "cpu"


def profile_models(cfg: DictConfig, info, log: Callable[[str], None] = print):
    """The teacher and student profiles at the run's micro-batch size (measured once, then cached)."""
    micro_batch = cfg.data.batch_size // cfg.pipeline.microbatches
    return profile_for_config(cfg.teacher.name, cfg.student.name, micro_batch, cfg.trainer.precision,
                              profile_device(cfg), info.num_classes, info.in_chans, info.image_size, cfg.cache_dir,
                              warmup=cfg.partition.profile_warmup, repeats=cfg.partition.profile_repeats, log=log)


def device_specs(cfg: DictConfig, num_stages: int) -> list[DeviceSpec]:
    """What the planner knows of each device: relative speed, memory, link bandwidth, core sharing."""
    alphas = list(cfg.partition.alphas) if cfg.partition.alphas else [1.0] * num_stages
    if len(alphas) != num_stages:
        raise ValueError(f"partition.alphas has {len(alphas)} entries for {num_stages} devices; give one per device")
    bandwidth = cfg.partition.link_bandwidth_gbps * 1e9 if cfg.partition.link_bandwidth_gbps else float("inf")
    cuda = resolve_accelerator(cfg.trainer) == "cuda"
    contention = 1.0 if cuda else cpu_rank_contention(cfg.trainer)
    specs = []
    for rank in range(num_stages):
        memory = float("inf")
        name = f"cpu:{rank}"
        if cuda:
            import torch

            gpu = resolve_devices(cfg.trainer)[rank % len(resolve_devices(cfg.trainer))]
            memory, name = torch.cuda.get_device_properties(gpu).total_memory, f"cuda:{gpu}"
        specs.append(DeviceSpec(name, alpha=float(alphas[rank]), memory_bytes=memory,
                                link_bandwidth_bytes_per_s=bandwidth, contention=contention))
    return specs


def cpu_rank_contention(trainer: DictConfig) -> float:
    """How much slower each CPU rank computes because this node's ranks share its cores.

    The ranks of one node run trainer.threads intra-op threads each (default: the cores
    shared out, at least 1), on the cores this process may use.
    """
    local_ranks = len(resolve_devices(trainer))
    threads = trainer.threads or default_threads(local_ranks)
    return cpu_contention(local_ranks, threads, _available_cores())


def _available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def auto_partition(cfg: DictConfig, num_stages: int, info, run_dir: Path,
                   log: Callable[[str], None] = print) -> tuple[StagePartition, PartitionPlan]:
    paths = profile_models(cfg, info, log)
    teacher, student = load_profile_csv(paths.teacher), load_profile_csv(paths.student)
    plan = plan_partition(teacher, student, device_specs(cfg, num_stages), cfg.pipeline.microbatches,
                          cfg.pipeline.schedule, optimizer_state_multiplier=_OPTIMIZER_STATE[cfg.optim.name])
    record = {"plan": _jsonable(plan.to_dict()), "profiles": {"teacher": str(paths.teacher),
                                                               "student": str(paths.student)}}
    (run_dir / "plan.json").write_text(json.dumps(record, indent=1))
    log(f"partition=auto: predicted step {plan.step_time_s * 1e3:.1f} ms, per-stage "
        f"{[round(t * 1e3, 2) for t in plan.stage_times_s]} ms per micro-batch")
    return StagePartition(plan.teacher_counts, plan.student_counts), plan


def compare_plan_with_run(run_dir: Path, warmup_steps: int = 3) -> dict[str, Any] | None:
    """Predicted (uncalibrated) vs measured per-stage compute, non-compute and step time, after warm-up.

    Per step and stage: compute is what the rank's clock counts (blocks, loss, optimizer);
    the rest of its wall time ("comm": P2P, schedule overhead, waiting) is compared with
    M * (predicted overhead + communication).
    """
    plan_file, perf_file = run_dir / "plan.json", run_dir / "performance.jsonl"
    if not plan_file.exists() or not perf_file.exists():
        return None
    plan = json.loads(plan_file.read_text())["plan"]
    measured = measured_step_summary(perf_file, warmup_steps)
    if measured is None:
        return None
    m = plan["microbatches"]
    overhead = plan.get("stage_overhead_s") or [0.0] * len(plan["stage_comm_s"])
    result = {
        "steps_compared": measured["steps"],
        "predicted_step_s": plan["step_time_s"],
        "measured_step_s": measured["step_s"],
        "predicted_stage_compute_s": [m * t for t in plan["stage_compute_s"]],
        "measured_stage_compute_s": measured["stage_compute_s"],
        "predicted_stage_noncompute_s": [m * (o + c) for o, c in zip(overhead, plan["stage_comm_s"])],
        "measured_stage_noncompute_s": measured["stage_comm_s"],
    }
    result["step_error"] = result["predicted_step_s"] / result["measured_step_s"] - 1.0
    (run_dir / "plan_vs_measured.json").write_text(json.dumps(result, indent=1))
    return result


def measured_step_summary(perf_file: Path, warmup_steps: int = 3) -> dict[str, Any] | None:
    """Medians over the steps after warm-up: step time, and per rank compute, comm and each clock part."""
    # The plan is stage 0's: after a failover restart the partition (and K) differ.
    records = [r for r in read_jsonl(perf_file) if r.get("stage", 0) == 0][warmup_steps:]
    if not records:
        return None
    median = statistics.median
    ranks = range(len(records[0]["compute_s"]))
    parts = sorted(records[0].get("ranks", [{}])[0])
    return {
        "steps": len(records),
        "step_s": median(r["step_seconds"] for r in records),
        "stage_compute_s": [median(r["compute_s"][k] for r in records) for k in ranks],
        "stage_comm_s": [median(r["comm_s"][k] for r in records) for k in ranks],
        "stage_parts_s": [{p: median(r["ranks"][k][p] for r in records) for p in parts} for k in ranks],
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value == float("inf"):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
