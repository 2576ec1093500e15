"""The supervisor's loop without workers: step timings from the cost model, fed to the real controller.

Per simulated step (a closed form, no event queue: a pipeline's step is one number the cost model
already computes):

1. the faults in force give every device its alpha (compute) and beta (link);
2. ``StagePlanner.layout_cost`` of the running placement at those factors gives every rank's
   compute and link time and the step time (GPipe or 1F1B, R replicas and their all-reduce: the
   planner's schedule; CPU ranks at the cost model's fair share of the cores for the running
   placement's ranks); the step's
   and each rank's noise multiply them, and the step starts after the host's gap between two
   records, drawn from the recorded streams with the noise;
3. the record goes to ``performance.jsonl`` and to ``FailoverController.observe``, exactly as the
   watcher thread feeds a real run's records;
4. a decision is carried out as the supervisor does: what it takes live (``failover.live``: a REPLAN
   on the same ranks, a REBALANCE of replicas) continues in place after the live path's measured cost,
   any other action stops with a checkpoint and restarts after the restart path's measured cost
   (the controller's restart-cost model, i.e. the shipped priors);
   a device that dies goes to ``on_hard_failure`` and the run resumes from its last checkpoint,
   redoing the steps since;
5. what a real run does between steps is held on the clock after the step's record: a checkpoint
   save (every ``checkpoint.every`` steps, at epoch ends, at the last step) holds the loop for
   ``checkpoint_hold_s``, an evaluation (every ``trainer.eval_every_epochs`` epochs and at the last
   step) for a forward-only pass of the validation split through the running placement. As in a real
   run (the trainer restarts its step timer after them) they are in no record's ``step_seconds``, so
   the detector does not read them as a slowdown; the next step's ``time`` is late by them, and the
   wall time has them. An injected slowdown does not slow an evaluation (the injector's hooks fire in
   training steps only); a device slow from a trace or rates does;
6. the run begins with the first launch measured on real runs (``simulation.launch``: the launcher's
   forkserver starting, which no relaunch pays) and ends when its workers have exited after the last
   step (the restart prior's teardown).

Time is simulated: every record's ``time`` is the simulated clock (starting at ``START_TIME``), so
the same seed writes the same records, and the report reads them as it reads a real run's.
"""
from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from synapse.config import FailoverConfig
from synapse.decision import Decision, NoViableOptionError
from synapse.failover import (
    LIVE_OUTCOMES,
    FailoverController,
    Restart,
    Segment,
    replica_engine,
    write_experiment_summary,
    write_segment,
)
from synapse.partitioning import Placement, StagePlanner
from synapse.rundir import PERFORMANCE, EventLog, JsonlWriter, events_path
from synapse.simulation.faults import COMM, COMPUTE, DEATHS, NODE, DeviceFault
from synapse.simulation.noise import StepNoise

START_TIME = 1_800_000_000.0  # the simulated clock's origin, in UNIX seconds (fixed: the same seed, the same records)
NOISE_CHUNK = 4096  # steps of noise drawn at once


@dataclass
class SimulationSetup:
    """Everything a simulated run needs besides its controller."""

    planner: StagePlanner  # what a step costs: the run's cost model, at the true factors of the faults
    placement: Placement  # the first one
    microbatches: int
    total_steps: int
    batch_size: int
    faults: list[DeviceFault] = field(default_factory=list)
    noise: StepNoise = field(default_factory=StepNoise)
    seed: int = 0
    checkpoint_every: int = 0  # checkpoint.every (0: only at epoch ends)
    steps_per_epoch: int | None = None  # the data set's epoch in steps (None: unknown, so no epoch ends)
    checkpoint_at_epoch_end: bool = True  # checkpoint.at_epoch_end
    checkpoint_hold_s: float = 0.0  # the loop held per checkpoint save (async: its stall; sync: the save)
    eval_every_epochs: int = 1  # trainer.eval_every_epochs
    eval_images: int = 0  # the validation split an evaluation forwards (0: no evaluation priced)
    failover: FailoverConfig = field(default_factory=FailoverConfig)  # each launch's replica engine (failover.live)
    # CPU ranks: the cores' fair share for a node running this many ranks (``cost_model.cpu_contention`` at the
    # run's threads and this host's cores), so that a placement runs at its own ranks' share; None (GPUs): the
    # planner's contention throughout
    contention_of: Callable[[int], float] | None = None
    max_restarts: int = 3
    failure_detect_s: float = 5.0
    first_launch_s: float = 0.0  # the first launch, measured (``simulation.launch``): the start to the first step
    teardown_s: float = 0.0  # after the last step: the workers' exit, as a stop's teardown (the restart prior's)
    policy: str = "eta"
    injection: str = "none"


@dataclass
class SimulationResult:
    wall_time_s: float  # simulated, first launch to the last step
    steps: int  # the last step reached
    total_steps: int
    completed: bool
    decisions: list[dict[str, Any]]
    segments: int
    restarts: int
    useful_images: int
    devices_used: int  # the first placement's devices and spares: what the run holds for its whole length
    error: str | None = None
    simulate_s: float = 0.0  # real seconds the simulation took

    @property
    def goodput_images_per_gpu_hour(self) -> float:
        hours = self.wall_time_s / 3600.0
        return self.useful_images / (self.devices_used * hours) if hours > 0 else 0.0


class SimulatedRun:
    """One simulated run in ``run_dir``, writing the records a real run writes."""

    def __init__(self, setup: SimulationSetup, controller: FailoverController, run_dir: Path,
                 log: Callable[[str], None] = print):
        self.setup, self.controller, self.run_dir, self.log = setup, controller, Path(run_dir), log
        self.clock = START_TIME
        self.rng = np.random.default_rng(setup.seed)
        self._gap_rng = np.random.default_rng((setup.seed, 1))  # its own stream: the ratios stay the seed's
        self._events = EventLog(events_path(run_dir), source="supervisor")
        controller_log = EventLog(events_path(run_dir), source="controller")
        # the controller stamps its records with the real time; the simulated clock replaces it
        controller.log_event = lambda event, **fields: controller_log.write({"event": event, **fields,
                                                                               "time": self.clock})
        self.placement = setup.placement
        self.segments: list[Segment] = []
        self.restarts: list[Restart] = []
        self._pending: Restart | None = None  # restarted, its first step not run yet
        self._cost_cache: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, float]] = {}
        self._eval_cache: dict[tuple[Any, ...], float] = {}
        self._planners: dict[float, StagePlanner] = {}
        self._noise_at, self._noise_step, self._noise_compute = 0, np.ones(0), np.ones((0, 0))
        self._gap_at, self._gaps = 0, np.zeros(0)
        self._width = len(setup.placement.devices) + len(controller.spare_devices)
        self._step_faults = sorted((f for f in setup.faults if not f.in_seconds), key=lambda f: f.start)
        self._time_faults = sorted((f for f in setup.faults if f.in_seconds), key=lambda f: f.start)
        self._step_starts = [f.start for f in self._step_faults]
        self._time_starts = [f.start for f in self._time_faults]
        self._announced: set[int] = set()  # faults whose onset was logged (by id)
        self._dead: set[int] = set()
        self._last_checkpoint = 0

    # ---------------------------------------------------------------- the loop
    def run(self) -> SimulationResult:
        began = time.perf_counter()
        setup = self.setup
        self._start_segment(0, self.placement, "start", 0)
        self.controller.begin_segment(self.placement, start_step=0,
                                      engine=replica_engine(setup.failover, self.placement))
        self.clock += setup.first_launch_s
        step, error = 0, None
        with JsonlWriter(PERFORMANCE.path(self.run_dir)) as performance:
            while step < setup.total_steps:
                step += 1
                active = self._active_faults(step)
                dead = self._device_dying(active)
                if dead is not None:
                    try:
                        step = self._hard_failure(dead[0], step, lost_with_it=dead[1:])
                    except _RunEnds as end:
                        error, step = str(end), step - 1
                        break
                    continue
                record = self._step_record(step, active)
                performance.write(record)
                self._between_steps(step, active)
                self._first_step_after_restart(record)
                decision = self.controller.observe(record)
                if decision is None:
                    continue
                try:
                    step = self._act(decision, step)
                except _RunEnds as end:
                    error = str(end)
                    break
        if error is None:
            self.clock += setup.teardown_s  # the run ends when its workers have exited
        self._end(step, error)
        return SimulationResult(
            wall_time_s=self.clock - START_TIME, steps=step, total_steps=setup.total_steps, completed=error is None,
            decisions=[{k: d.get(k) for k in ("step", "action", "reason")} for d in self.controller.decisions],
            segments=len(self.segments), restarts=sum(r.mode != "live" for r in self.restarts),
            useful_images=min(step, setup.total_steps) * setup.batch_size, devices_used=self._width, error=error,
            simulate_s=time.perf_counter() - began)

    # ---------------------------------------------------------------- faults
    def _active_faults(self, step: int) -> list[DeviceFault]:
        """Faults begun by ``step`` (or by the clock) and not over; onsets are logged once."""
        started = self._step_faults[:bisect.bisect_right(self._step_starts, step)] + \
            self._time_faults[:bisect.bisect_right(self._time_starts, self.clock - START_TIME)]
        now = self.clock - START_TIME
        active = [f for f in started if f.end is None or (now if f.in_seconds else step) <= f.end or f.kind in DEATHS]
        for fault in active:
            if id(fault) not in self._announced and fault.device not in self._dead:
                self._announced.add(id(fault))
                devices = self.placement.devices
                rank = devices.index(fault.device) if fault.device in devices else None
                self._events.write({"event": "fault_injected", "time": self.clock, "source": "simulation",
                                    "step": step, "rank": rank, **fault.describe()})
        return active

    def _device_dying(self, active: list[DeviceFault]) -> tuple[int, ...] | None:
        """The running devices that die now, the first one the failure's cause (None: none); a node
        loss takes every device of the fault's node. Spares that die idle leave the spares."""
        for fault in active:
            if fault.kind not in DEATHS or fault.device in self._dead:
                continue
            lost: tuple[int, ...] = (fault.device,)
            if fault.kind == NODE:
                node_of, node = self.setup.planner.facts.node_of, self.setup.planner.facts.node_of(fault.device)
                everyone = (*self.placement.devices, *self.controller.spare_devices)
                lost = (fault.device, *(d for d in everyone if d != fault.device and node_of(d) == node))
            self._dead.update(lost)
            self.controller.spare_devices = tuple(d for d in self.controller.spare_devices if d not in lost)
            running = tuple(d for d in lost if d in self.placement.devices)
            if running:
                return running
        return None

    def _factors(self, active: list[DeviceFault], step: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        devices = self.placement.devices
        alphas, betas = [1.0] * len(devices), [1.0] * len(devices)
        now = self.clock - START_TIME
        for fault in active:
            if fault.kind in DEATHS or fault.device not in devices:
                continue
            rank = devices.index(fault.device)
            factor = fault.factor_at(step, now)
            if fault.kind == COMPUTE:
                alphas[rank] *= factor
            elif fault.kind == COMM:
                betas[rank] *= factor
        return tuple(alphas), tuple(betas)

    # ---------------------------------------------------------------- one step
    def _planner_running(self) -> StagePlanner:
        """The planner at the running placement's share of the host's cores. The run's planner has the
        first placement's (``cpu_rank_contention``: its ranks on a node, threads and cores); a relaunch on
        fewer or more ranks runs at theirs, as its own segment's planning prices it (measured: the 3-rank
        demo degraded to 2 ranks on the 2 cores computed 0.027 / 0.035 s a step, its profiles at the share
        of 2 ranks 0.029 / 0.028 s, at the first placement's 3 ranks 0.043 / 0.042 s)."""
        planner, contention_of = self.setup.planner, self.setup.contention_of
        if contention_of is None:
            return planner
        node_of = planner.facts.node_of
        per_node: dict[int, int] = {}
        for device in self.placement.devices:
            per_node[node_of(device)] = per_node.get(node_of(device), 0) + 1
        contention = contention_of(max(per_node.values()))
        if contention == planner.facts.contention:
            return planner
        if contention not in self._planners:
            self._planners[contention] = replace(planner, facts=replace(planner.facts, contention=contention))
        return self._planners[contention]

    def _cost(self, alphas: tuple[float, ...], betas: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, float]:
        key = (self.placement, alphas, betas)
        if key not in self._cost_cache:
            devices = self.placement.devices
            cost = self._planner_running().layout_cost(self.placement, dict(zip(devices, alphas)),
                                                       dict(zip(devices, betas)))
            self._cost_cache[key] = (np.asarray(cost.compute_s), np.asarray(cost.transfer_s), cost.step_time_s)
        return self._cost_cache[key]

    def _noise(self, ranks: int) -> tuple[float, np.ndarray]:
        if self._noise_at >= len(self._noise_step):
            self._noise_step, self._noise_compute = self.setup.noise.draw(self.rng, NOISE_CHUNK, self._width)
            self._noise_at = 0
        i = self._noise_at
        self._noise_at += 1
        return float(self._noise_step[i]), self._noise_compute[i, :ranks]

    def _host_gap(self) -> float:
        if self._gap_at >= len(self._gaps):
            self._gaps, self._gap_at = self.setup.noise.draw_gaps(self._gap_rng, NOISE_CHUNK), 0
        self._gap_at += 1
        return float(self._gaps[self._gap_at - 1])

    def _step_record(self, step: int, active: list[DeviceFault]) -> dict[str, Any]:
        compute_nominal, transfer, step_nominal = self._cost(*self._factors(active, step))
        step_ratio, rank_ratios = self._noise(len(compute_nominal))
        compute = compute_nominal * rank_ratios
        step_s = max(step_nominal * step_ratio, float(compute.max()))
        comm = step_s - compute  # as measured: a rank's time not computing is communication, waiting included
        # the host's time before the step (records, loader, the supervisor's reads): in no step's time
        self.clock += self._host_gap() + step_s
        return {"step": step, "segment": self.segments[-1].index, "devices": list(self.placement.devices),
                "total_steps": self.setup.total_steps, "step_seconds": step_s, "compute_s": compute.tolist(),
                "comm_s": comm.tolist(), "send_s": np.minimum(transfer * step_ratio, comm).tolist(),
                "images_per_s": self.setup.batch_size / step_s, "time": self.clock}

    # ---------------------------------------------------------------- between steps
    def _between_steps(self, step: int, active: list[DeviceFault]) -> None:
        """A checkpoint save and an evaluation due after ``step`` (the trainer's rule): the clock is
        held by them, no step's time includes them."""
        setup = self.setup
        per_epoch, last = setup.steps_per_epoch, step == setup.total_steps
        epoch_end = bool(per_epoch) and step % per_epoch == 0  # type: ignore[operator]
        save = (setup.checkpoint_every and step % setup.checkpoint_every == 0) or \
            (epoch_end and setup.checkpoint_at_epoch_end) or last
        evaluate = setup.eval_images > 0 and (
            last or (epoch_end and (step // per_epoch) % setup.eval_every_epochs == 0))  # type: ignore[operator]
        if save:
            self.clock += setup.checkpoint_hold_s
            self._last_checkpoint = step
            self._events.write({"event": "checkpoint_saved", "time": self.clock, "source": "simulation", "step": step,
                                "stall_s": setup.checkpoint_hold_s})
        if evaluate:
            seconds = self._evaluation_s(self._factors([f for f in active if f.slows_evaluation], step)[0])
            self.clock += seconds
            self._events.write({"event": "evaluation", "time": self.clock, "source": "simulation", "step": step,
                                "seconds": seconds, "images": setup.eval_images})

    def _evaluation_s(self, alphas: tuple[float, ...]) -> float:
        """A forward-only pass of ``eval_images`` through the running placement, as
        ``PipelineEvaluation`` runs it: each replica forwards every R-th batch of an equal share's size
        (``Placement.evaluation_batch``), pipelined (GPipe) over its stages in micro-batches of the
        planner's profiles (teacher and student forward times, each stage's times its rank's compute
        factor and the ranks' share of the host's cores, as a step's compute is priced); the slowest
        replica ends the pass. Link time is left out (forward activations only, small beside the
        compute)."""
        key = (self.placement, alphas)
        if key not in self._eval_cache:
            placement, planner, batch = self.placement, self.setup.planner, self.setup.batch_size
            contention = self._planner_running().facts.contention
            teacher = [b.forward_time_ms / 1000.0 for b in planner.teacher.blocks]
            student = [b.forward_time_ms / 1000.0 for b in planner.student.blocks]
            chunk = placement.evaluation_batch(batch, self.setup.microbatches)
            passes = math.ceil(math.ceil(self.setup.eval_images / chunk) / placement.replicas)
            micro = max(1, batch // (placement.replicas * self.setup.microbatches))  # the profiles' micro-batch
            per_pass = math.ceil(chunk / micro)
            slowest = 0.0
            for ranks in placement.pipeline_ranks():
                stage_s = [alphas[r] * contention * (sum(teacher[i] for i in placement.teacher_range(r)) +
                                        sum(student[i] for i in placement.student_range(r))) for r in ranks]
                slowest = max(slowest, passes * (sum(stage_s) + (per_pass - 1) * max(stage_s)))
            self._eval_cache[key] = slowest
        return self._eval_cache[key]

    # ---------------------------------------------------------------- segments and restarts
    def _start_segment(self, index: int, placement: Placement, reason: str, start_step: int) -> None:
        segment = Segment(index, placement, self.setup.microbatches, reason=reason, start_step=start_step,
                          started_at=self.clock)
        self.segments.append(segment)
        self.placement = placement
        write_segment(self.run_dir, segment)

    def _end_segment(self, end_step: int, outcome: str) -> Segment:
        segment = self.segments[-1]
        segment.ended_at, segment.end_step, segment.outcome = self.clock, end_step, outcome
        write_segment(self.run_dir, segment)
        self._events.write({"event": "segment_ended", "time": self.clock, "segment": segment.index,
                            "outcome": outcome, "step": end_step})
        return segment

    def _checkpoint_before(self, step: int) -> int:
        """The newest checkpoint at or before ``step``: periodic, epoch ends, or a stop's."""
        every, per_epoch = self.setup.checkpoint_every, self.setup.steps_per_epoch
        periodic = step - step % every if every else 0
        epoch_end = step - step % per_epoch if per_epoch and self.setup.checkpoint_at_epoch_end else 0
        return max(periodic, epoch_end, self._last_checkpoint if self._last_checkpoint <= step else 0)

    def _act(self, decision: Decision, step: int) -> int:
        """Carry out a non-KEEP decision taken after ``step``; returns the step the run continues after."""
        kind = decision.action
        live = self.controller.takes_live(kind, decision.chosen.placement)
        path = "live" if live else "restart"
        if not live and sum(r.mode != "live" for r in self.restarts) >= self.setup.max_restarts:
            raise _RunEnds(f"{kind.value} decided at step {step} but failover.max_restarts={self.setup.max_restarts} "
                           f"restarts are spent")
        components = self.controller.restart_costs.estimate(path).to_dict()
        components = {k: float(v) for k, v in components.items() if k != "total_s"}
        trigger_time = self.clock
        restart = Restart(segment=self.segments[-1].index + 1, action=kind.value, trigger_time=trigger_time,
                          trigger_step=step, resume_step=step, cause=decision.reason, decision=decision,
                          trigger="decision", mode="live" if live else "restart", last_step_time=self.clock,
                          components=components)
        self._end_segment(step, LIVE_OUTCOMES[kind.value] if live else "stopped")
        if not live:
            self._last_checkpoint = step  # a stop on request checkpoints at the step it stops after
        self.clock += sum(components.values())
        self._restart(restart, decision.chosen.placement, kind.value + (" (live)" if live else ""), step,
                      rewind=not live)
        self.controller.restart_costs.observe(path, components)
        return step

    def _hard_failure(self, device: int, step: int, lost_with_it: tuple[int, ...] = ()) -> int:
        """``device`` (and ``lost_with_it``: its node's other running devices) died during ``step``: the
        controller picks survivors, the run resumes from a checkpoint."""
        failed_at = self.clock
        for dead in (device, *lost_with_it):
            self._events.write({"event": "rank_dead", "time": failed_at, "source": "simulation", "hard": True,
                                "rank": self.placement.devices.index(dead), "device": dead, "step": step})
        self.clock += self.setup.failure_detect_s
        cause = (f"device {device} lost (simulated fail-stop)" if not lost_with_it else
                 f"node of device {device} lost with devices {list(lost_with_it)} (simulated node loss)")
        if sum(r.mode != "live" for r in self.restarts) >= self.setup.max_restarts:
            raise _RunEnds(f"{cause} at step {step} but failover.max_restarts={self.setup.max_restarts} restarts "
                           f"are spent")
        try:
            decision = self.controller.on_hard_failure(device, step - 1, self.setup.total_steps, cause,
                                                       lost_with_it=lost_with_it)
        except NoViableOptionError as exc:
            raise _RunEnds(f"{cause} at step {step} and no device is left to continue on ({exc})") from None
        resume = self._checkpoint_before(step - 1)
        components = self.controller.restart_costs.estimate("restart").to_dict()
        # a dead device saves no checkpoint for the restart: the last one is resumed, its steps redone
        components = {k: float(v) for k, v in components.items() if k not in ("total_s", "checkpoint_save_s")}
        restart = Restart(segment=self.segments[-1].index + 1, action=decision.action.value, trigger_time=failed_at,
                          trigger_step=step - 1, resume_step=resume, cause=cause, decision=decision,
                          trigger="failure", last_step_time=failed_at, components=components)
        self._end_segment(step - 1, "failed")
        self.clock += sum(components.values())
        self._restart(restart, decision.chosen.placement, f"failure: {cause}", resume, rewind=True)
        self.controller.restart_costs.observe("restart", components)
        return resume

    def _restart(self, restart: Restart, placement: Placement, reason: str, start_step: int, rewind: bool) -> None:
        self.restarts.append(restart)
        self._start_segment(restart.segment, placement, reason, start_step)
        if restart.mode != "live":
            restart.relaunch_time = self.clock
            self._events.write({"event": "relaunch", "time": self.clock, "segment": restart.segment,
                                "devices": list(placement.devices), "resume_step": start_step})
        launched = restart.mode != "live"  # a new launch: its replica engine is its placement's
        self.controller.begin_segment(placement, start_step=start_step if rewind else None,
                                      engine=replica_engine(self.setup.failover, placement) if launched else None)
        self._pending = restart

    def _first_step_after_restart(self, record: dict[str, Any]) -> None:
        restart, self._pending = self._pending, None
        if restart is None:
            return
        restart.first_step = int(record["step"])
        restart.recovery_s = float(record["time"]) - restart.trigger_time
        restart.downtime_s = restart.downtime(record, self.controller.baseline_step_s)
        self._events.write({"event": "first_step_after_restart", "time": record["time"], "segment": restart.segment,
                            "step": restart.first_step, "action": restart.action, "mode": restart.mode,
                            "recovery_s": restart.recovery_s, "downtime_s": restart.downtime_s,
                            "components": restart.components,
                            "redo_steps": max(0, restart.trigger_step - restart.resume_step)})

    def _end(self, step: int, error: str | None) -> None:
        self._end_segment(step, "error" if error else "finished")
        if error:
            self._events.write({"event": "run_failed", "time": self.clock, "error": error})
            self.log(f"simulate: the run ends at step {step}: {error}")
        last = {"steps": step, "total_steps": self.setup.total_steps, "final_eval": {},
                "images_per_s": None}
        write_experiment_summary(self.run_dir, self.setup.policy, self.setup.injection, self.controller,
                                 self.segments, self.restarts, START_TIME, last, ended_at=self.clock)


class _RunEnds(Exception):
    """The run cannot go on (no device left, restart budget spent): it ends there, as a real one would."""
