"""Sweeps over a model's blocks: one that measures sizes, then timed ones, run as a training step.

A timed sweep runs the blocks one after the other on one continuous stream of work, as the
model (or a pipeline stage) runs them, and marks the time at every block boundary: forward,
a mark after each block; backward (student), a mark when the gradient of each boundary
activation is ready (a tensor hook registered as the activation is made, so an in-place op
in the next block cannot move it). A block's time is the gap between its two marks: its
marginal cost in the stream. Timing each block alone instead adds, per block, the GPU's tail
latency, an autograd engine start and the harness's host time: on an H200 at micro-batch
16-32, where the GPU mostly waits on the host, that put the sum of the blocks 15-40%
(forward) and 30-50% (backward) above the whole model. With marks, one autocast region around
all blocks and CUDA events created ahead, the sum is within 2-7% of the whole in most
profiles. The whole model is then timed once in the same sweep, as the yardstick for the sum.

Each time is the median over sweeps (see ``profiler``): on a host whose speed drifts over
seconds, a slow spell costs one sample of every block and of the whole model alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import chain

import torch
from torch import nn

from synapse.profiling.context import MeasureContext, forward_call, loss_gradient
from synapse.profiling.measure import MarkTimer, SavedTensorBytes, peak_extra_cuda_bytes, storage_keys, tensor_bytes
from synapse.profiling.request import ProfileRequest, ProfilerError

_END = "end"


@dataclass(frozen=True)
class BlockSizes:
    input_bytes: int
    output_bytes: int
    accum_bytes: int
    parameter_bytes: int


@dataclass(frozen=True)
class SweepTimes:
    """One sample per block (backward 0 for the teacher) and one of the whole model."""

    forward_ms: list[float]
    backward_ms: list[float]
    whole_forward_ms: float
    whole_backward_ms: float


def parameter_bytes(module: nn.Module) -> int:
    return sum(tensor_bytes(p) for p in module.parameters())


def block_failed(request: ProfileRequest, index: int, block: nn.Module, error: Exception) -> ProfilerError:
    """A block that cannot run at this size (BatchNorm on one value per channel, out of memory)."""
    return ProfilerError(
        f"{request.model_name} ({request.role}) block {index} ({type(block).__name__}) failed at "
        f"micro_batch={request.micro_batch}, image_size={request.image_size}: {error}; try another "
        f"micro-batch or image size")


def size_sweep(model: nn.Module, blocks: list[nn.Module], images: torch.Tensor,
               context: MeasureContext) -> list[BlockSizes]:
    """Boundary sizes and the memory each block keeps: for the student the bytes autograd saves
    (parameters and buffers excluded), for the teacher (nothing saved) its peak extra CUDA memory,
    or on CPU, where there is no allocator to ask, its output size."""
    exclude = storage_keys(chain(model.parameters(), model.buffers()))
    sizes, x = [], images
    with torch.set_grad_enabled(not context.request.is_teacher):
        for index, block in enumerate(blocks):
            input_bytes = tensor_bytes(x)  # before the block: an in-place block changes x, not its size
            try:
                y, accum = _run_measuring_memory(block, x, context, exclude)
            except (RuntimeError, ValueError) as error:
                raise block_failed(context.request, index, block, error) from error
            sizes.append(BlockSizes(input_bytes, tensor_bytes(y), accum, parameter_bytes(block)))
            x = y
    return sizes


def _run_measuring_memory(block: nn.Module, x: torch.Tensor, context: MeasureContext,
                          exclude: set[tuple[str, int]]) -> tuple[torch.Tensor, int]:
    if not context.request.is_teacher:
        with SavedTensorBytes(exclude) as saved:
            y = forward_call(block, context.setup, x)
        return y, saved.total
    if context.device.type == "cuda":
        return peak_extra_cuda_bytes(lambda inp: forward_call(block, context.setup, inp), x, context.device)
    y = forward_call(block, context.setup, x)
    return y, tensor_bytes(y)


def timed_sweep(model: nn.Module, blocks: list[nn.Module], images: torch.Tensor,
                context: MeasureContext) -> SweepTimes:
    timer = MarkTimer(context.device)
    timer.reserve(2 * len(blocks) + 3)
    with torch.set_grad_enabled(not context.request.is_teacher):
        # One autocast region around all blocks, as around a stage: entering and leaving it per
        # block costs tens of microseconds of host time, which a host-bound GPU would show.
        with context.setup.autocast():
            output = _forward_blocks(blocks, images, context, timer)
        if output.requires_grad:
            timer.mark(("backward", len(blocks)))
            torch.autograd.backward(output, loss_gradient(output))
            timer.mark(("backward", _END))
        del output
        whole_forward, whole_backward = _whole_model(model, images, context)
    forward = [timer.elapsed_ms(("forward", i), ("forward", i + 1)) for i in range(len(blocks))]
    return SweepTimes(forward, _backward_times(timer, len(blocks)), whole_forward, whole_backward)


def _forward_blocks(blocks: list[nn.Module], images: torch.Tensor, context: MeasureContext,
                    timer: MarkTimer) -> torch.Tensor:
    """The blocks in order on one stream (the caller holds the autocast region), marked between."""
    x, last = images, len(blocks) - 1
    timer.mark(("forward", 0))
    for index, block in enumerate(blocks):
        previous, previous_version = x, x._version
        try:
            x = block(x)
        except (RuntimeError, ValueError) as error:
            raise block_failed(context.request, index, block, error) from error
        if index < last and x.requires_grad:
            unchanged = x is previous and x._version == previous_version
            _mark_boundary_gradient(timer, index + 1, x, unchanged)
        timer.mark(("forward", index + 1))
    return x


def _mark_boundary_gradient(timer: MarkTimer, boundary: int, x: torch.Tensor, unchanged: bool) -> None:
    """Mark when the gradient of block ``boundary``'s input is complete: that block's backward is done."""
    if unchanged:
        # An identity block (dropout with p=0) hands on its input: its two boundaries are one point.
        timer.alias(("backward", boundary), ("backward", boundary - 1))
    else:
        x.register_hook(partial(_mark_on_gradient, timer, ("backward", boundary)))


def _mark_on_gradient(timer: MarkTimer, key: tuple[str, int], grad: torch.Tensor) -> None:
    timer.mark(key)


def _backward_times(timer: MarkTimer, num_blocks: int) -> list[float]:
    """Block k's backward runs from the mark of its output's gradient to that of its input's; the
    first block whose input needs no gradient (the images) ends when backward returns."""
    times = [0.0] * num_blocks
    upper: tuple[str, int | str] = ("backward", num_blocks)  # a block index, then _END past the first block
    if not timer.has(upper):
        return times  # nothing to train
    for index in reversed(range(num_blocks)):
        lower = ("backward", index) if timer.has(("backward", index)) else ("backward", _END)
        times[index] = timer.elapsed_ms(upper, lower)
        if lower[1] == _END:
            break
        upper = lower
    return times


def _whole_model(model: nn.Module, images: torch.Tensor, context: MeasureContext) -> tuple[float, float]:
    """The model called as one module: the yardstick for the sum of the blocks."""
    timer = MarkTimer(context.device)
    timer.reserve(3)
    timer.mark("forward")
    logits = forward_call(model, context.setup, images)
    timer.mark("backward")
    if logits.requires_grad:
        torch.autograd.backward(logits, loss_gradient(logits))
    timer.mark(_END)
    backward_ms = timer.elapsed_ms("backward", _END) if logits.requires_grad else 0.0
    return timer.elapsed_ms("forward", "backward"), backward_ms
