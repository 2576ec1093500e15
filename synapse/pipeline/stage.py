"""A fused teacher+student stage: what one device runs in the TSPipe-style pipeline.

Stage r holds teacher blocks [a_r, a_{r+1}) and student blocks [b_r, b_{r+1}). Its forward
takes (teacher activation, student activation) from stage r-1, or the images on stage 0, and
returns both activations for stage r+1. The teacher runs under no_grad in eval mode; on the
last stage the two outputs are the logits, so the KD loss needs no extra communication.

Before torch 2.13 the no-grad teacher activation a stage receives must get a gradient (see
``pipeline.wire.attach_zero_grad``).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn

from synapse.models import run_blocks
from synapse.pipeline.wire import NO_GRAD_INPUTS_SUPPORTED, attach_zero_grad, from_wire, to_wire

if TYPE_CHECKING:  # for annotations only: the runtime sets these on the stage
    from synapse.pipeline.clock import StageClock
    from synapse.pipeline.graphs import StageGraphs

class FusedStage(nn.Module):
    """Teacher blocks (forward only) and student blocks (trained) of one pipeline stage."""

    def __init__(self, teacher_blocks: list[nn.Module], student_blocks: list[nn.Module], is_first: bool,
                 zero_grad_teacher_input: bool | None = None, channels_last_wire: bool = False):
        super().__init__()
        self.teacher = nn.ModuleList(teacher_blocks)
        self.student = nn.ModuleList(student_blocks)
        self.is_first = is_first
        self.channels_last_wire = channels_last_wire  # see pipeline.wire: on where the models run channels_last
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.teacher.eval()
        if zero_grad_teacher_input is None:
            zero_grad_teacher_input = not NO_GRAD_INPUTS_SUPPORTED
        self.zero_grad_teacher_input = zero_grad_teacher_input and not is_first
        self.clock: StageClock | None = None  # set by the runtime to time teacher and student forwards
        self.phase_hook: Callable[[str], None] | None = None  # set by the runtime: called with "forward" (faults)
        self.graphs: StageGraphs | None = None  # set by the runtime on CUDA: captured replays of the training forward

    def compile_blocks(self, backend: str) -> None:
        """torch.compile every block in place (``nn.Module.compile``: names, parameters and state dicts
        unchanged, so checkpoints and a live re-partition see the same blocks).

        Per block, not per stage: blocks of one shape share one compiled graph (ViT-L's 24 blocks
        compile once, ResNet-152's 50 bottlenecks a handful of times), and a re-partition that moves
        a block moves its compiled form with it. Shapes are static (a batch's shape never changes
        within a segment); a new shape or grad mode (evaluation) compiles once more, hence the limit.
        """
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4096)
        for block in (*self.teacher, *self.student):
            block.compile(backend=backend, dynamic=False)

    def train(self, mode: bool = True) -> FusedStage:
        super().train(mode)
        self.teacher.eval()  # the teacher is frozen: BatchNorm statistics and dropout stay in eval
        return self

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.phase_hook is not None:
            self.phase_hook("forward")
        if self.is_first:
            teacher_in = student_in = inputs[0]
        else:
            teacher_in, student_in = (from_wire(x, self.channels_last_wire) for x in inputs)
        if self.graphs is not None and self.graphs.applies(teacher_in, student_in):
            replayed = self.graphs.run(teacher_in, student_in, self._timed)
            if replayed is not None:
                return replayed
        return self._eager_forward(teacher_in, student_in)

    def _eager_forward(self, teacher_in: torch.Tensor, student_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_first:
            # The teacher runs first on the same tensor; a copy keeps an in-place first block
            # (an activation) from changing the student's input.
            teacher_in = teacher_in.clone()
        if student_in.requires_grad and student_in.is_leaf:
            # A received activation is a leaf; an in-place first block (ReLU(inplace=True))
            # may not modify a leaf that requires grad. The copy is exact and autograd-transparent.
            student_in = student_in.clone()
        with self._timed("teacher_fwd"), torch.no_grad():
            teacher_out = run_blocks(list(self.teacher), teacher_in.detach())
        with self._timed("student_fwd"):
            student_out = run_blocks(list(self.student), student_in)
        if self.zero_grad_teacher_input and teacher_in.requires_grad:
            student_out = attach_zero_grad(student_out, teacher_in)
        # Point-to-point sends need dense memory (pipeline.wire).
        return to_wire(teacher_out, self.channels_last_wire), to_wire(student_out, self.channels_last_wire)

    def _timed(self, name: str):
        return self.clock.interval(name) if self.clock is not None else nullcontext()
