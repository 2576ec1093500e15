"""One optimizer step of the single-device trainer: M micro-batches, accumulated, then applied.

This is the reference the pipeline runtime must reproduce exactly: same micro-batch split
(``torch.tensor_split`` along the batch, as torch.distributed.pipelining does), losses
back-propagated per micro-batch, gradients summed and divided once by M, then one optimizer
and scheduler step.

Both paths treat a NaN or infinite loss the same way (``NonFiniteGuard``), before the update:
``trainer.nonfinite=stop`` raises ``NonFiniteLossError`` naming the step, so nothing
non-finite reaches a checkpoint; ``skip`` drops the step's update (gradients
discarded, BatchNorm statistics restored) while the step still counts and the learning-rate
schedule advances, exactly as if the batch had been left out. On CUDA the single-device
trainer checks a step's loss a step late by default (``trainer.nonfinite_check``): still
before any checkpoint, without a host sync in the middle of every step.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synapse.config import NONFINITE_POLICIES
from synapse.engine.device import ComputeSetup
from synapse.engine.optim import scale_gradients
from synapse.kd import KDLossParams, kd_loss


class NonFiniteLossError(FloatingPointError):
    """A step's loss is NaN or infinite under ``trainer.nonfinite=stop``; raised before the update."""

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(
            f"step {step}: the loss is {loss} (trainer.nonfinite=stop); the run stops before any checkpoint "
            f"holds this step, so every checkpoint has only finite steps. Fix: set trainer.nonfinite=skip to drop "
            f"such steps and continue with resume=auto; or check the data and the teacher, and lower optim.lr (or "
            f"use optim.warmup_steps) in a new run (resume=null in a new run directory: a resumed run keeps the "
            f"learning settings of the run it continues)")


class NonFiniteGuard:
    """Decides, before the optimizer step, what a step with a non-finite loss does.

    ``begin`` (at the start of every step) keeps a copy of the module's buffers when steps may
    be skipped: a NaN that reached the forward pass has already poisoned BatchNorm's running
    statistics, and skipping the step must undo that too.

    ``late``: the step does not read its loss (no host sync there); whoever reads it later passes
    it to `check_read_loss`, which raises under stop. Only with stop: skipping must know before
    the update.
    """

    def __init__(self, policy: str, module: nn.Module, late: bool = False):
        if policy not in NONFINITE_POLICIES:
            raise ValueError(f"trainer.nonfinite={policy!r} is not a policy; use one of "
                             f"{', '.join(NONFINITE_POLICIES)}")
        if late and policy != "stop":
            raise ValueError(f"a late loss check cannot skip a step (trainer.nonfinite={policy!r}); "
                             "use trainer.nonfinite_check=at_step with skip")
        self.policy, self.module, self.late = policy, module, late
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.skipped = False  # whether the last step was skipped

    def begin(self) -> None:
        self.skipped = False
        if self.policy == "skip":
            self._saved = [(b, b.detach().clone()) for b in self.module.buffers()]

    def apply_update(self, step: int, loss: float) -> bool:
        """True: apply the step's update. False: skip it (policy skip). Raises under policy stop."""
        if math.isfinite(loss):
            return True
        if self.policy == "stop":
            raise NonFiniteLossError(step, loss)
        self.skipped = True
        return False

    def check_read_loss(self, step: int, loss: float) -> None:
        """Step ``step``'s loss, read after the step ran (``late``): raises `NonFiniteLossError` if
        it is not finite. The update is applied by then, in memory only: the reader checks before
        any checkpoint."""
        if self.late:
            self.apply_update(step, loss)

    def skip(self, optimizer: torch.optim.Optimizer, scheduler) -> None:
        """Drop the step's update: no optimizer step, buffers back as they were, the schedule advances."""
        with torch.no_grad():
            for buffer, saved in self._saved:
                buffer.copy_(saved)
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()


def training_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, labels: torch.Tensor,
                  kd: KDLossParams) -> torch.Tensor:
    """KD loss when a teacher is present, plain cross-entropy otherwise (teacher/baseline training)."""
    if teacher_logits is None:
        return F.cross_entropy(student_logits.float(), labels)
    return kd_loss(student_logits, teacher_logits, labels, kd)


def checks_loss_late(check: str, policy: str, device: torch.device) -> bool:
    """Whether ``trainer.nonfinite_check`` (auto, at_step, late) leaves the loss check to the
    trainer's reading of the loss a step later. auto: on CUDA under stop, where checking at the
    step is a host sync in the middle of every step (the GPU idles while the host issues the
    optimizer step and the next batch); skip must know before the update, and on the CPU the
    sync costs nothing."""
    if check == "auto":
        return policy == "stop" and device.type == "cuda"
    return check == "late"


def ensure_training(module: nn.Module) -> None:
    """Put ``module`` in training mode unless it already is (evaluation restores the mode it found).

    ``Module.train`` walks every submodule through ``__setattr__``: about 1 ms for ResNet-152 on a
    host shared with the loader's workers. On an H200 the step's host work is close to its GPU
    time, so calling it every step cost 2-4% of the step (experiments/gpu/probe_trainer_gap.py).
    """
    if not module.training:
        module.train()


class SingleDeviceStep:
    def __init__(self, student: nn.Module, teacher: nn.Module | None, optimizer: torch.optim.Optimizer,
                 scheduler, microbatches: int, kd: KDLossParams, setup: ComputeSetup, nonfinite: str = "stop",
                 check_late: bool = False):
        """``check_late``: do not read the loss here (no host sync); the caller passes it to
        ``guard.check_read_loss`` when it reads it (`NonFiniteGuard`'s ``late``)."""
        self.student, self.teacher = student, teacher
        self.optimizer, self.scheduler = optimizer, scheduler
        self.microbatches, self.kd, self.setup = microbatches, kd, setup
        self._params = [p for p in student.parameters() if p.requires_grad]
        self.guard = NonFiniteGuard(nonfinite, student, late=check_late)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int = 0,
                 corrupt: bool = False) -> torch.Tensor:
        """Run optimizer step ``step``; returns the mean micro-batch loss as a detached tensor.

        ``corrupt``: make the student's output NaN (an injected ``nan_loss`` fault). Reading the
        loss to check it is finite is the step's one host sync (none with ``check_late``).
        """
        images = self.setup.prepare_input(images)
        labels = labels.to(self.setup.device, non_blocking=True)
        ensure_training(self.student)
        self.guard.begin()
        if self.microbatches == 1:  # no split and no running sum: fewer launches from a busy host
            mean = self._microbatch_loss(images, labels, corrupt).float()
        else:
            total = torch.zeros((), device=self.setup.device)
            for x, y in zip(torch.tensor_split(images, self.microbatches),
                            torch.tensor_split(labels, self.microbatches)):
                total += self._microbatch_loss(x, y, corrupt)
            mean = total / self.microbatches
        if not self.guard.late and not self.guard.apply_update(step, float(mean)):
            self.guard.skip(self.optimizer, self.scheduler)
            return mean
        scale_gradients(self._params, self.microbatches)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return mean

    def _microbatch_loss(self, x: torch.Tensor, y: torch.Tensor, corrupt: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; its loss, detached."""
        with self.setup.autocast():
            teacher_logits = self._teacher_forward(x)
            student_logits = self.student(x)
            if corrupt:
                student_logits = student_logits + float("nan")
            loss = training_loss(student_logits, teacher_logits, y, self.kd)
        loss.backward()
        return loss.detach()

    @property
    def skipped(self) -> bool:
        return self.guard.skipped

    def _teacher_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.teacher is None:
            return None
        with torch.no_grad():
            return self.teacher(x)
