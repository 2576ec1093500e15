"""Block times inside one captured pass: CUDA events recorded into the graph between blocks.

Why: a graphed stage runs its blocks back to back inside one graph, so a block's time there is
its kernels plus the gaps between them, with its input still warm in L2 from the block before.
Replaying each block as its own graph (``graphed``'s fallback) measures something else: a graph
launch per block, a cold input, and for short blocks mostly the launch (ResNet-50's block
replays summed to 1.25x its whole forward on an H200). Here the whole model is captured once,
forward then backward, with an event recorded (``external=True``: an event-record node that
runs at replay) before and after every block's part; one replay times every block in context.

The backward runs block by block (last first) with ``torch.autograd.grad`` over that block's
own subgraph, each block's input detached from the one before: the kernels are the same a
stage's backward runs, and the events fall exactly on block boundaries.
"""
from __future__ import annotations

import copy
import inspect
import statistics

import torch
from torch import nn

from synapse.engine import WARMUP_ITERATIONS, capture_kwargs
from synapse.profiling.context import MeasureContext, loss_gradient


class InGraphTimingUnavailable(RuntimeError):
    """This torch cannot record timing events inside a CUDA graph."""


def _events(count: int) -> list[torch.cuda.Event]:
    if "external" not in inspect.signature(torch.cuda.Event.__new__).parameters:
        raise InGraphTimingUnavailable(f"torch {torch.__version__} has no external CUDA events")
    return [torch.cuda.Event(enable_timing=True, external=True) for _ in range(count)]


class _Pass:
    """One forward (and, for the student, backward) over ``blocks``, recording events at block edges."""

    def __init__(self, blocks: list[nn.Module], images: torch.Tensor, context: MeasureContext):
        self.student = not context.request.is_teacher
        # the student's copy: fresh parameters, with no autograd state left by the eager sweeps
        self.blocks = [copy.deepcopy(b) for b in blocks] if self.student else blocks
        self.images = images.detach().clone()
        self.context = context
        count = len(blocks)
        self.forward_events = _events(2 * count)
        self.backward_events = _events(2 * count) if self.student else []
        self.gradient: torch.Tensor | None = None

    def __call__(self, stream: torch.cuda.Stream) -> None:
        with self.context.setup.autocast(cache=False), torch.set_grad_enabled(self.student):
            inputs, outputs = self._forward(stream)
        if self.student:
            self._backward(inputs, outputs, stream)

    def _forward(self, stream: torch.cuda.Stream) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        inputs, outputs, x = [], [], self.images
        for index, block in enumerate(self.blocks):
            x = x.detach().requires_grad_(self.student and index > 0)  # the images get no gradient
            inputs.append(x)
            # a block that starts in place (ReLU) may not modify a leaf: run it on a copy, outside the timing
            run_on = x.clone() if x.requires_grad else x
            self.forward_events[2 * index].record(stream)
            x = block(run_on)
            self.forward_events[2 * index + 1].record(stream)
            outputs.append(x)
        if self.student and self.gradient is None:
            self.gradient = loss_gradient(x).detach()
        return inputs, outputs

    def _backward(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], stream: torch.cuda.Stream) -> None:
        gradient = self.gradient
        for index in reversed(range(len(self.blocks))):
            wrt = [p for p in self.blocks[index].parameters() if p.requires_grad]
            if inputs[index].requires_grad:
                wrt = [inputs[index], *wrt]
            self.backward_events[2 * index].record(stream)
            if wrt and outputs[index].requires_grad:
                grads = torch.autograd.grad(outputs[index], wrt, gradient, allow_unused=True)
                if inputs[index].requires_grad:
                    gradient = grads[0]
            self.backward_events[2 * index + 1].record(stream)

    def read(self) -> tuple[list[float], list[float]]:
        """Per-block forward and backward milliseconds of the last replay."""
        def spans(events: list[torch.cuda.Event]) -> list[float]:
            return [events[i].elapsed_time(events[i + 1]) for i in range(0, len(events), 2)]
        forward = spans(self.forward_events)
        backward = spans(self.backward_events) if self.student else [0.0] * len(forward)
        return forward, backward


def in_graph_block_times(blocks: list[nn.Module], images: torch.Tensor, context: MeasureContext
                         ) -> tuple[list[float], list[float]]:
    """Every block's forward and backward milliseconds inside one replayed whole-model graph:
    medians over ``request.repeats`` replays after ``request.warmup`` untimed ones."""
    run = _Pass(blocks, images, context)
    device = images.device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_ITERATIONS):  # cudnn picks its algorithms, lazy state settles
            run(side)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, **capture_kwargs(torch.cuda.graph)):
        run(torch.cuda.current_stream(device))
    request = context.request
    samples = []
    for _ in range(request.warmup + request.repeats):
        graph.replay()
        torch.cuda.synchronize(device)
        samples.append(run.read())
    kept = samples[request.warmup:]
    forward = [statistics.median(s[0][i] for s in kept) for i in range(len(blocks))]
    backward = [statistics.median(s[1][i] for s in kept) for i in range(len(blocks))]
    del graph
    return forward, backward
