"""A run's first plan, from its config: the placement it asks for (even or manual cuts, checked
against the models' block counts before any worker starts), or with ``partition=auto`` the
planned one: profile the models (or reuse cached profiles), plan for the configured devices,
record the plan, and afterwards compare it with what the run measured.

The planner itself is pure (``synapse.partitioning``); this module is the glue that feeds it
measured profiles and device facts, and writes ``plan.json`` and ``plan_vs_measured.json``.

The planner's builders (``build_stage_planner``, ``planner_for_profiles``, ``choose_microbatches_for``,
``profile_models``) take the run's whole config: what they price is the whole run (both models, the
batch, the schedule, the optimizer, the devices, the partition settings). Every other function
takes the config groups it reads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from synapse.config import (
    PartitionConfig,
    PipelineConfig,
    StudentConfig,
    SynapseConfig,
    TeacherConfig,
    TrainerConfig,
    cuda_index,
    decides_elsewhere,
    fixed_replicas,
    resolve_accelerator,
    resolve_devices,
    run_topology,
    shares_a_gpu,
)
from synapse.engine import available_cores, default_threads
from synapse.models import count_blocks
from synapse.partitioning import (
    OPTIMIZER_STATE_MULTIPLIERS,
    DeviceFacts,
    DeviceSpec,
    LayoutChoiceError,
    PartitionError,
    PartitionPlan,
    Placement,
    Schedule,
    StagePlanner,
    StepSpec,
    candidate_counts,
    choose_layout,
    choose_microbatches,
    cpu_contention,
    even_counts,
    layout_shapes,
    load_profile_csv,
)
from synapse.profiling import profile_for_config
from synapse.rundir import MICROBATCHES, PERFORMANCE, PLAN, PLAN_VS_MEASURED, read_jsonl

# Bytes of optimizer state per parameter byte (cost model's memory term).
OPTIMIZER_STATE = {"sgd": OPTIMIZER_STATE_MULTIPLIERS["sgd_momentum"], "adamw": OPTIMIZER_STATE_MULTIPLIERS["adamw"]}


def profile_device(trainer: TrainerConfig) -> str:
    """Where profiles are measured: the run's first device."""
    if resolve_accelerator(trainer) == "cuda":
        return f"cuda:{cuda_index(trainer, resolve_devices(trainer)[0])}"
    return "cpu"


def profile_models(cfg: SynapseConfig, info, log: Callable[[str], None] = print, microbatches: int | None = None,
                   replicas: int = 1):
    """The teacher and student profiles at the run's micro-batch size, or at that of ``microbatches``
    micro-batches (measured once, then cached), as ``replicas`` replicas would run them."""
    return profiles_at(cfg, info, cfg.data.batch_size // (microbatches or _configured_microbatches(cfg.pipeline)),
                       log, replicas)


def profiles_at(cfg: SynapseConfig, info, micro_batch: int, log: Callable[[str], None] = print, replicas: int = 1):
    """The teacher and student profiles at ``micro_batch`` images (measured once, then cached)."""
    return profile_for_config(cfg.teacher.name, cfg.student.name, micro_batch, cfg.trainer.precision,
                              profile_device(cfg.trainer), info.num_classes, info.in_chans, info.image_size,
                              cfg.cache_dir, warmup=cfg.partition.profile_warmup,
                              repeats=cfg.partition.profile_repeats, log=log,
                              launch=profile_launch(cfg.trainer, cfg.pipeline, replicas))


def _configured_microbatches(pipeline: PipelineConfig) -> int:
    """pipeline.microbatches as a count; with auto the count is the caller's to pass (chosen with the cuts)."""
    if isinstance(pipeline.microbatches, str):  # validation leaves "auto" as the only string
        raise PartitionError(f"pipeline.microbatches={pipeline.microbatches}: no fixed count; pass the chosen one")
    return pipeline.microbatches


def profile_launch(trainer: TrainerConfig, pipeline: PipelineConfig, replicas: int = 1) -> str:
    """Blocks are profiled as the stages will run them: replayed CUDA graphs on a GPU with
    pipeline.cuda_graphs (the GPU's own time), eagerly otherwise (launch time included), and eagerly
    with replicas, whose stages run eagerly (synapse.pipeline.replicas)."""
    graphed = resolve_accelerator(trainer) == "cuda" and pipeline.cuda_graphs and replicas == 1
    return "graphed" if graphed else "eager"


# gloo between two CPU processes over loopback, measured by experiments/bench_gloo_p2p.py
# (experiments/results/planner_cpu.md): the price of a CPU pipeline's links. A link must have a
# price for its slowdown (beta, measured from each rank's own send time) to move the cuts.
GLOO_LOOPBACK_LATENCY_S, GLOO_LOOPBACK_BYTES_PER_S = 56e-6, 4.44e9


# A decider on a host of its own (trainer.role=decider): the memory of each run-wide device, as its node's
# agent said it (failover.decider.NodeDecider.device_memory); None outside such a decider's process.
_told_memory: Callable[[int], float] | None = None


@contextlib.contextmanager
def device_memory_told_by(memory_of: Callable[[int], float] | None) -> Iterator[None]:
    """While active, the planner sizes each GPU by ``memory_of(run-wide device id)`` (the nodes' agents' word)
    instead of asking CUDA on this host, which has none of the run's devices. None: no change."""
    global _told_memory
    earlier, _told_memory = _told_memory, memory_of or _told_memory
    try:
        yield
    finally:
        _told_memory = earlier


def _memory_lookup(trainer: TrainerConfig, local_id: Callable[[int], int], share: int = 1) -> Callable[[int], float]:
    """Each run-wide device's memory: told by its node's agent (a decider on a host of its own), or this
    host's CUDA device of that local id (its ``share`` when ranks share one GPU)."""
    told = _told_memory
    if told is not None:
        return told  # the agent already divided a shared GPU's memory among its ranks (NodeDevices)
    if decides_elsewhere(trainer):
        raise PartitionError("trainer.role=decider plans only with the devices the nodes' agents described at the "
                             "meeting, and none were told here (a bug: planning outside the decider's job)")
    return lambda d: _gpu_memory(local_id(d)) / share


def device_facts(trainer: TrainerConfig, partition: PartitionConfig) -> DeviceFacts:
    """What the planner knows of each device id: name, memory, link bandwidth, core sharing."""
    gbps = partition.link_bandwidth_gbps
    node_gbps = partition.node_link_bandwidth_gbps
    topology = run_topology(trainer)
    if shares_a_gpu(trainer):
        # A dry run on one GPU: each rank gets its share of the GPU's memory, and its links are
        # host copies and gloo (the plan is this run's, not that of K separate GPUs).
        gpu, ranks = cuda_index(trainer, 0), len(resolve_devices(trainer))
        bandwidth = gbps * 1e9 if gbps else GLOO_LOOPBACK_BYTES_PER_S
        return DeviceFacts(lambda d: f"cuda:{gpu}", _memory_lookup(trainer, lambda d: gpu, ranks), bandwidth, 1,
                           GLOO_LOOPBACK_LATENCY_S, node_of=topology.node_of,
                           cross_node_bandwidth_bytes_per_s=node_gbps * 1e9 if node_gbps else bandwidth)
    if resolve_accelerator(trainer) == "cuda":
        bandwidth = gbps * 1e9 if gbps else math.inf
        # Run-wide device ids (partitioning/topology.py): a device is named and sized by its node's local id.
        return DeviceFacts(lambda d: f"cuda:{topology.local_id(d)}", _memory_lookup(trainer, topology.local_id),
                           bandwidth, node_of=topology.node_of,
                           cross_node_bandwidth_bytes_per_s=node_gbps * 1e9 if node_gbps else bandwidth)
    bandwidth = gbps * 1e9 if gbps else GLOO_LOOPBACK_BYTES_PER_S
    return DeviceFacts(lambda d: f"cpu:{topology.local_id(d)}", lambda device: math.inf, bandwidth,
                       cpu_rank_contention(trainer), GLOO_LOOPBACK_LATENCY_S, node_of=topology.node_of,
                       cross_node_bandwidth_bytes_per_s=node_gbps * 1e9 if node_gbps else bandwidth)


def _gpu_memory(device: int) -> float:
    import torch

    return float(torch.cuda.get_device_properties(device).total_memory)


@dataclass(frozen=True)
class RunPlan:
    """What a run decides for itself before its first launch: where the blocks go, and how many
    micro-batches a step is cut into (``pipeline.microbatches=auto`` resolves here; the config
    keeps saying auto). Every segment after the first keeps the count."""

    placement: Placement
    microbatches: int


def build_stage_planner(cfg: SynapseConfig, info, microbatches: int, log: Callable[[str], None] = print,
                        replicas: int = 1) -> StagePlanner:
    """The one planner of a run: the first plan (partition=auto) and every re-plan of the failover
    controller are made by it, so they are priced by the same cost model. It prices one replica's
    pipeline: profiles at that replica's micro-batch (the global batch over replicas x micro-batches)."""
    planner = planner_for_profiles(cfg, profile_models(cfg, info, log, replicas * microbatches, replicas),
                                   microbatches, replicas)
    return with_share_sizes(planner, cfg, info, microbatches, log, replicas)


def share_micro_batches(batch: int, replicas: int, microbatches: int) -> list[int]:
    """The micro-batch sizes a replicated run's planner is profiled at, so that a changed share is priced
    at its own micro-batch: the run's own, half and a quarter of it (a slow replica's share shrinks), and
    twice it (the others' grow), within what a share can hold (at least 2 images: BatchNorm trains on no
    fewer; at most the batch less one micro-batch of images for every other replica)."""
    own = batch // (replicas * microbatches)
    largest = batch // microbatches - (replicas - 1)
    return sorted({min(max(2, size), largest) for size in (own // 4, own // 2, own, 2 * own)} | {own})


def with_share_sizes(planner: StagePlanner, cfg: SynapseConfig, info, microbatches: int,
                     log: Callable[[str], None] = print, replicas: int = 1) -> StagePlanner:
    """``planner`` with profiles at the micro-batches a share may take (``StagePlanner.size_profiles``):
    only for replicas under failover, whose shares REBALANCE and DEGRADE change."""
    if replicas == 1 or not cfg.failover.enabled:
        return planner
    sizes = []
    for micro_batch in share_micro_batches(cfg.data.batch_size, replicas, microbatches):
        paths = profiles_at(cfg, info, micro_batch, log, replicas)
        sizes.append((load_profile_csv(paths.teacher), load_profile_csv(paths.student)))
    return dataclasses.replace(planner, size_profiles=tuple(sizes))


def plan_run(cfg: SynapseConfig, info, devices: list[int], run_dir: Path, log: Callable[[str], None] = print
             ) -> tuple[RunPlan, StagePlanner | None]:
    """The run's first plan on ``devices`` (every rank's, in order) and its planner (None when nothing
    needs one: a fixed partition without failover). Raises before any worker starts on a partition,
    mesh or batch that cannot run."""
    replicas = fixed_replicas(cfg.trainer)
    if replicas is None:  # trainer.replicas=auto (validation: only with partition=auto)
        return choose_layout_for(cfg, info, devices, run_dir, log)
    # replica 0's devices; every replica is cut the same way unless partition.replica_stages says otherwise
    pipeline_devices = devices[:cfg.partition.replica_stages[0] if cfg.partition.replica_stages
                               else len(devices) // replicas]
    microbatches = (choose_microbatches_for(cfg, info, pipeline_devices, run_dir, log, replicas)
                    if cfg.pipeline.microbatches == "auto" else int(cfg.pipeline.microbatches))
    planner = (build_stage_planner(cfg, info, microbatches, log, replicas)
               if cfg.partition.mode == "auto" or cfg.failover.enabled else None)
    if cfg.partition.mode == "auto":  # the planner was built above
        pipeline, _ = auto_partition(cfg.partition, cast(StagePlanner, planner), pipeline_devices, run_dir, log,
                                     replicas)
        pipeline.check_block_counts(count_blocks(cfg.teacher.name, info.num_classes, info.in_chans, info.image_size),
                                    count_blocks(cfg.student.name, info.num_classes, info.in_chans, info.image_size))
    elif cfg.partition.replica_stages:
        return RunPlan(replicas_cut_apart(cfg, info, devices, microbatches), microbatches), planner
    else:
        pipeline = placement_for_config(cfg.partition, cfg.teacher, cfg.student, pipeline_devices, info)
    return RunPlan(replicated(pipeline, devices, replicas, cfg.trainer.replica_shares, cfg.data.batch_size,
                              microbatches), microbatches), planner


def replicas_cut_apart(cfg: SynapseConfig, info, devices: Sequence[int], microbatches: int) -> Placement:
    """partition.replica_stages: each replica's pipeline on its next K_r devices, cut as the config says
    (even, or its slice of partition.teacher/student), with its share of the batch."""
    stages = list(cfg.partition.replica_stages or ())
    pipelines, start = [], 0
    for k in stages:
        part = cfg.partition
        if part.mode == "manual":
            part = dataclasses.replace(part, teacher=tuple(part.teacher or ())[start:start + k],
                                       student=tuple(part.student or ())[start:start + k])
        pipelines.append(placement_for_config(part, cfg.teacher, cfg.student, devices[start:start + k], info))
        start += k
    layout = Placement.of_pipelines(pipelines, tuple(cfg.trainer.replica_shares or ()))
    return layout.with_shares(layout.share_sizes(cfg.data.batch_size, microbatches)) if len(stages) > 1 else layout


def choose_layout_for(cfg: SynapseConfig, info, devices: list[int], run_dir: Path,
                      log: Callable[[str], None] = print) -> tuple[RunPlan, StagePlanner]:
    """trainer.replicas=auto: every R x K layout of ``devices`` (and its micro-batch count, unless fixed)
    priced with profiles at its own micro-batch; the fastest is the run's plan (``partitioning.layouts``)."""
    batch = cfg.data.batch_size
    fixed = None if cfg.pipeline.microbatches == "auto" else int(cfg.pipeline.microbatches)
    blocks = min(count_blocks(cfg.teacher.name, info.num_classes, info.in_chans, info.image_size),
                 count_blocks(cfg.student.name, info.num_classes, info.in_chans, info.image_size))
    shapes = [(r, k, m) for r, k, m in layout_shapes(len(devices), batch, blocks, microbatches=fixed)
              if batch // (r * m) >= 2]  # a micro-batch of one sample cannot train BatchNorm
    planners: dict[tuple[int, int], StagePlanner] = {}

    def planner_for(replicas: int, microbatches: int) -> StagePlanner:
        if (replicas, microbatches) not in planners:
            planners[replicas, microbatches] = planner_for_profiles(
                cfg, profile_models(cfg, info, log, replicas * microbatches, replicas), microbatches, replicas)
        return planners[replicas, microbatches]

    alphas = dict(zip(devices, configured_alphas(cfg.partition, len(devices))))
    try:
        choice = choose_layout(planner_for, devices, batch, shapes, alphas)
    except LayoutChoiceError as exc:
        raise PartitionError(f"trainer.replicas=auto: {exc}. Fix: set trainer.replicas and the partition "
                             f"yourself, or change data.batch_size") from None
    chosen = choice.chosen
    placement = cast(Placement, chosen.placement)
    PLAN.path(run_dir).write_text(json.dumps(_jsonable({
        "layout": {"chosen": chosen.to_dict(batch), "candidates": [c.to_dict(batch) for c in choice.candidates]},
        "plan": planner_for(chosen.replicas, chosen.microbatches).full_plan(
            placement.replica_devices(0), configured_alphas(cfg.partition, len(devices), chosen.replicas)).to_dict()
        | {"step_time_s": chosen.step_time_s},
    }), indent=1))
    table = ", ".join(f"{c.replicas}x{c.stages} M={c.microbatches}: " + (
        f"{c.images_per_s(batch):,.0f} img/s" if math.isfinite(c.step_time_s) else "cannot run")
        for c in choice.candidates)
    log(f"trainer.replicas=auto: {chosen.replicas} replica(s) x {chosen.stages} stage(s), {chosen.microbatches} "
        f"micro-batches, predicted {chosen.images_per_s(batch):,.0f} images/s ({table})")
    return RunPlan(placement, chosen.microbatches), with_share_sizes(
        planner_for(chosen.replicas, chosen.microbatches), cfg, info, chosen.microbatches, log, chosen.replicas)


def replicated(pipeline: Placement, devices: Sequence[int], replicas: int, shares: Sequence[int] | None, batch: int,
               microbatches: int) -> Placement:
    """``pipeline``'s cuts on every replica of ``devices`` (R x K, replica-major); a layout records its
    shares of the batch (equal unless given), so that failover can share them out anew."""
    if replicas == 1:
        return Placement(tuple(devices), pipeline.teacher_counts, pipeline.student_counts)
    layout = Placement(tuple(devices), pipeline.teacher_counts, pipeline.student_counts, replicas, tuple(shares or ()))
    return dataclasses.replace(layout, shares=layout.share_sizes(batch, microbatches))


def planner_for_profiles(cfg: SynapseConfig, paths, microbatches: int | None = None, replicas: int = 1
                         ) -> StagePlanner:
    step = StepSpec(microbatches or _configured_microbatches(cfg.pipeline), Schedule.parse(cfg.pipeline.schedule),
                    optimizer_state_multiplier=OPTIMIZER_STATE[cfg.optim.name])
    return StagePlanner(load_profile_csv(paths.teacher), load_profile_csv(paths.student), step,
                        device_facts(cfg.trainer, cfg.partition), replicas=replicas)


def choose_microbatches_for(cfg: SynapseConfig, info, devices: list[int], run_dir: Path,
                            log: Callable[[str], None] = print, replicas: int = 1) -> int:
    """pipeline.microbatches=auto: price every candidate count with profiles measured at its
    micro-batch size and keep the one whose best placement steps fastest (``planner.microbatches``).
    ``devices``: one replica's; each of ``replicas`` trains on its share of the batch."""
    candidates = candidate_counts(cfg.data.batch_size // replicas, len(devices))
    alphas = configured_alphas(cfg.partition, replicas * len(devices), replicas)
    choice = choose_microbatches(lambda m: planner_for_profiles(cfg, profile_models(cfg, info, log, replicas * m,
                                                                                    replicas), m, replicas),
                                 candidates, devices, alphas)
    record = {"candidates": list(candidates), "chosen": choice.microbatches,
              "predicted_step_s": {str(m): _jsonable(t) for m, t in choice.step_time_by_count.items()},
              "not_possible": {str(m): why for m, why in choice.reasons.items()}}
    MICROBATCHES.path(run_dir).write_text(json.dumps(record, indent=1))
    table = ", ".join(f"M={m}: {t * 1e3:.1f} ms" if math.isfinite(t) else f"M={m}: does not fit"
                      for m, t in choice.step_time_by_count.items())
    log(f"pipeline.microbatches=auto: {choice.microbatches} micro-batches of "
        f"{cfg.data.batch_size // (replicas * choice.microbatches)} (predicted step {table})")
    return choice.microbatches


def configured_alphas(partition: PartitionConfig, num_devices: int, replicas: int = 1) -> list[float]:
    """partition.alphas (one per device of the run); with replicas, per stage of one pipeline: the
    slowest of that stage's devices across replicas, since every replica must finish a step together."""
    alphas = [float(a) for a in partition.alphas] if partition.alphas else [1.0] * num_devices
    if len(alphas) != num_devices:
        raise ValueError(f"partition.alphas has {len(alphas)} entries for {num_devices} devices; give one per device")
    k = num_devices // replicas
    return [max(alphas[r * k + s] for r in range(replicas)) for s in range(k)]


def device_specs(trainer: TrainerConfig, partition: PartitionConfig, num_stages: int) -> list[DeviceSpec]:
    """The planner's view of stages 0..K-1 at the configured alphas (what partition=auto plans on)."""
    devices = run_topology(trainer).devices  # run-wide ids, node 0's first
    stages = devices if len(devices) == num_stages else list(range(num_stages))
    return device_facts(trainer, partition).specs(stages, configured_alphas(partition, num_stages))


def cpu_rank_contention(trainer: TrainerConfig) -> float:
    """How much slower each CPU rank computes because this node's ranks share its cores.

    The ranks of one node run trainer.threads intra-op threads each (default: the cores
    shared out, at least 1), on the cores this process may use.
    """
    local_ranks = len(resolve_devices(trainer))
    threads = trainer.threads or default_threads(local_ranks)
    return cpu_contention(local_ranks, threads, available_cores())


def auto_partition(partition: PartitionConfig, planner: StagePlanner, devices: list[int], run_dir: Path,
                   log: Callable[[str], None] = print, replicas: int = 1) -> tuple[Placement, PartitionPlan]:
    """partition=auto: the run's planner places the models on ``devices`` (one replica's) at the
    configured alphas."""
    plan = planner.full_plan(devices, configured_alphas(partition, replicas * len(devices), replicas))
    record = {"plan": _jsonable(plan.to_dict()), "profiles": {"teacher": planner.teacher.source,
                                                               "student": planner.student.source}}
    PLAN.path(run_dir).write_text(json.dumps(record, indent=1))
    log(f"partition=auto: predicted step {plan.step_time_s * 1e3:.1f} ms, per-stage "
        f"{[round(t * 1e3, 2) for t in plan.stage_times_s]} ms per micro-batch")
    return Placement(tuple(devices), plan.teacher_counts, plan.student_counts), plan


def compare_plan_with_run(run_dir: Path, warmup_steps: int = 3) -> dict[str, Any] | None:
    """Predicted (uncalibrated) vs measured per-stage compute, non-compute and step time, after warm-up.

    Per step and stage: compute is what the rank's clock counts (blocks, loss, optimizer);
    the rest of its wall time ("comm": P2P, schedule overhead, waiting) is compared with
    M * (predicted overhead + communication).
    """
    plan_file, perf_file = PLAN.path(run_dir), PERFORMANCE.path(run_dir)
    if not plan_file.exists() or not perf_file.exists():
        return None
    plan = json.loads(plan_file.read_text())["plan"]
    measured = measured_step_summary(perf_file, warmup_steps)
    if measured is None:
        return None
    m, k = plan["microbatches"], len(plan["stage_compute_s"])
    overhead = plan.get("stage_overhead_s") or [0.0] * len(plan["stage_comm_s"])
    # With replicas the plan is one replica's pipeline: it is compared with replica 0's ranks (the first K).
    result = {
        "steps_compared": measured["steps"],
        "predicted_step_s": plan["step_time_s"],
        "measured_step_s": measured["step_s"],
        "predicted_stage_compute_s": [m * t for t in plan["stage_compute_s"]],
        "measured_stage_compute_s": measured["stage_compute_s"][:k],
        "predicted_stage_noncompute_s": [m * (o + c) for o, c in zip(overhead, plan["stage_comm_s"])],
        "measured_stage_noncompute_s": measured["stage_comm_s"][:k],
    }
    result["step_error"] = result["predicted_step_s"] / result["measured_step_s"] - 1.0
    PLAN_VS_MEASURED.path(run_dir).write_text(json.dumps(result, indent=1))
    return result


def measured_step_summary(perf_file: Path, warmup_steps: int = 3) -> dict[str, Any] | None:
    """Medians over the steps after warm-up: step time, and per rank compute, comm and each clock part."""
    # The plan is segment 0's: after a failover restart the partition (and K) differ.
    records = [r for r in read_jsonl(perf_file) if r.get("segment", 0) == 0][warmup_steps:]
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


def even_placement(teacher_blocks: int, student_blocks: int, devices: Sequence[int]) -> Placement:
    return Placement(tuple(devices), even_counts(teacher_blocks, len(devices)),
                     even_counts(student_blocks, len(devices)))


def placement_for_config(partition_cfg: PartitionConfig, teacher: TeacherConfig, student: StudentConfig,
                         devices: Sequence[int], info) -> Placement:
    """The placement the config asks for (even or manual) on ``devices``, checked against the block counts."""
    num_stages = len(devices)
    teacher_blocks = count_blocks(teacher.name, info.num_classes, info.in_chans, info.image_size)
    student_blocks = count_blocks(student.name, info.num_classes, info.in_chans, info.image_size)
    if partition_cfg.mode == "manual":
        if partition_cfg.teacher is None or partition_cfg.student is None:  # validation requires both
            raise PartitionError("partition.mode=manual needs blocks per stage: set partition.teacher and "
                                 "partition.student, or use partition=even")
        if len(partition_cfg.teacher) != num_stages or len(partition_cfg.student) != num_stages:
            raise PartitionError(f"the partition has {len(partition_cfg.teacher)} stages for {num_stages} devices; "
                                 f"give one block count per device")
        partition = Placement(tuple(devices), tuple(partition_cfg.teacher), tuple(partition_cfg.student))
    elif partition_cfg.mode == "even":
        for role, model, blocks in (("teacher", teacher, teacher_blocks), ("student", student, student_blocks)):
            if num_stages > blocks:
                raise PartitionError(f"{num_stages} stages but the {role} {model.name} has only {blocks} blocks; "
                                     f"use at most {blocks} devices or a deeper model")
        partition = even_placement(teacher_blocks, student_blocks, devices)
    else:
        raise PartitionError(f"partition.mode={partition_cfg.mode!r} is planned by synapse.planning; "
                             f"use even, manual or auto")
    partition.check_block_counts(teacher_blocks, student_blocks)
    return partition
