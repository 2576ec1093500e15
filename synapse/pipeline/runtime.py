"""One rank's view of the pipelined KD step, on torch.distributed.pipelining.

``PipelineRuntime`` wraps a ``FusedStage`` in a ``PipelineStage`` and a GPipe/1F1B schedule.
``train_step`` runs one optimizer step over M micro-batches: the schedule accumulates
gradients over all M (zeroed once per step, divided once by M, exactly like the
single-device reference), then the optimizer and learning-rate schedule step. Per step the
clock records this rank's teacher-forward, student-forward, loss, student-backward and
optimizer time; the rest of the step's wall time is waiting on communication.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ..engine.device import ComputeSetup
from ..monitor.injection import FaultInjector
from .clock import StageClock
from .stage import FusedStage

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


class TimedPipelineStage(PipelineStage):
    """A PipelineStage whose backward passes are timed by the rank's clock."""

    clock: StageClock | None = None
    phase_hook: Callable[[str], None] | None = None

    def get_fwd_send_ops(self, *args: Any, **kwargs: Any):
        # Sends are posted here: a hook at this point delays this rank's outgoing transfers
        # (communication slowdown injection) without touching the schedule's logic.
        if self.phase_hook is not None:
            self.phase_hook("send")
        return super().get_fwd_send_ops(*args, **kwargs)

    def get_bwd_send_ops(self, *args: Any, **kwargs: Any):
        if self.phase_hook is not None:
            self.phase_hook("send")
        return super().get_bwd_send_ops(*args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any):
        if self.phase_hook is not None:
            self.phase_hook("backward")
        if self.clock is None:
            return super().backward_one_chunk(*args, **kwargs)
        with self.clock.interval("student_bwd"):
            return super().backward_one_chunk(*args, **kwargs)


class PipelineRuntime:
    def __init__(self, module: FusedStage, rank: int, world_size: int, setup: ComputeSetup, microbatches: int,
                 schedule: str, loss_fn: Callable, optimizer: torch.optim.Optimizer, scheduler: Any,
                 injector: FaultInjector | None = None, group: dist.ProcessGroup | None = None):
        self.module, self.rank, self.world_size = module, rank, world_size
        self.setup, self.microbatches = setup, microbatches
        self.optimizer, self.scheduler = optimizer, scheduler
        self.clock = StageClock(setup.device)
        module.clock = self.clock
        self.loss_fn = loss_fn
        self.stage = TimedPipelineStage(module, rank, world_size, setup.device, group=group)
        self.stage.clock = self.clock
        self.injector = injector or FaultInjector([], rank)
        self.current_step = 0
        module.phase_hook = self.stage.phase_hook = self._phase
        self.schedule = SCHEDULES[schedule](self.stage, microbatches, loss_fn=self._timed_loss, scale_grads=True)
        # Evaluation gets its own stage and a loss-free GPipe schedule: forward only on every
        # torch version, without disturbing the training schedule's state.
        self._eval_stage = PipelineStage(module, rank, world_size, setup.device, group=group)
        self._eval_schedule = ScheduleGPipe(self._eval_stage, microbatches)
        self.last_timing: dict[str, float] = {}

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1

    def _phase(self, phase: str) -> None:
        self.injector.on(phase, self.current_step)

    def _timed_loss(self, output: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        with self.clock.interval("loss"):
            teacher_logits, student_logits = output
            return self.loss_fn(student_logits, teacher_logits, target)

    def train_step(self, images: torch.Tensor | None, labels: torch.Tensor | None, step: int) -> torch.Tensor | None:
        """Optimizer step ``step`` (1-based); returns the mean micro-batch loss on the last rank (detached)."""
        self.current_step = step
        self.clock.begin_step()
        self.module.train()
        args = (self.setup.prepare_input(images),) if self.is_first else ()
        kwargs: dict[str, Any] = {}
        losses: list[torch.Tensor] = []
        if self.is_last:
            kwargs = {"target": labels.to(self.setup.device, non_blocking=True), "losses": losses}
        with self.setup.autocast():
            self.schedule.step(*args, **kwargs)
        self._phase("optimizer")
        with self.clock.interval("optimizer"):
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.last_timing = self.clock.end_step()
        if not self.is_last:
            return None
        return torch.stack([loss.detach() for loss in losses]).mean()

    def forward_only(self, images: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Forward pass without backward (evaluation); the last rank gets (teacher, student) logits."""
        self.current_step = -1  # no fault fires during evaluation
        self.module.eval()
        args = (self.setup.prepare_input(images),) if self.is_first else ()
        with self.setup.autocast():
            output = self._eval_schedule.step(*args)
        self.module.train()
        return output if self.is_last else None
