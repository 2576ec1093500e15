"""One rank's view of the pipelined KD step, on torch.distributed.pipelining.

``PipelineRuntime`` wraps a ``FusedStage`` in a ``PipelineStage`` and a GPipe/1F1B schedule.
``train_step`` runs one optimizer step over M micro-batches: the schedule accumulates
gradients over all M (zeroed once per step, divided once by M, exactly like the
single-device reference), then the optimizer and learning-rate schedule step, unless the
loss (on the last rank) is NaN or infinite: ``trainer.nonfinite=stop`` makes the last rank
raise before its update (on CUDA a step late, as the single-device trainer does: no host
sync inside the step, still before any checkpoint), ``skip`` gives every rank the loss (one
all-reduce) so that all of them drop the step together. Per step the clock records this
rank's teacher-forward, student-forward, loss, student-backward and optimizer time; the rest
of the step's wall time is waiting on communication (on CUDA reported a step late: see
`synapse.pipeline.clock`).

Every phase the rank enters (forward, backward, optimizer, ... or a wait on its peers: recv,
send, sync) is written to its ``ProgressBoard``, a few bytes of a shared file mapping (a
memory store, no system call). When the watchdog finds the pipeline stalled, every rank has
stopped; the board tells the one stuck in its own work from those waiting for it.
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from synapse.engine import ComputeSetup, NonFiniteGuard, ensure_training
from synapse.injection import PHASES, FaultInjector
from synapse.pipeline.clock import StageClock
from synapse.pipeline.graphs import StageGraphs, slots_for
from synapse.pipeline.replicas import ReplicaReduction
from synapse.pipeline.stage import FusedStage
from synapse.pipeline.wire import ThroughHost
from synapse.rundir import PROGRESS_BOARD

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
# Phases in which a rank has handed its work over and waits on a peer (a stall there is a peer's).
# send_wait: a forward chunk is computed and the schedule waits for this rank's earlier sends.
WAIT_PHASES = ("recv", "send", "sync", "send_wait")
_PROGRESS = struct.Struct("<qqd24s")  # pid, step, wall time, phase


def progress_path(run_dir: Path | str, rank: int) -> Path:
    return PROGRESS_BOARD.path(run_dir, rank=rank)


class ProgressBoard:
    """Where this rank is now: (pid, step, time, phase), rewritten in place on every phase."""

    def __init__(self, path: Path | None = None):
        """``path`` None: a board that records nothing (tests, tools)."""
        self._map: mmap.mmap | None = None
        self._pid = os.getpid()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, _PROGRESS.size)
            self._map = mmap.mmap(fd, _PROGRESS.size)
        finally:
            os.close(fd)

    def mark(self, phase: str, step: int) -> None:
        if self._map is not None:
            self._map[:] = _PROGRESS.pack(self._pid, step, time.time(), phase.encode()[:24])


def read_progress(path: Path) -> dict[str, Any] | None:
    """A rank's last board entry ({pid, step, time, phase}), or None if it never wrote one."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if len(data) != _PROGRESS.size:
        return None
    pid, step, when, phase = _PROGRESS.unpack(data)
    if pid == 0:
        return None
    return {"pid": pid, "step": step, "time": when, "phase": phase.rstrip(b"\0").decode(errors="replace")}


class PhaseHook(Protocol):
    """Told each phase a stage enters; a send's with the bytes it carries (``PipelineRuntime._phase``)."""

    def __call__(self, phase: str, nbytes: int = 0) -> None: ...


class TimedPipelineStage(PipelineStage):
    """A PipelineStage whose backward passes are timed by the rank's clock and whose
    receives, sends and backward passes are reported to the runtime's phase hook."""

    clock: StageClock | None = None
    phase_hook: PhaseHook | None = None

    def _hook(self, phase: str, nbytes: int = 0) -> None:
        if self.phase_hook is not None:
            self.phase_hook(phase, nbytes) if nbytes else self.phase_hook(phase)

    def get_fwd_recv_ops(self, *args: Any, **kwargs: Any):
        self._hook("recv")  # the schedule waits on these right after: this rank now waits on a peer
        return super().get_fwd_recv_ops(*args, **kwargs)

    def get_bwd_recv_ops(self, *args: Any, **kwargs: Any):
        self._hook("recv")
        return super().get_bwd_recv_ops(*args, **kwargs)

    def get_fwd_send_ops(self, *args: Any, **kwargs: Any):
        return self._timed_send("send_fwd", super().get_fwd_send_ops, args, kwargs)

    def get_bwd_send_ops(self, *args: Any, **kwargs: Any):
        return self._timed_send("send_bwd", super().get_bwd_send_ops, args, kwargs)

    def _timed_send(self, part: str, make_ops: Callable, args: tuple, kwargs: dict):
        """This rank's own send work (the clock's ``send``): preparing its outgoing ops and whatever
        holds them back before the schedule posts them. The hook runs after the ops exist, with
        their size: a slow-link fault on this rank delays its sends here, in proportion to the
        bytes if it is bandwidth-like, without touching the schedule's logic."""
        with self.clock.interval(part) if self.clock is not None else nullcontext():
            ops = make_ops(*args, **kwargs)
            self._hook("send", sum(op.tensor.numel() * op.tensor.element_size() for op in ops))
        return ops

    def _shape_inference(self, *args: Any, **kwargs: Any):
        """Before torch 2.13, a stage learns its shapes by running its module once before the first
        step. That extra forward, in training mode, moves BatchNorm running statistics (a batch of
        zeros leaves the mean and shrinks the variance), so the run no longer learns what the
        single-device trainer learns. Buffers are put back as they were: shape inference is
        bookkeeping, not training. (Newer torch has no such method and never calls this.)"""
        buffers = [b for b in self.submod.buffers() if b.device.type != "meta"]
        saved = [b.detach().clone() for b in buffers]
        try:
            return super()._shape_inference(*args, **kwargs)  # type: ignore[misc]
        finally:
            with torch.no_grad():
                for buffer, value in zip(buffers, saved):
                    buffer.copy_(value)

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any):
        graphs = getattr(self.submod, "graphs", None)
        if graphs is not None:
            graphs.select(fwd_chunk_id)  # this micro-batch's captures (see pipeline.graphs)
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any):
        self._hook("backward")
        if self.clock is None:
            return super().backward_one_chunk(*args, **kwargs)
        with self.clock.interval("student_bwd"):
            return super().backward_one_chunk(*args, **kwargs)


class PipelineRuntime:
    def __init__(self, module: FusedStage, stage: int, num_stages: int, setup: ComputeSetup, microbatches: int,
                 schedule: str, loss_fn: Callable, optimizer: torch.optim.Optimizer, scheduler: Any,
                 injector: FaultInjector | None = None, replicas: ReplicaReduction | None = None,
                 nonfinite: str = "stop", board: ProgressBoard | None = None, cuda_graphs: bool = False,
                 check_late: bool = False, read_timing_late: bool | None = None, compiler: str = "none"):
        """Stage ``stage`` of a ``num_stages``-stage pipeline. ``replicas``: this rank's place among the
        run's replicas (None: the launch is one pipeline on the default group).
        ``check_late``: the last rank does not read the loss in the step (no host sync there);
        the trainer's reading of it a step later checks it (`NonFiniteGuard`'s ``late``).
        ``read_timing_late``: the clock reports each step at the end of the next (default: on CUDA).
        ``compiler``: torch.compile's backend for the stage's blocks ("none": as written)."""
        self.module, self.stage_index, self.num_stages = module, stage, num_stages
        self.setup, self.microbatches, self.replicas = setup, microbatches, replicas
        group = replicas.pipeline_group if replicas is not None else None
        self.optimizer, self.scheduler = optimizer, scheduler
        self.clock = StageClock(setup.device, read_timing_late)
        module.clock = self.clock
        self.loss_fn = loss_fn
        self.guard = NonFiniteGuard(nonfinite, module.student, late=check_late)
        self.board = board or ProgressBoard()
        # What pipelining drives: the stage itself, or (ranks sharing a GPU) the stage behind a host boundary
        staged: torch.nn.Module = (module if setup.wire == setup.device
                                   else ThroughHost(module, setup.device, stage < num_stages - 1))
        self._new_stage = partial(TimedPipelineStage, staged, stage, num_stages, setup.wire, group=group)
        self.injector = injector or FaultInjector([], stage)
        self.current_step = 0
        module.phase_hook = self._phase
        module.register_forward_hook(self._corrupt_output)
        module.register_forward_hook(self._computed)
        if compiler != "none":  # before any forward: pipelining's shape inference runs the compiled blocks
            module.compile_blocks(compiler)
        # Compiled blocks are not captured: graph replays of their kernels were not measured to pay, and a
        # capture would compile the backward inside the capture. Replicas are: their gradients are
        # reduced from .grad after the schedule's last backward, which a replayed backward fills as an
        # eager one does (DDP's per-parameter hooks, which a replay bypasses, are not used). Not under torchft
        # (a replica's share, ``replicas.share`` None, is cut anew each step: no fixed shapes to capture).
        fixed_shapes = replicas is None or replicas.share is not None
        if cuda_graphs and setup.device.type == "cuda" and compiler == "none" and fixed_shapes:
            module.graphs = StageGraphs(module, slots_for(schedule, microbatches, stage, num_stages))
        self._schedule_name = schedule
        self.stage, self.schedule = self._training_pipeline()
        # the images a step of that stage takes (None until a share is first given: torchft's quorum cuts it)
        self._stage_images = len(replicas.share) if replicas is not None and replicas.share is not None else None
        self._pipelines: dict[int, tuple[TimedPipelineStage, Any]] = {}  # the other sizes' stages (use_share)
        # Evaluation gets its own stage and a loss-free GPipe schedule: forward only on every
        # torch version, without disturbing the training schedule's state.
        self._eval_stage = self._new_stage()
        self._eval_stage.phase_hook = self._phase
        self._eval_schedule = ScheduleGPipe(self._eval_stage, microbatches)
        self.last_timing: dict[str, float] | None = None  # the clock's latest report (StageClock.end_step)

    def reshare(self, replicas: ReplicaReduction) -> None:
        """A live REBALANCE: from the next step this rank's replica trains on another share of the batch
        (``use_share``), with another gradient weight (``replicas``). Graph captures of the old shapes are
        freed, as a live REPLAN frees them: a slot holds a few shapes, and a run may rebalance more often."""
        if replicas.share is None:
            raise ValueError("a live rebalance gives every replica a fixed share of the batch")
        self.replicas = replicas
        if self.module.graphs is not None:
            self.module.graphs = StageGraphs(self.module, len(self.module.graphs.slots))
        self.use_share(len(replicas.share))

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    @property
    def skipped(self) -> bool:
        """Whether the last step's update was dropped (non-finite loss, trainer.nonfinite=skip)."""
        return self.guard.skipped

    def mark(self, phase: str) -> None:
        """Record on the progress board that this rank entered ``phase`` of the current step."""
        self.board.mark(phase, self.current_step)

    def _phase(self, phase: str, nbytes: int = 0) -> None:
        # A wait is marked once the injector let the rank go: a hang or delay in the hook is this
        # rank's own (it has not handed its work over yet), not a wait on a peer.
        if phase not in WAIT_PHASES:
            self.mark(phase)
        elif phase in PHASES:
            self.mark(f"posting_{phase}")  # still its own work until the injector lets it go
        if phase in PHASES:
            self.injector.on(phase, self.current_step, nbytes=nbytes)
        if phase in WAIT_PHASES:
            self.mark(phase)

    def _computed(self, module: FusedStage, inputs: Any, output: Any) -> None:
        # The forward is computed; what follows until the next hook only waits on peers: 1F1B's
        # warmup waits for this rank's previous sends, and the first step's stage set-up (which
        # runs the forward once) exchanges metadata. Without this mark a rank held there read
        # "forward" like a peer hung in its forward, and the one that marked first was blamed.
        self.mark("send_wait")

    def _corrupt_output(self, module: FusedStage, inputs: Any, output: tuple[torch.Tensor, torch.Tensor]):
        """A fired ``nan_loss`` fault: this step's student output is NaN (as from a device computing garbage)."""
        if self.current_step >= 1 and self.injector.corrupts_output(self.current_step):
            teacher_out, student_out = output
            return teacher_out, student_out + float("nan")
        return None

    def _timed_loss(self, output: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        self.mark("loss")  # the last rank's own work again, after its chunk's send_wait mark
        with self.clock.interval("loss"):
            teacher_logits, student_logits = output
            return self.loss_fn(student_logits, teacher_logits, target)

    def _training_pipeline(self) -> tuple[TimedPipelineStage, Any]:
        """A training stage of this rank's module, and its schedule."""
        stage = self._new_stage()
        stage.clock, stage.phase_hook = self.clock, self._phase
        return stage, SCHEDULES[self._schedule_name](stage, self.microbatches, loss_fn=self._timed_loss,
                                                     scale_grads=True)

    def use_share(self, images: int) -> None:
        """The next step trains on ``images`` images: under torchft the quorum cuts each step's batch anew, a
        live REBALANCE changes a replica's share. A pipelining stage keeps the micro-batch shapes of its first
        step (its receive buffers: a survivor's doubled share met them as gloo's "Received data size doesn't
        match expected size" and aborted), so each share size gets a stage and schedule of its own, made on
        the step it first comes and kept (every stage of a replica meets a new size on the same step)."""
        if self._stage_images in (None, images):
            self._stage_images = images
            return
        self._pipelines[self._stage_images] = (self.stage, self.schedule)
        kept = self._pipelines.pop(images, None)
        self.stage, self.schedule = kept if kept is not None else self._training_pipeline()
        self._stage_images = images

    def train_step(self, images: torch.Tensor | None, labels: torch.Tensor | None, step: int) -> torch.Tensor | None:
        """Optimizer step ``step`` (1-based); returns the mean micro-batch loss on the last rank (detached).

        Raises ``NonFiniteLossError`` on the last rank, before its update, when the loss is not
        finite and trainer.nonfinite=stop (with a late guard: when the trainer reads it, after
        the update, before any checkpoint; the other ranks fail on losing this one before a
        checkpoint commits).
        """
        self.current_step = step
        self.clock.begin_step(step)
        ensure_training(self.module)
        if self.replicas is not None:
            self.replicas.remember_statistics(self.module.student)
        self.guard.begin()
        args = (self.setup.prepare_input(images),) if self.is_first else ()
        kwargs: dict[str, Any] = {}
        losses: list[torch.Tensor] = []
        if self.is_last:
            if labels is None:
                raise ValueError(f"step {step}: the last pipeline rank computes the loss, and was given no labels")
            kwargs = {"target": labels.to(self.setup.device, non_blocking=True), "losses": losses}
        # The schedule starts by waiting on peers (in the first step, inside the stages' set-up,
        # before any hook); its own compute marks itself. Without this a rank held there still read
        # step_start, its own work, and could be blamed for a peer hung in its first forward.
        self.mark("sync")
        # A capture cannot use autocast's cast cache (each replay casts the weights it reads anew).
        with self.setup.autocast(cache=self.module.graphs is None):
            self.schedule.step(*args, **kwargs)
        loss = torch.stack([loss.detach() for loss in losses]).mean() if self.is_last else None
        if self.replicas is not None:
            self.mark("sync")  # every owner of a block waits for the others' gradients
            loss = self.replicas.reduce_step(self.module.student, loss, self.microbatches)  # the global batch's loss
        if self.guard.late or self.guard.apply_update(step, self._decisive_loss(loss)):
            self._phase("optimizer")
            with self.clock.interval("optimizer"):
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                if self.replicas is not None:
                    self.replicas.after_update(self.module.student, self.microbatches)
        else:
            self.guard.skip(self.optimizer, self.scheduler)
        self.last_timing = self.clock.end_step()
        return loss

    def _decisive_loss(self, loss: torch.Tensor | None) -> float:
        """The loss this rank decides its update on.

        Skipping needs every rank to agree: one all-reduce over the launch where the last rank adds
        the loss and the others 0 (a NaN stays NaN, an inf stays inf; with replicas every replica's
        last rank already holds the global batch's loss, so one of them adds it). Stopping does not:
        the last rank raises
        alone, and the others fail on losing it at the step's all-gather, before any checkpoint
        (a commit needs every rank), so the default path pays no extra collective.
        """
        if self.guard.policy != "skip":
            return 0.0 if loss is None else float(loss)
        value = torch.zeros(1, device=self.setup.wire)
        if loss is not None and (self.replicas is None or self.replicas.replica == 0):
            value += loss.float().to(value.device)
        self.mark("sync")
        dist.all_reduce(value)
        return float(value)

    def forward_only(self, images: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Forward pass without backward (evaluation); the last rank gets (teacher, student) logits."""
        self.current_step = -1  # no fault fires during evaluation
        self.module.eval()
        args = (self.setup.prepare_input(images),) if self.is_first else ()
        with self.setup.autocast():
            output = self._eval_schedule.step(*args)
        self.module.train()
        return output if self.is_last else None
