"""Knowledge-distillation losses.

Soft-target KD (Hinton et al., 2015): KL(softmax(t/T) || softmax(s/T)) * T^2, mixed with the
hard-label cross-entropy: ``lambda_kd * KD + (1 - lambda_kd) * CE``. The T^2 factor keeps the
soft-target gradients on the same scale as the hard-label ones when T changes.
Logits KD (Ba & Caruana, 2014): mean squared error between the logits, mixed the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KD_MODES = ("st", "logits")


@dataclass(frozen=True)
class KDLossParams:
    mode: str = "st"
    T: float = 4.0
    lambda_kd: float = 0.9

    def __post_init__(self) -> None:
        if self.mode not in KD_MODES:
            raise ValueError(f"kd.mode={self.mode!r} is unknown; use one of {KD_MODES}")
        if not self.T > 0:
            raise ValueError(f"kd.T must be > 0 (a softmax temperature), got {self.T}")
        if not 0.0 <= self.lambda_kd <= 1.0:
            raise ValueError(f"kd.lambda_kd weighs KD against cross-entropy and must be in [0, 1], "
                             f"got {self.lambda_kd}")


def soft_target_kd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, T: float) -> torch.Tensor:
    """KL divergence of temperature-softened distributions, batch mean, times T^2."""
    log_p_student = F.log_softmax(student_logits.float() / T, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.float() / T, dim=-1)
    return F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * (T * T)


def logits_kd(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(student_logits.float(), teacher_logits.float())


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
            params: KDLossParams) -> torch.Tensor:
    """The training loss of the student: distillation term mixed with hard-label cross-entropy."""
    teacher_logits = teacher_logits.detach()
    if params.mode == "st":
        distill = soft_target_kd(student_logits, teacher_logits, params.T)
    else:
        distill = logits_kd(student_logits, teacher_logits)
    ce = F.cross_entropy(student_logits.float(), labels)
    return params.lambda_kd * distill + (1.0 - params.lambda_kd) * ce
