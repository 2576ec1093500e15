"""One optimizer step of the single-device trainer: M micro-batches, accumulated, then applied.

This is the reference the pipeline runtime must reproduce exactly: same micro-batch split
(``torch.tensor_split`` along the batch, as torch.distributed.pipelining does), losses
back-propagated per micro-batch, gradients summed and divided once by M, then one optimizer
and scheduler step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kd import KDLossParams, kd_loss
from .device import ComputeSetup
from .optim import scale_gradients


def training_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, labels: torch.Tensor,
                  kd: KDLossParams) -> torch.Tensor:
    """KD loss when a teacher is present, plain cross-entropy otherwise (teacher/baseline training)."""
    if teacher_logits is None:
        return F.cross_entropy(student_logits.float(), labels)
    return kd_loss(student_logits, teacher_logits, labels, kd)


class SingleDeviceStep:
    def __init__(self, student: nn.Module, teacher: nn.Module | None, optimizer: torch.optim.Optimizer,
                 scheduler, microbatches: int, kd: KDLossParams, setup: ComputeSetup):
        self.student, self.teacher = student, teacher
        self.optimizer, self.scheduler = optimizer, scheduler
        self.microbatches, self.kd, self.setup = microbatches, kd, setup
        self._params = [p for p in student.parameters() if p.requires_grad]

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Run one step; returns the mean micro-batch loss as a detached tensor (no host sync)."""
        images = self.setup.prepare_input(images)
        labels = labels.to(self.setup.device, non_blocking=True)
        self.student.train()
        total = torch.zeros((), device=self.setup.device)
        for x, y in zip(torch.tensor_split(images, self.microbatches), torch.tensor_split(labels, self.microbatches)):
            with self.setup.autocast():
                teacher_logits = self._teacher_forward(x)
                loss = training_loss(self.student(x), teacher_logits, y, self.kd)
            loss.backward()
            total += loss.detach()
        scale_gradients(self._params, self.microbatches)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total / self.microbatches

    def _teacher_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.teacher is None:
            return None
        with torch.no_grad():
            return self.teacher(x)
