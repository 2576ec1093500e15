"""CUDA-graphed fused stages: capture a stage's teacher forward and student forward/backward once
per input shape, then replay them.

Why: at the micro-batch sizes a pipeline needs (16-32 images), a stage is launch bound; the
host cannot issue kernels as fast as the GPU runs them. A replayed graph issues a whole
forward (or backward) with one launch.

Why slots: a replay writes its outputs and its saved activations into the graph's own static
memory, so the next replay of the *same* graph overwrites them. Under 1F1B stage r holds up to
``K - r`` micro-batches between their forward and their backward (GPipe: all M), so each
in-flight micro-batch needs its own capture. A slot is a thin module that shares the stage's
blocks (the same parameters and buffers) and is captured on its own; micro-batch ``i`` runs in
slot ``i % slots``. The schedule waits on every send of micro-batch ``i`` before it starts the
forward of ``i + slots``, so nothing that still travels is overwritten.

What stays eager: evaluation (eval mode), a forward without autograd (shape inference), CPU
tensors, and any shape whose capture failed (logged once with the reason). BatchNorm running
statistics are put back after the capture's warm-up iterations, so a graphed step updates them
exactly once, as an eager one does.
(Gradients: see ``engine.graph_capture``.)
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from synapse.engine import ForwardReplay, TrainingReplay
from synapse.models import run_blocks
from synapse.pipeline.wire import attach_zero_grad, to_wire

log = logging.getLogger(__name__)

MAX_SHAPES = 4  # input signatures captured per slot; a run that keeps changing shape stays eager


def slots_for(schedule: str, microbatches: int, rank: int, world_size: int) -> int:
    """How many micro-batches of this stage can be between forward and backward at once."""
    if schedule == "1f1b":
        # torch's 1F1B runs min(M, K - r) forwards before its first backward, then one
        # backward before each further forward.
        return max(1, min(microbatches, world_size - rank))
    return microbatches  # GPipe: every forward before any backward


def _signature(*tensors: torch.Tensor) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.stride(), t.requires_grad) for t in tensors)


class _StudentSlot(nn.Module):
    """The student blocks of one stage, as one capturable module (shares their parameters)."""

    def __init__(self, blocks: nn.ModuleList, zero_grad_teacher_input: bool, channels_last_wire: bool):
        super().__init__()
        self.blocks = blocks
        self.zero_grad_teacher_input = zero_grad_teacher_input
        self.channels_last_wire = channels_last_wire

    def forward(self, student_in: torch.Tensor, *teacher_in: torch.Tensor) -> torch.Tensor:
        if student_in.requires_grad and student_in.is_leaf:
            student_in = student_in.clone()  # an in-place first block may not modify a leaf
        out = run_blocks(list(self.blocks), student_in)
        if self.zero_grad_teacher_input and teacher_in:
            out = attach_zero_grad(out, teacher_in[0])
        return to_wire(out, self.channels_last_wire)


# One in-flight slot's captures by input signature: the teacher's forward and the graphed student.
_Slot = dict[tuple, tuple[ForwardReplay, TrainingReplay]]


class StageGraphs:
    """Replays of one ``FusedStage``'s training forward (and, through autograd, its backward)."""

    def __init__(self, stage: nn.Module, slots: int):
        self.stage = stage
        self.slots: list[_Slot] = [{} for _ in range(max(1, slots))]
        self.slot = 0  # set by the pipeline stage before each forward (micro-batch index % slots)
        self.failed: set[tuple] = set()  # signatures whose capture failed: they run eagerly
        self.captures = 0

    def select(self, microbatch: int) -> None:
        self.slot = microbatch % len(self.slots)

    def applies(self, teacher_in: torch.Tensor, student_in: torch.Tensor) -> bool:
        return self.stage.training and torch.is_grad_enabled() and student_in.is_cuda

    def run(self, teacher_in: torch.Tensor, student_in: torch.Tensor, timed: Callable[[str], Any]
            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Both outputs from the replays, or None where this input runs eagerly."""
        signature = _signature(teacher_in, student_in)
        if signature in self.failed:
            return None
        slot = self.slots[self.slot]
        if signature not in slot and not self._capture(slot, signature, teacher_in, student_in):
            return None
        teacher, student = slot[signature]
        with timed("teacher_fwd"):
            teacher_out = teacher(teacher_in.detach())
        with timed("student_fwd"):
            extra = (teacher_in,) if self.stage.zero_grad_teacher_input and teacher_in.requires_grad else ()
            student_out = student(student_in, *extra)
        return teacher_out, student_out

    def _capture(self, slot: _Slot, signature: tuple, teacher_in: torch.Tensor, student_in: torch.Tensor) -> bool:
        if len(slot) >= MAX_SHAPES:
            self._give_up(signature, f"more than {MAX_SHAPES} input shapes")
            return False
        buffers = [b for b in self.stage.buffers()]
        saved = [b.detach().clone() for b in buffers]
        try:
            wire = self.stage.channels_last_wire
            teacher = ForwardReplay(lambda x: to_wire(run_blocks(list(self.stage.teacher), x), wire),
                                    teacher_in.detach())
            student = self._graphed_student(student_in, teacher_in)
        except Exception as exc:  # noqa: BLE001 - any capture failure leaves this shape eager
            self._give_up(signature, f"{type(exc).__name__}: {exc}")
            return False
        finally:
            with torch.no_grad():  # the warm-up iterations trained BatchNorm statistics: undo that
                for buffer, value in zip(buffers, saved):
                    buffer.copy_(value)
        slot[signature] = teacher, student
        self.captures += 1
        return True

    def _graphed_student(self, student_in: torch.Tensor, teacher_in: torch.Tensor) -> TrainingReplay:
        module = _StudentSlot(self.stage.student, self.stage.zero_grad_teacher_input, self.stage.channels_last_wire)
        sample: tuple[torch.Tensor, ...] = (student_in.detach().clone().requires_grad_(student_in.requires_grad),)
        if self.stage.zero_grad_teacher_input and teacher_in.requires_grad:
            sample += (teacher_in.detach().clone().requires_grad_(True),)
        return TrainingReplay(module, sample)

    def _give_up(self, signature: tuple, reason: str) -> None:
        self.failed.add(signature)
        log.warning("cuda graphs: a stage input of shape %s runs eagerly (%s)",
                    [list(s[0]) for s in signature], reason)
