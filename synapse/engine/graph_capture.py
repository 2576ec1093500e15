"""CUDA graph capture as the pipeline stages and the profiler both use it.

- ``capture_kwargs``: capture only this thread's work. A run's other threads keep using the GPU
  while a stage captures (the data loader's copies, NCCL's watchdog); in the default global
  mode any of their calls invalidates the capture.
- ``ForwardReplay``: a forward without autograd (the teacher), captured with ``torch.cuda.graph``.
- ``graph_module``: a module's forward and backward, captured with
  ``torch.cuda.make_graphed_callables``, with every parameter's gradient allocated first: a
  replayed backward hands autograd views of the graph's static gradient buffers, and autograd
  *adopts* such a tensor as ``.grad`` when that is None, so the next replay would overwrite the
  accumulated gradient. With ``.grad`` allocated, autograd adds into it instead.
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

WARMUP_ITERATIONS = 3  # eager runs before a capture: cudnn picks its algorithms, lazy state settles


def capture_kwargs(function: Callable) -> dict:
    if "capture_error_mode" in inspect.signature(function).parameters:
        return {"capture_error_mode": "thread_local"}
    return {}  # older torch: global mode only


def allocate_grads(params) -> None:
    for param in params:
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


class ForwardReplay:
    """One captured forward under no_grad: copy the input in, replay, read the static output."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], sample: torch.Tensor):
        self.static_in = sample.detach().clone()
        side = torch.cuda.Stream(sample.device)
        side.wait_stream(torch.cuda.current_stream(sample.device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(WARMUP_ITERATIONS):
                forward(self.static_in)
        torch.cuda.current_stream(sample.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, **capture_kwargs(torch.cuda.graph)):
            self.static_out = forward(self.static_in).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out


def graph_module(module: nn.Module, samples: tuple[torch.Tensor, ...]) -> nn.Module:
    """``module`` with its forward (and, through autograd, its backward) replayed from graphs."""
    allocate_grads(module.parameters())
    return torch.cuda.make_graphed_callables(module, samples, num_warmup_iters=WARMUP_ITERATIONS,
                                             allow_unused_input=True,
                                             **capture_kwargs(torch.cuda.make_graphed_callables))
