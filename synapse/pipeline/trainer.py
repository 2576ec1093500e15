"""A pipeline rank's share of the training loop: the loop is ``engine.trainer.Trainer``, composed
here with the parts that differ from one device.

- ``PipelineRunner``: a step is a pipeline schedule step; after it one collective exchange
  (every rank's timings, the supervisor's control request; on a CPU group, so that it does not
  wait for the GPU) and, on the last rank, the performance record of the step the timings are
  of (on CUDA the step before: `synapse.pipeline.clock`); at the step boundary, a live
  re-partition when one was requested.
- ``ProcessGroupShards``: a checkpoint is one shard per rank (keyed by the original parameter
  names, so any partition can load it) committed by rank 0 (``engine.checkpointer``).
- ``PipelineEvaluation``: a forward-only pipeline pass whose logits land on the last rank.

Data order, losses, optimizer, schedule and metric records are the parts the single-device
trainer uses. ``build_pipeline_trainer`` is the one function here that reads the run's whole config
(it composes a worker's loop); each part gets the settings or config groups it uses.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from synapse.config import OptimConfig, PipelineConfig, SynapseConfig, TrainerConfig
from synapse.control import ControlChannel, StopAck, StopRequest, control_endpoint, open_channel
from synapse.engine import (
    Checkpointer,
    ComputeSetup,
    HeldState,
    Trainer,
    build_optimizer,
    build_run_parts,
    build_scheduler,
    checks_loss_late,
    eval_batches,
    kd_params,
    load_optimizer_state_by_name,
    loader_workers,
    loop_settings,
    optimizer_state_by_name,
    topk_correct,
    training_loss,
)
from synapse.health import Heartbeat
from synapse.injection import FaultInjector, build_fault_injector
from synapse.partitioning import Placement
from synapse.pipeline.all_blocks import AllBlocks, build_all_blocks
from synapse.pipeline.clock import reads_timing_late
from synapse.pipeline.quorum import (
    FirstParticipantCheckpointer,
    QuorumReplicas,
    ReplicaGroupSpec,
    faults_not_fired,
    respawned,
)
from synapse.pipeline.repartition import exchange_blocks, payload_size_bytes, student_moves
from synapse.pipeline.replicas import ReplicaMesh, ReplicaReduction
from synapse.pipeline.runtime import PipelineRuntime, ProgressBoard, progress_path
from synapse.rundir import (
    CHECKPOINTS,
    PERFORMANCE,
    EventLog,
    JsonlWriter,
    NullWriter,
    Refusals,
    events_path,
    read_jsonl,
    run_key,
)


class ProcessGroupShards:
    """The ranks of the pipeline as a checkpoint's shard group (collectives on the default group)."""

    def __init__(self, runner: PipelineRunner):
        self.runner = runner
        self.rank, self.world_size = runner.rank, runner.world_size
        # DCP's own gloo group: its collectives run on the checkpoint thread, concurrently with the
        # training loop's on the default group (which may be NCCL; async_save needs a CPU backend).
        self.process_group = dist.new_group(backend="gloo")

    def agree(self, value: Any) -> Any:
        box = [value if self.rank == 0 else None]
        self.runner.runtime.mark("sync")
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        self.runner.runtime.mark("sync")
        dist.barrier()


@dataclass
class PipelineRunner:
    """This rank's stage of the pipelined KD step and everything that moves with it."""

    # The config groups a live re-partition rebuilds the stage's runtime, optimizer and schedule from.
    pipeline: PipelineConfig
    optim: OptimConfig
    trainer: TrainerConfig
    images_per_step: int  # data.batch_size: the performance record's images/s
    run_dir: Path
    setup: ComputeSetup
    runtime: PipelineRuntime
    rank: int
    world_size: int
    owned: dict[str, torch.Tensor]  # original student parameter/buffer name -> tensor held by this rank
    partition: Placement
    blocks: AllBlocks  # every teacher and student block (for live re-partitions)
    injector: FaultInjector
    heartbeat: Heartbeat
    events: EventLog
    control: ControlChannel
    performance: JsonlWriter
    total_steps: int
    segment: int = 0  # which segment of the run this is (segments/<n>/); a live re-partition starts the next
    log: Callable[[str], None] = print
    stop_requested: bool = False
    live_request: StopRequest | None = None  # a live REPLAN or REBALANCE to apply after this step
    applied_requests: set = field(default_factory=set)
    step: int = 0  # the last step run (for the events of a re-partition)
    # The per-step exchange's group: gloo, so that gathering a few Python objects neither
    # synchronises with nor waits behind the GPU's queue (None: the default group, already gloo).
    control_group: Any = None
    # failover.replica_engine=torchft: this replica's place in the quorum of replicas (each replica a launch)
    quorum: QuorumReplicas | None = None
    _stop_seen: StopRequest | None = None  # under torchft: a stop request this replica saw, not yet agreed

    @property
    def writes_records(self) -> bool:
        """The last rank (under torchft, replica 0's: every replica reduces the same global loss)."""
        return self.rank == self.world_size - 1 and (self.quorum is None or self.quorum.spec.replica == 0)

    @property
    def needs_data(self) -> bool:
        return self.runtime.is_first or self.runtime.is_last  # images enter at rank 0, labels at the last

    @property
    def needs_images(self) -> bool:
        return self.runtime.is_first  # the last rank reads labels only, no image is decoded there

    @property
    def batch_share(self) -> range | None:
        replicas = self.runtime.replicas
        return None if replicas is None else replicas.share

    @property
    def device(self) -> torch.device:
        return self.setup.device

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.runtime.optimizer

    @property
    def scheduler(self) -> Any:
        return self.runtime.scheduler

    @property
    def skipped(self) -> bool:
        return self.runtime.skipped

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        self.step = step
        if self.quorum is None:
            loss = self.runtime.train_step(images, labels, step)
        else:  # the whole batch was loaded: the quorum says which images are this replica's, attempt by attempt
            def train_share(share: range) -> torch.Tensor | None:
                self.runtime.use_share(len(share))
                return self.runtime.train_step(None if images is None else images[share.start:share.stop],
                                               None if labels is None else labels[share.start:share.stop], step)
            loss = self.quorum.run_step(step, train_share, undo=lambda: self.optimizer.zero_grad(set_to_none=True))
            self.quorum.carried = self.runtime.last_timing  # told to the other replicas with the next step
        self.heartbeat.beat(step)
        return loss

    def held_state(self) -> HeldState:
        # the decider epoch (across nodes) goes into the manifest: checkpoint/write.py refuses the commit of
        # workers whose decider was replaced
        return HeldState(self.owned, self.optimizer, self.scheduler, {"partition": self.partition.to_dict(),
                                                                      "epoch": self.trainer.decider_epoch})

    def check_loss(self, step: int, loss: float) -> None:
        self.runtime.guard.check_read_loss(step, loss)

    def after_step(self, step: int) -> dict[str, Any]:
        """The step's collective exchange, then the performance record of the step the clock
        reported (on the record-writing rank); the metrics record's timing fields when that is
        this step."""
        timings = self.exchange_step_state(step)
        if not self._record_timings(timings) or timings[-1]["step"] != step:
            return {}
        return {"compute_s": [t["compute"] for t in timings], "comm_s": [t["comm"] for t in timings]}

    def finish_steps(self) -> None:
        """Record the step the clock has not reported yet (on CUDA, the last one before the loop
        ended or the segment changed): one more gather, which every rank reaches at the same step."""
        if not self.runtime.clock.read_late:
            return
        gathered: list[Any] = [None] * self.world_size
        self.runtime.mark("sync")
        dist.all_gather_object(gathered, self.runtime.clock.flush(), group=self.control_group)
        self._record_timings(gathered)

    def _record_timings(self, timings: Sequence[dict[str, Any] | None]) -> bool:
        """The performance record of these per-rank timings (of one step); False: there are none
        (the first step of a clock read late reports nothing)."""
        reported = [t for t in timings if t is not None]
        if len(reported) < len(timings) or len({t["step"] for t in reported}) > 1:
            return False
        if self.writes_records:
            self.write_performance_record(reported[-1]["step"], reported)
        return True

    def exchange_step_state(self, step: int) -> list[dict[str, float]]:
        """One all-gather per step: every rank's compute/comm split of the step, and the control
        request rank 0 found (all ranks learn it here, so all act after the same step)."""
        request = self.control.poll() if self.rank == 0 else None
        if request is not None and request.id in self.applied_requests:
            request = None  # a live re-partition already done; the request stays until the supervisor moves on
        # under torchft: this stage's timings of every replica, one step back (they came with this step's reduction)
        timing = self.runtime.last_timing if self.quorum is None else self.quorum.replica_timings
        mine = {"timing": timing, "request": request.to_dict() if request else None}
        gathered: list[dict[str, Any]] = [{} for _ in range(self.world_size)]
        self.runtime.mark("sync")
        dist.all_gather_object(gathered, mine, group=self.control_group)
        taken = gathered[0]["request"]
        request = StopRequest.from_dict(taken) if taken is not None else None
        if self.quorum is not None:
            self._agree_on_stop(request, step)
        else:
            self.live_request = request if request is not None and request.live else None
            self.stop_requested = request is not None and not request.live
            if request is not None and self.rank == 0:
                self.control.acknowledge(StopAck(request.id, step))
        if self.quorum is not None:  # rank order of the run: replica after replica, each replica's stages
            return [g["timing"][r] for r in range(self.quorum.spec.replicas) for g in gathered]
        return [g["timing"] for g in gathered]

    def _agree_on_stop(self, request: StopRequest | None, step: int) -> None:
        """Under torchft every replica polls the control channel on its own: a request one saw rides on the
        next step's reduction, and every replica stops after that same step (the controller sends none live
        to a torchft launch: failover.live)."""
        if request is not None and self._stop_seen is None:
            self._stop_seen = request
            cast(QuorumReplicas, self.quorum).stop_seen = True
        self.live_request = None
        self.stop_requested = cast(QuorumReplicas, self.quorum).stop_agreed
        if self.stop_requested and self._stop_seen is not None and self.rank == 0:
            self.control.acknowledge(StopAck(self._stop_seen.id, step))

    def write_performance_record(self, step: int, timings: list[dict[str, float]]) -> None:
        timings = [{part: seconds for part, seconds in t.items() if part != "step"} for t in timings]
        wall = max(t["wall"] for t in timings)
        self.performance.write({
            "step": step, "segment": self.segment,
            "devices": list(self.quorum.spec.run_devices if self.quorum else self.partition.devices),
            "total_steps": self.total_steps, "step_seconds": wall,
            "compute_s": [t["compute"] for t in timings], "comm_s": [t["comm"] for t in timings],
            "send_s": [t.get("send", 0.0) for t in timings], "ranks": timings,
            "images_per_s": self.images_per_step / wall,
            # each replica's images per step (a REBALANCE changes them, live or by restart)
            **({"shares": list(self.partition.share_sizes(self.images_per_step, self.runtime.microbatches))}
               if self.partition.replicas > 1 else {}),
            # under torchft: how many replicas the quorum had when these timings were told (every one: a record
            # is written only of steps every replica ran)
            **({"replicas_alive": self.quorum.participants} if self.quorum else {}),
        })

    def apply_control(self, step: int) -> None:
        if self.live_request is not None:
            request, self.live_request = self.live_request, None
            self.applied_requests.add(request.id)
            change = self.reshare if request.action == "rebalance" else self.repartition
            if not change(request.placement):
                # The restart path is the fallback: stop after this step with a checkpoint of the
                # old placement; the supervisor relaunches on the new one (the decision stands).
                self.stop_requested = True

    def reshare(self, new: Placement) -> bool:
        """Live REBALANCE: from the next step on, every rank trains on its replica's share under ``new`` (its
        loader's cut of each batch and its gradient's weight, share / batch); devices, cuts, process groups
        and every tensor stay (CUDA graphs are keyed by shape: the new micro-batches are captured anew).
        The ranks agree first that each can take the new shares; if any cannot, none does and this returns
        False (the caller falls back to the restart path)."""
        started = time.perf_counter()
        self.runtime.mark("repartition")
        mesh = self._agree(self._try(lambda: self._reshared_mesh(new)), new, "sharing out the batch anew",
                           failed_event="live_rebalance_failed")
        if mesh is None:
            return False
        self.finish_steps()  # the old shares' last step is recorded as the old segment's
        self.runtime.reshare(mesh)
        self.partition, self.segment = new, self.segment + 1
        # the change's time on every rank, and the processes that took it (the same ones train on: no restart)
        taken: list[Any] = [None] * self.world_size
        dist.all_gather_object(taken, (time.perf_counter() - started, os.getpid()))
        if self.rank == 0:
            self.events.append("live_rebalance", segment=self.segment, step=self.step, partition=new.to_dict(),
                               shares=list(new.shares), seconds=max(t for t, _ in taken),
                               pids=[pid for _, pid in taken])
        self.log(f"live rebalance at step {self.step}: replica {mesh.replica} now trains on {len(mesh.share)} of "
                 f"each {mesh.batch} images (shares {list(new.shares)})")
        return True

    def _reshared_mesh(self, new: Placement) -> ReplicaMesh:
        self.injector.on("repartition", self.step)
        mesh = self.runtime.replicas
        if not isinstance(mesh, ReplicaMesh):
            raise TypeError(f"a live rebalance needs the run's replica groups, this rank has {type(mesh).__name__}")
        return mesh.reshared(new, self.runtime.microbatches)

    def repartition(self, new: Placement) -> bool:
        """Live REPLAN: move the student blocks that change owner, rebuild stage, optimizer and schedule.
        With replicas every replica is re-cut at once: a block moves between two ranks of one replica (each
        replica holds the same weights), and the groups that sum the gradients are made for the new cut.

        Nothing is saved or reloaded: parameters, buffers and optimizer state move by name,
        the scheduler's state and this process's RNG carry on, so the next step computes exactly
        what it would have computed on the old partition.

        Three phases, so that a failure leaves every rank on its old stage, untouched: (1) each
        rank prepares what it sends; (2) the blocks move; (3) each rank assembles its new stage
        beside the old one. After (1) and after (3) the ranks agree; if any failed, none swaps
        and this returns False (the caller falls back to the restart path). A failure inside
        (2) leaves a peer waiting; the collective timeout then makes it a hard failure.
        """
        started = time.perf_counter()
        # The progress board says, through every phase, whether this rank works or waits on the
        # others: a rank that hangs here is then told from the ranks waiting for it (root_cause.hang_culprit).
        self.runtime.mark("repartition")
        prepared = self._agree(self._try(lambda: self._prepare_moves(new)), new, "preparing the transfer")
        if prepared is None:
            return False
        moves, optim_state, outgoing = prepared
        device = self.setup.wire  # where the process group moves tensors
        self.runtime.mark("recv")  # a point-to-point exchange: each rank waits on its peers
        received = exchange_blocks(moves, self.rank, outgoing.__getitem__, device)
        self.runtime.mark("repartition")
        built = self._agree(self._try(lambda: self._assemble_stage(new, received, optim_state)), new,
                            "building the new stage")
        if built is None:
            return False
        module, owned, optimizer, scheduler = built
        self.blocks.release(self.rank, self.partition, new)
        self.finish_steps()  # the old stage's last step is recorded as the old segment's
        old = self.runtime
        # Replicas: the groups that sum each block's gradients follow the new cut; a group of the same use and
        # ranks as one already made is reused (every rank holds the same ones and makes the missing ones in one
        # order)
        made = old.replicas.groups if isinstance(old.replicas, ReplicaMesh) else None
        mesh = (ReplicaMesh.build(new, self.rank, self.images_per_step, old.microbatches, made) if new.replicas > 1
                else None)
        self.runtime = PipelineRuntime(module, new.stage_of(self.rank), new.stages_of_rank(self.rank), self.setup,
                                       old.microbatches, self.pipeline.schedule, old.loss_fn, optimizer, scheduler,
                                       self.injector, replicas=mesh,
                                       nonfinite=self.trainer.nonfinite, board=old.board,
                                       cuda_graphs=self.pipeline.cuda_graphs, check_late=old.guard.late,
                                       read_timing_late=old.clock.read_late, compiler=self.pipeline.compiler)
        old.module.graphs = None  # the old stage's captures hold device memory: free them now
        self.injector.attach_clock(self.runtime.clock, lambda: self.runtime.last_timing)
        self.owned = owned  # the new runtime holds the new optimizer and scheduler
        self.partition, self.segment = new, self.segment + 1
        sent_bytes = sum(payload_size_bytes(payload) for payload in outgoing.values())
        # the change's time and bytes on every rank, and the processes that took it (the same ones train on)
        totals: list[Any] = [None] * self.world_size
        dist.all_gather_object(totals, (time.perf_counter() - started, sent_bytes, os.getpid()))
        if self.rank == 0:
            self.events.append("live_replan", segment=self.segment, step=self.step, partition=new.to_dict(),
                               seconds=max(t for t, _, _ in totals), moved_blocks=len(moves),
                               moved_bytes=sum(b for _, b, _ in totals), pids=[pid for _, _, pid in totals])
        replicas = f" of each of {new.replicas} replicas" if new.replicas > 1 else ""
        self.log(f"live re-partition at step {self.step}: {len(moves)} student blocks moved, now teacher "
                 f"{list(new.teacher_counts)} / student {list(new.student_counts)}{replicas}")
        return True

    @staticmethod
    def _try(work: Callable[[], Any]) -> tuple[Any, str | None]:
        try:
            return work(), None
        except Exception as exc:  # noqa: BLE001 - any failure here is answered by the restart path
            return None, f"{type(exc).__name__}: {exc}"

    def _agree(self, outcome: tuple[Any, str | None], new: Placement, doing: str,
               failed_event: str = "live_replan_failed") -> Any:
        """The result if every rank succeeded; None (and one ``failed_event``) if any failed."""
        result, error = outcome
        errors: list[Any] = [None] * self.world_size
        self.runtime.mark("sync")
        dist.all_gather_object(errors, error)
        failed = {rank: e for rank, e in enumerate(errors) if e is not None}
        if not failed:
            return result
        if self.rank == 0:
            self.events.append(failed_event, segment=self.segment, step=self.step, partition=new.to_dict(),
                               phase=doing, errors={str(r): e for r, e in failed.items()}, fallback="restart")
        self.log(f"live change at step {self.step} failed on rank(s) {sorted(failed)} while {doing} "
                 f"({next(iter(failed.values()))}); falling back to a checkpoint and restart")
        return None

    def _prepare_moves(self, new: Placement):
        """Which blocks move, this rank's optimizer state by name, and the payload of each block it gives away."""
        self.injector.on("repartition", self.step)
        moves = student_moves(self.partition, new)
        params = {n: t for n, t in self.owned.items() if isinstance(t, torch.nn.Parameter)}
        optim_state = optimizer_state_by_name(self.optimizer, params)
        outgoing = {}
        for move in (m for m in moves if m.source == self.rank):
            names = self.blocks.student_names[move.block].values()
            # References, not copies: nothing trains between here and the transfer.
            outgoing[move.block] = {"tensors": {n: self.owned[n].detach() for n in names},
                                    "optim": {n: optim_state[n] for n in names if n in optim_state}}
        return moves, optim_state, outgoing

    def _assemble_stage(self, new: Placement, received: dict[int, dict[str, Any]], optim_state: dict):
        """This rank's stage, tensors, optimizer and scheduler on ``new``, the old ones untouched.

        Received tensors land in blocks this rank did not own (their copies here are stale and
        unused), and the optimizer state is a by-name copy, so until the caller swaps, the old
        stage trains exactly as before.
        """
        if new.replicas > 1:  # the new shares must cut the batch in whole micro-batches: raised here, agreed on
            new.share_range(new.replica_of(self.rank), self.images_per_step, self.runtime.microbatches)
        module, owned = self.blocks.stage(self.rank, new, self.setup)
        optim_state = dict(optim_state)
        with torch.no_grad():
            for payload in received.values():
                for name, tensor in payload["tensors"].items():
                    owned[name].copy_(tensor)
                optim_state.update(payload["optim"])
        optimizer = build_optimizer(module.student.parameters(), self.optim)
        params = {n: t for n, t in owned.items() if isinstance(t, torch.nn.Parameter)}
        load_optimizer_state_by_name(optimizer, params, optim_state)
        scheduler = build_scheduler(optimizer, self.optim, self.total_steps)
        scheduler.load_state_dict(self.scheduler.state_dict())
        return module, owned, optimizer, scheduler

@dataclass
class PipelineEvaluation:
    """Forward-only pipeline over the validation split, batches padded to the training shape; the
    result lands on the last rank (the others get None). Reads the runner's current stage at each
    call: a live re-partition changes it. With replicas each replica evaluates every R-th batch, each of
    an equal share's size (``Placement.evaluation_batch``), and their last ranks add up the counts (one
    all-reduce)."""

    runner: PipelineRunner
    val_ds: Any
    batch_size: int
    num_workers: int

    def __call__(self) -> dict[str, float] | None:
        hits = {"student": {1: 0, 5: 0}, "teacher": {1: 0, 5: 0}}
        seen = 0
        load = "images" if self.runner.needs_images else "labels"  # images enter at rank 0 only
        replicas = self.runner.runtime.replicas
        batch = self.batch_size if replicas is None else replicas.evaluation_batch
        shard = (0, 1) if replicas is None else replicas.evaluation_shard
        for images, labels in eval_batches(self.val_ds, batch, self.num_workers, self.runner.device, load, shard):
            real = labels.shape[0]
            if real < batch and images is not None:  # the schedule's buffers have the training micro-batch shape
                images = torch.cat([images, images[-1:].expand(batch - real, *images.shape[1:])])
            out = self.runner.runtime.forward_only(images)
            if out is None:
                continue
            labels = labels.to(out[0].device)
            for name, logits in zip(("teacher", "student"), out):
                for k, n in topk_correct(logits[:real].float(), labels).items():
                    hits[name][k] += n
            seen += real
        if replicas is not None and self.runner.runtime.is_last:
            counts = [hits["student"][1], hits["student"][5], hits["teacher"][1], hits["teacher"][5], seen]
            (hits["student"][1], hits["student"][5], hits["teacher"][1], hits["teacher"][5],
             seen) = (int(v) for v in replicas.add_up(counts, self.runner.setup.wire))
        if not self.runner.writes_records:
            return None
        result = {f"top{k}": 100.0 * hits["student"][k] / seen for k in (1, 5)}
        result.update({f"teacher_top{k}": 100.0 * hits["teacher"][k] / seen for k in (1, 5)})
        return result


def build_pipeline_trainer(cfg: SynapseConfig, run_dir: Path, rank: int, world_size: int, partition: Placement,
                           teacher_weights: str, setup: ComputeSetup, log: Callable[[str], None] = print,
                           segment: int = 0, microbatches: int | None = None,
                           replica_group: ReplicaGroupSpec | None = None) -> Trainer[PipelineRunner]:
    """The shared training loop composed for pipeline rank ``rank`` of ``world_size``; ``microbatches``:
    the run's plan (None: pipeline.microbatches, which must then be a count). ``replica_group``: this launch
    is one replica of several under torchft (``partition`` is its pipeline)."""
    count = microbatches or cfg.pipeline.microbatches
    if isinstance(count, str):  # validation leaves a count or "auto", and an auto run's plan holds the count
        raise ValueError(f"pipeline.microbatches={count!r}: build_pipeline_trainer needs the planned count "
                         f"(microbatches=)")
    if world_size != partition.world_size:
        stages = [partition.stages_in(r) for r in range(partition.replicas)]
        raise ValueError(f"{world_size} ranks for a placement of {partition.world_size} "
                         f"({partition.replicas} replicas of {stages} stages)")
    stage = partition.stage_of(rank)
    # Under torchft a rank's files, faults and events go by its rank in the run (replica after replica)
    run_rank, run_world = rank, world_size
    if replica_group is not None:
        run_rank, run_world = replica_group.replica * world_size + rank, replica_group.replicas * world_size
    events = EventLog(events_path(run_dir), source="worker", rank=run_rank)
    mesh = ReplicaMesh.build(partition, rank, cfg.data.batch_size, count) if partition.replicas > 1 else None
    parts = build_run_parts(cfg, cfg.student.name, cfg.student.init)
    blocks = build_all_blocks(cfg.teacher, partition, teacher_weights, parts)
    module, owned = blocks.stage(rank, partition, setup)
    # After the models are built: from its Manager's start the lighthouse counts this replica in, and the
    # others' quorums wait for it (torchft's join timeout)
    quorum = None if replica_group is None else QuorumReplicas(replica_group, stage, world_size, cfg.data.batch_size,
                                                               count, events.append, run_key(run_dir), log)
    replicas: ReplicaReduction | None = quorum or mesh
    optimizer = build_optimizer(module.student.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, parts.total_steps)
    kd = kd_params(cfg.kd)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    faults = cfg.injection.faults
    if replica_group is not None and respawned():
        faults = faults_not_fired(faults, read_jsonl(events_path(run_dir)))
    injector = build_fault_injector(faults, run_rank, run_world, run_dir, setup.device, local_rank)
    runtime = PipelineRuntime(module, stage, partition.stages_of_rank(rank), setup, count,
                              cfg.pipeline.schedule,
                              lambda s, t, y: training_loss(s, t, y, kd), optimizer, scheduler, injector,
                              replicas=replicas,
                              nonfinite=cfg.trainer.nonfinite, board=ProgressBoard(progress_path(run_dir, run_rank)),
                              cuda_graphs=cfg.pipeline.cuda_graphs,
                              check_late=checks_loss_late(cfg.trainer.nonfinite_check, cfg.trainer.nonfinite,
                                                          setup.device),
                              read_timing_late=reads_timing_late(cfg.pipeline.timing_read, setup.device),
                              compiler=cfg.pipeline.compiler)
    injector.attach_clock(runtime.clock, lambda: runtime.last_timing)
    last = rank == world_size - 1 and (replica_group is None or replica_group.replica == 0)
    control = open_channel(run_dir, control_endpoint(cfg.trainer, cfg.failover), cfg.trainer.rdzv_timeout_s,
                           launch=segment, refused=Refusals(run_dir, source=f"rank {rank}", log=log))
    runner = PipelineRunner(cfg.pipeline, cfg.optim, cfg.trainer, cfg.data.batch_size, run_dir, setup, runtime, rank,
                            world_size, owned, partition, blocks, injector,
                            Heartbeat(run_dir, run_rank, str(setup.device)), events, control,
                            JsonlWriter(PERFORMANCE.path(run_dir)) if last else NullWriter(), parts.total_steps,
                            segment=segment, log=log,
                            control_group=None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo"),
                            quorum=quorum)
    if quorum is not None:
        quorum.register_state(lambda: replica_state(runner), lambda state: load_replica_state(runner, state))

    def saved(step: int, path: Path, seconds: float, stall: float, context: dict) -> None:
        events.append("checkpoint_saved", step=step, path=str(path), seconds=seconds, stall_s=stall, **context)

    checkpointer = (Checkpointer if quorum is None else partial(FirstParticipantCheckpointer, quorum))(
        CHECKPOINTS.path(run_dir), cfg.checkpoint.keep, cfg.student.name, ProcessGroupShards(runner), injector,
        on_saved=saved, mark=lambda phase: runner.runtime.mark(phase), asynchronous=cfg.checkpoint.async_save,
        device=setup.device, save_context=lambda: {"segment": runner.segment, "for_stop": runner.stop_requested})
    evaluation = PipelineEvaluation(runner, parts.val_ds, cfg.data.batch_size, loader_workers(cfg.data))
    return Trainer(loop_settings(cfg, run_world), run_dir, runner, checkpointer, evaluation, parts.train_ds,
                   parts.val_ds, parts.sampler, parts.total_steps, parts.num_epochs, injector, events, log=log,
                   mark=lambda phase: runner.runtime.mark(phase))


def replica_state(runner: PipelineRunner) -> dict[str, Any]:
    """What a returning replica's rank receives from the same stage of a peer (torchft's heal): the stage's
    tensors and optimizer state by name, and the schedule; copies, so the peer's next update cannot reach them."""
    params = {n: t for n, t in runner.owned.items() if isinstance(t, torch.nn.Parameter)}
    return {"tensors": {n: t.detach().clone() for n, t in runner.owned.items()},
            "optimizer": optimizer_state_by_name(runner.optimizer, params),
            "scheduler": runner.scheduler.state_dict()}


def load_replica_state(runner: PipelineRunner, state: dict[str, Any]) -> None:
    with torch.no_grad():
        for name, tensor in state["tensors"].items():
            runner.owned[name].copy_(tensor)
    params = {n: t for n, t in runner.owned.items() if isinstance(t, torch.nn.Parameter)}
    load_optimizer_state_by_name(runner.optimizer, params, state["optimizer"])
    runner.scheduler.load_state_dict(state["scheduler"])
