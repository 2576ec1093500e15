"""Block times as a CUDA-graphed stage runs them: inside one whole-model graph, or block by block.

Why a second way to time blocks: the timed sweeps (``sweeps``) measure a block as an eager
stage runs it, which at small micro-batches is mostly the host issuing kernels (on an H200,
ViT-L/16 -> ResNet-152 stages at micro-batch 16-32 ran 2.5-3.5x their graphed time). A
graphed stage (``synapse.pipeline.graphs``) issues a whole pass with one launch, so its time
is what the GPU spends; a block's share of it is its own replay, timed by CUDA events around
that replay alone (one launch: the host is never the bottleneck).

First choice: ``in_graph``, every block timed by events recorded inside one captured pass
over the whole model, in the context a stage's graph runs it. Where this torch cannot record
timing events into a graph, or that capture fails (logged), each block is captured on its own
and its replay timed, as follows.

Per block: the teacher's forward (no grad) is captured with ``torch.cuda.graph``; the
student's forward and backward with ``engine.graph_capture.TrainingReplay``, and a sample is
the forward replay then the backward replay, each between two events. The whole model is
timed the same way, as the yardstick for the sum of its blocks. Each time is the median over
``repeats`` samples after ``warmup`` untimed ones.
"""
from __future__ import annotations

import copy
import gc
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from synapse.engine import ForwardReplay, TrainingReplay
from synapse.models import run_blocks
from synapse.profiling.context import MeasureContext, loss_gradient
from synapse.profiling.in_graph import in_graph_block_times

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphedTimes:
    forward_ms: list[float]
    backward_ms: list[float]
    whole_forward_ms: float
    whole_backward_ms: float
    method: str = "in_graph"  # 'in_graph' | 'block_replays': how the block times were taken


class _Chain(nn.Module):
    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and x.is_leaf:
            x = x.clone()  # as a stage does: an in-place first block (ReLU) may not modify a leaf
        return run_blocks(list(self.blocks), x)


def graphed_times(blocks: list[nn.Module], images: torch.Tensor, context: MeasureContext) -> GraphedTimes:
    """Every block's replayed forward (and backward, for the student), and the whole model's."""
    whole_fwd, whole_bwd = _retried(lambda: _time_replays(_Chain(blocks), images, context, input_grad=False))
    _release_graphs()
    try:
        forward, backward = _retried(lambda: in_graph_block_times(blocks, images, context))
        return GraphedTimes(forward, backward, whole_fwd, whole_bwd, "in_graph")
    except Exception as exc:  # noqa: BLE001 - the block-by-block replays below still measure it
        logger.info("%s: block times inside one graph failed (%s: %s); timing each block's own replay",
                    context.request.model_name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    finally:
        _release_graphs()
    inputs = _block_inputs(blocks, images, context)
    forward, backward = [], []
    for index, (block, x) in enumerate(zip(blocks, inputs)):
        fwd, bwd = _retried(partial(_time_block_replays, block, x, context, input_grad=index > 0))
        forward.append(fwd)
        backward.append(bwd)
        _release_graphs()
    return GraphedTimes(forward, backward, whole_fwd, whole_bwd, "block_replays")


def _time_block_replays(block: nn.Module, x: torch.Tensor, context: MeasureContext, input_grad: bool
                        ) -> tuple[float, float]:
    # a wrapper is captured, not the block: it copies a leaf input an in-place first block would modify
    return _time_replays(_Chain([block]), x, context, input_grad=input_grad)


def _retried(measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """``measure()``, once more if its capture failed: on an H200 (torch 2.11) the first capture of
    a backward GEMM (ResNet-50's last Linear, no GEMM captured before it) failed with
    CUBLAS_STATUS_EXECUTION_FAILED and the same capture right after succeeded; a second failure is real."""
    try:
        return measure()
    except RuntimeError as first:
        logger.info("capture failed (%s: %s); retrying once", type(first).__name__, str(first).splitlines()[0])
        _release_graphs()
        return measure()


def _release_graphs() -> None:
    # A graphed callable sits in reference cycles (autograd Functions closing over their graphs);
    # collected only now and then, the private memory pools of dozens of per-block graphs piled
    # up to an out-of-memory error on ResNet-152 at micro-batch 128 on an H200.
    gc.collect()
    torch.cuda.empty_cache()


def _block_inputs(blocks: list[nn.Module], images: torch.Tensor, context: MeasureContext) -> list[torch.Tensor]:
    """The tensor entering each block, from one eager forward (no grad)."""
    inputs, x = [], images
    with torch.no_grad(), context.setup.autocast():
        for block in blocks:
            inputs.append(x)
            x = block(x)
    return inputs


def _time_replays(module: nn.Module, x: torch.Tensor, context: MeasureContext, input_grad: bool
                  ) -> tuple[float, float]:
    """``input_grad``: whether the input gets a gradient (a received activation) or not (the images)."""
    request = context.request
    with context.setup.autocast(cache=False):  # a capture may not use autocast's cast cache
        if request.is_teacher:
            run = _teacher_replay(module, x)
            samples = [_timed(run) for _ in range(request.warmup + request.repeats)]
            return statistics.median(samples[request.warmup:]), 0.0
        # The replays are called with the captured sample itself: an input that needs no gradient
        # gives a parameter-free block (ReLU, max-pool) an output with no grad_fn to backward through.
        x = x.detach().clone().requires_grad_(input_grad)
        graphed = _student_replay(module, x)
        gradient = loss_gradient(graphed(x)).detach()
        samples = [_timed_forward_backward(graphed, x, gradient) for _ in range(request.warmup + request.repeats)]
    forward, backward = zip(*samples[request.warmup:])
    return statistics.median(forward), statistics.median(backward)


def _teacher_replay(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    replay = ForwardReplay(module, x)
    return replay.graph.replay


def _student_replay(module: nn.Module, sample: torch.Tensor) -> TrainingReplay:
    # A copy: fresh parameters, with no autograd node left from the eager sweeps on the default
    # stream (a backward capture that meets one syncs with that stream and is invalidated).
    return TrainingReplay(copy.deepcopy(module), (sample,))


def _timed(run: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _timed_forward_backward(graphed: nn.Module, x: torch.Tensor, gradient: torch.Tensor) -> tuple[float, float]:
    start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    out = graphed(x)
    middle.record()
    out.backward(gradient)
    end.record()
    end.synchronize()
    return start.elapsed_time(middle), middle.elapsed_time(end)
