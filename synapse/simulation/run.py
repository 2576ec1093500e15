"""``mode=simulate`` from a config: the run's planner on block profiles, its first plan, the real
controller (``synapse.failover.build_controller``: policy, detector, estimator, restart priors),
the faults, the noise; then the simulated run and its records."""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from synapse.config import ConfigError, SynapseConfig, fixed_replicas
from synapse.data import data_kwargs, dataset_info, digits_split_indices, train_samples
from synapse.engine import available_cores, default_threads
from synapse.failover import build_controller
from synapse.partitioning import (
    DeviceFacts,
    LayoutChoiceError,
    ModelProfile,
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
    scale_to_micro_batch,
)
from synapse.planning import OPTIMIZER_STATE, configured_alphas, device_facts, profile_models, replicated
from synapse.rundir import PARTITION, PLAN
from synapse.simulation.engine import SimulatedRun, SimulationResult, SimulationSetup
from synapse.simulation.faults import FaultRates, injected_faults, random_faults, trace_faults
from synapse.simulation.launch import load_first_launch
from synapse.simulation.noise import load_noise

# An async save holds the loop for this share of a synchronous save of the same state (the restart priors'
# ``checkpoint_save_s`` is a save committed before the stop): measured by bench_checkpoint_stall on CPU
# (experiments/results/checkpoint_stall_cpu: stall 0.057 s plus the 0.791 s the write takes from the next
# steps, against 5.055 s synchronous, medians after the first save) and by the DCP micro-benchmark on an
# H200 (experiments/results/h200/dcp_async_stall_micro.md: 0.12 s stall against 1.49 s synchronous).
ASYNC_SAVE_SHARE = {"cpu": (0.057 + 0.791) / 5.055, "cuda": 0.12 / 1.49}

# Random faults are drawn up to this many times the fault-free run's predicted length (restarts and slow
# steps lengthen a run; events after its end never act).
HORIZON_FACTOR = 4.0


def simulated_device_count(cfg: SynapseConfig) -> int:
    devices = cfg.trainer.devices
    count = len(devices) if isinstance(devices, (list, tuple)) else int(devices)
    return count * cfg.trainer.nodes


def accelerator_of(cfg: SynapseConfig) -> str:
    """What is simulated: GPUs with trainer.accelerator=cuda, this machine's CPU ranks otherwise."""
    return "cuda" if str(cfg.trainer.accelerator) == "cuda" else "cpu"


class SimulatedPlanners:
    """The run's planner for r replicas of m micro-batches, as ``synapse.planning`` builds it, on the
    configured profiles (scaled linearly to each micro-batch, said once) or the cached ones."""

    def __init__(self, cfg: SynapseConfig, log: Callable[[str], None]):
        self.cfg, self.log = cfg, log
        self._explicit: tuple[ModelProfile, ModelProfile] | None = None
        if cfg.simulate.teacher_profile and cfg.simulate.student_profile:
            self._explicit = (load_profile_csv(cfg.simulate.teacher_profile),
                              load_profile_csv(cfg.simulate.student_profile))
        self._info: Any = None
        self._made: dict[tuple[int, int], StagePlanner] = {}
        self._scaled_said = False

    def facts(self) -> DeviceFacts:
        cfg = self.cfg
        if accelerator_of(cfg) == "cpu":
            return device_facts(cfg.trainer, cfg.partition)
        sim, part = cfg.simulate, cfg.partition
        bandwidth = part.link_bandwidth_gbps * 1e9 if part.link_bandwidth_gbps else math.inf
        across = part.node_link_bandwidth_gbps * 1e9 if part.node_link_bandwidth_gbps else bandwidth
        per_node = sim.gpus_per_node
        return DeviceFacts(lambda d: "cuda:simulated", lambda d: sim.gpu_memory_gb * 2**30, bandwidth,
                           node_of=lambda d: d // per_node, cross_node_bandwidth_bytes_per_s=across)

    def profiles(self, replicas: int, microbatches: int) -> tuple[ModelProfile, ModelProfile]:
        micro = self.cfg.data.batch_size // (replicas * microbatches)
        if self._explicit is None:
            if self._info is None:
                self._info = dataset_info(self.cfg.data.name, **data_kwargs(self.cfg.data, self.cfg.seed))
            paths = profile_models(self.cfg, self._info, self.log, replicas * microbatches, replicas)
            return load_profile_csv(paths.teacher), load_profile_csv(paths.student)
        scaled = []
        for profile in self._explicit:
            if profile.micro_batch is not None and profile.micro_batch != micro:
                if not self._scaled_said:
                    self.log(f"simulate: profiles measured at micro-batch {profile.micro_batch} are scaled linearly "
                             f"to {micro} (re-profile at that size where the prediction matters)")
                    self._scaled_said = True
                profile = scale_to_micro_batch(profile, micro)
            scaled.append(profile)
        return scaled[0], scaled[1]

    def __call__(self, replicas: int, microbatches: int) -> StagePlanner:
        if (replicas, microbatches) not in self._made:
            teacher, student = self.profiles(replicas, microbatches)
            step = StepSpec(microbatches, Schedule.parse(self.cfg.pipeline.schedule),
                            optimizer_state_multiplier=OPTIMIZER_STATE[str(self.cfg.optim.name)])
            self._made[replicas, microbatches] = StagePlanner(teacher, student, step, self.facts(), replicas=replicas)
        return self._made[replicas, microbatches]


def first_plan(cfg: SynapseConfig, planners: SimulatedPlanners, devices: list[int], log: Callable[[str], None]
               ) -> tuple[Placement, int, StagePlanner]:
    """The first placement, its micro-batch count and its planner: what ``synapse.planning.plan_run``
    decides on real devices, decided here on simulated ones."""
    batch, replicas = cfg.data.batch_size, fixed_replicas(cfg.trainer)
    fixed_m = None if cfg.pipeline.microbatches == "auto" else int(cfg.pipeline.microbatches)
    if replicas is None:  # trainer.replicas=auto: every R x K layout priced, the fastest taken
        teacher, student = planners.profiles(1, fixed_m or 1)
        shapes = [(r, k, m) for r, k, m in layout_shapes(len(devices), batch, min(len(teacher), len(student)),
                                                         microbatches=fixed_m) if batch // (r * m) >= 2]
        alphas = dict(zip(devices, configured_alphas(cfg.partition, len(devices))))
        try:
            chosen = choose_layout(planners, devices, batch, shapes, alphas).chosen
        except LayoutChoiceError as exc:
            raise ConfigError(f"trainer.replicas=auto: {exc}. Fix: set trainer.replicas and the partition") from None
        log(f"simulate: trainer.replicas=auto chose {chosen.replicas} replica(s) x {chosen.stages} stage(s), "
            f"{chosen.microbatches} micro-batches")
        if chosen.placement is None:  # choose_layout picks only layouts that can run, each with its placement
            raise ConfigError("trainer.replicas=auto: no layout can run. Fix: set trainer.replicas and the partition")
        return chosen.placement, chosen.microbatches, planners(chosen.replicas, chosen.microbatches)
    pipeline_devices = devices[:len(devices) // replicas]
    if fixed_m is None:
        candidates = candidate_counts(batch // replicas, len(pipeline_devices))
        stage_alphas = configured_alphas(cfg.partition, len(devices), replicas)
        fixed_m = choose_microbatches(lambda m: planners(replicas, m), candidates, pipeline_devices,
                                      stage_alphas).microbatches
    planner = planners(replicas, fixed_m)
    if cfg.partition.mode == "auto":
        plan = planner.full_plan(pipeline_devices, configured_alphas(cfg.partition, len(devices), replicas))
        teacher_counts, student_counts = tuple(plan.teacher_counts), tuple(plan.student_counts)
    elif cfg.partition.mode == "manual" and cfg.partition.teacher and cfg.partition.student:
        teacher_counts, student_counts = tuple(cfg.partition.teacher), tuple(cfg.partition.student)
    else:
        k = len(pipeline_devices)
        teacher_counts = tuple(even_counts(len(planner.teacher), k))
        student_counts = tuple(even_counts(len(planner.student), k))
    pipeline = Placement(tuple(pipeline_devices), teacher_counts, student_counts)
    return replicated(pipeline, devices, replicas, cfg.trainer.replica_shares, batch, fixed_m), fixed_m, planner


def cpu_contention_of(cfg: SynapseConfig) -> Callable[[int], float]:
    """A node's CPU ranks' fair share of its cores by their count, as ``planning.cpu_rank_contention`` prices
    a segment of that many ranks (``trainer.threads``, or the cores shared out among them)."""
    cores = available_cores()
    return lambda ranks: cpu_contention(ranks, cfg.trainer.threads or default_threads(ranks), cores)


def total_steps_of(cfg: SynapseConfig) -> tuple[int, int | None]:
    """The schedule's length and the steps of one epoch (None where the data set's size needs its files)."""
    samples = train_samples(cfg.data)
    per_epoch = samples // cfg.data.batch_size if samples else None
    if cfg.trainer.max_steps is not None:
        return int(cfg.trainer.max_steps), per_epoch
    if per_epoch is None:
        raise ConfigError(f"trainer.max_steps: data={cfg.data.name} tells its length only from its files, which a "
                          f"simulation does not read. Fix: set trainer.max_steps")
    return cfg.trainer.epochs * per_epoch, per_epoch


def validation_images(data: Any) -> int:
    """Images of the validation split an evaluation forwards; 0 where only its files would tell."""
    if data.name == "digits":
        return len(digits_split_indices("val"))
    if data.name == "synthetic":
        return int(data.synthetic_val_size)
    return 0


def run_simulation(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Simulate the configured run in ``run_dir``; every input is checked before the first step."""
    accelerator = accelerator_of(cfg)
    devices = list(range(simulated_device_count(cfg)))
    total, per_epoch = total_steps_of(cfg)
    noise = load_noise(cfg.simulate.step_noise, accelerator)
    spares = tuple(cfg.trainer.spare_devices)
    traced = trace_faults(cfg.simulate.trace, [*devices, *spares]) if cfg.simulate.trace else []  # checked first
    planners = SimulatedPlanners(cfg, log)
    placement, microbatches, planner = first_plan(cfg, planners, devices, log)
    faults = injected_faults(cfg.injection.fault_dicts(), placement.devices) + traced
    sim = cfg.simulate
    rates = FaultRates(sim.fail_slow_mtbf_h, sim.fail_slow_duration_s, sim.fail_slow_factor, sim.comm_fail_slow_mtbf_h,
                       sim.comm_fail_slow_duration_s, sim.comm_fail_slow_factor, sim.fail_stop_mtbf_h,
                       sim.node_loss_mtbf_h)
    if rates.any:
        horizon = HORIZON_FACTOR * total * planner.layout_cost(placement).step_time_s + 3600.0
        by_node: dict[int, list[int]] = {}
        for device in [*devices, *spares]:
            by_node.setdefault(planner.facts.node_of(device), []).append(device)
        faults += random_faults(rates, [*devices, *spares], horizon, cfg.seed, nodes=list(by_node.values()))
    controller = build_controller(cfg, planner, run_dir, log, first=placement)
    restart = controller.restart_costs.estimate("restart")
    first_launch = load_first_launch(accelerator, restart.launch_s, restart.warmup_s)
    eval_images = validation_images(cfg.data)
    if not eval_images:
        log(f"simulate: data={cfg.data.name} tells its validation split's size only from its files: evaluations "
            f"are not priced (the simulated wall time leaves them out)")
    setup = SimulationSetup(
        planner=planner, placement=placement, microbatches=microbatches, total_steps=total,
        batch_size=cfg.data.batch_size, faults=faults, noise=noise, seed=cfg.seed,
        checkpoint_every=cfg.checkpoint.every, steps_per_epoch=per_epoch,
        checkpoint_at_epoch_end=cfg.checkpoint.at_epoch_end,
        checkpoint_hold_s=restart.checkpoint_save_s * (ASYNC_SAVE_SHARE[accelerator] if cfg.checkpoint.async_save
                                                       else 1.0),
        eval_every_epochs=cfg.trainer.eval_every_epochs, eval_images=eval_images,
        failover=cfg.failover, contention_of=cpu_contention_of(cfg) if accelerator == "cpu" else None,
        max_restarts=cfg.failover.max_restarts,
        failure_detect_s=sim.failure_detect_s, first_launch_s=first_launch.total_s,
        teardown_s=restart.teardown_s,
        policy=str(cfg.policy.name), injection=cfg.injection.name)
    PARTITION.path(run_dir).write_text(json.dumps(placement.to_dict(), indent=1))
    PLAN.path(run_dir).write_text(json.dumps({"simulated": True, "microbatches": microbatches,
                                              "placement": placement.to_dict(),
                                              "predicted_step_s": planner.layout_cost(placement).step_time_s,
                                              "profiles": {"teacher": planner.teacher.source,
                                                           "student": planner.student.source},
                                              "noise": {"source": noise.source, **noise.spread()},
                                              "first_launch": {"source": first_launch.source,
                                                               "launch_s": first_launch.launch_s,
                                                               "warmup_s": first_launch.warmup_s},
                                              "faults": [f.describe() for f in faults]}, indent=1, default=str))
    log(f"simulate: {len(devices)} simulated {accelerator} device(s), {placement.replicas} replica(s) x "
        f"{placement.num_stages} stage(s), {microbatches} micro-batches, {total} steps, {len(faults)} fault(s), "
        f"policy {cfg.policy.name}")
    result = SimulatedRun(setup, controller, run_dir, log).run()
    decided = ", ".join(f"{d['action']}@{d['step']}" for d in result.decisions) or "none"
    log(f"simulate: {result.steps}/{total} steps in {result.wall_time_s:.1f} simulated s "
        f"({result.simulate_s:.1f} s to simulate), decisions {decided}")
    return {"simulation": result_dict(result)}


def result_dict(result: SimulationResult) -> dict[str, Any]:
    return {**dataclasses.asdict(result), "goodput_images_per_gpu_hour": result.goodput_images_per_gpu_hour}
