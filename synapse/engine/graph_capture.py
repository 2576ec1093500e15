"""CUDA graph capture as the pipeline stages and the profiler both use it.

- ``capture_kwargs``: capture only this thread's work. A run's other threads keep using the GPU
  while a stage captures (the data loader's copies, NCCL's watchdog); in the default global
  mode any of their calls invalidates the capture.
- ``ForwardReplay``: a forward without autograd (the teacher), captured with ``torch.cuda.graph``.
- ``TrainingReplay``: a module's forward and its backward, each captured as one graph; the
  backward graph also adds every parameter's gradient into ``.grad``. Why not
  ``torch.cuda.make_graphed_callables``: its replayed backward hands autograd one gradient per
  parameter, and autograd then accumulates each with its own launch from the host. A stage of
  ResNet-152 has hundreds of parameters, so at the small micro-batches a pipeline runs the host
  spent milliseconds a step on those launches (on an H200 a graphed stage ran up to 1.57x its
  kernel time at micro-batch 16). Here they are one fused add inside the graph.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

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


class TrainingReplay:
    """A module's forward and backward as two captured graphs sharing one memory pool.

    Call it like the module: the inputs are copied into the samples it was captured with (unless
    they are them), the forward replays, and the output carries an autograd node whose backward
    copies the output gradient in, replays the backward graph (which adds the parameter gradients
    into the buffers bound as ``.grad``) and returns the inputs' gradients. Those are the graph's
    static tensors: the next backward replay overwrites them, which is why a pipeline stage keeps
    one capture per micro-batch in flight (``pipeline.graphs``).
    """

    def __init__(self, module: nn.Module, samples: tuple[torch.Tensor, ...]):
        self.params = [p for p in module.parameters() if p.requires_grad]
        allocate_grads(self.params)
        self.grads = [p.grad for p in self.params]  # the graph adds into these very tensors
        # The samples themselves are the static inputs (the caller hands fresh copies): a call with
        # the sample copies nothing.
        self.static_in = samples
        wrt_inputs = [x for x in self.static_in if x.requires_grad]
        if not wrt_inputs and not self.params:
            raise RuntimeError("nothing to differentiate: no parameter and no input needs a gradient")
        self._input_grad_slots = [i for i, x in enumerate(self.static_in) if x.requires_grad]
        # As torch.cuda.make_graphed_callables does: warm up and capture on one stream, synchronised
        # around the warm-up, so the autograd nodes the warm-up creates belong to the capture's stream.
        device = samples[0].device
        stream = torch.cuda.Stream(device)
        torch.cuda.synchronize(device)
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_ITERATIONS):
                out = module(*self.static_in)
                torch.autograd.grad(out, wrt_inputs + self.params, torch.ones_like(out), allow_unused=True)
            del out
        torch.cuda.synchronize(device)
        pool = torch.cuda.graph_pool_handle()
        self.forward_graph, self.backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        capture = dict(pool=pool, stream=stream, **capture_kwargs(torch.cuda.graph))
        with torch.cuda.graph(self.forward_graph, **capture):
            out = module(*self.static_in)
        self.static_out = out.detach()
        self.static_grad_out = torch.zeros_like(out)
        with torch.cuda.graph(self.backward_graph, **capture):
            grads = torch.autograd.grad(out, wrt_inputs + self.params, self.static_grad_out, allow_unused=True)
            used = [(buffer, grad) for buffer, grad in zip(self.grads, grads[len(wrt_inputs):]) if grad is not None]
            if used:
                torch._foreach_add_([b for b, _ in used], [g for _, g in used])
        self.static_input_grads = [None if g is None else g.detach() for g in grads[:len(wrt_inputs)]]
        # The output needs an autograd node even when no input wants a gradient (the first
        # stage's images): a scalar of its own rides along as an input and gets None back. Not
        # a parameter: an output waiting for its backward would keep that parameter's autograd
        # node alive, made on the default stream, and the next slot's capture would meet it
        # (a stream mismatch that invalidates the capture).
        self._anchor = torch.zeros((), device=device, requires_grad=True)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return _Replayed.apply(self, self._anchor, *inputs)

    def bind_grads(self) -> None:
        """Make each parameter's ``.grad`` the buffer the backward graph adds into: zeroed where
        the optimizer set it to None, holding the value where something else replaced it."""
        stale = [i for i, (p, b) in enumerate(zip(self.params, self.grads)) if p.grad is not b]
        if not stale:
            return
        cleared = [self.grads[i] for i in stale if self.params[i].grad is None]
        if cleared:
            torch._foreach_zero_(cleared)
        for i in stale:
            param = self.params[i]
            if param.grad is not None:
                self.grads[i].copy_(param.grad)
            param.grad = self.grads[i]


class _Replayed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, replay: TrainingReplay, anchor: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.replay = replay
        for static, x in zip(replay.static_in, inputs):
            if static.data_ptr() != x.data_ptr():
                static.copy_(x)
        replay.forward_graph.replay()
        return replay.static_out.detach()  # a new tensor per call: each carries its own autograd node

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        replay: TrainingReplay = ctx.replay
        replay.bind_grads()
        if grad_out.data_ptr() != replay.static_grad_out.data_ptr():
            replay.static_grad_out.copy_(grad_out)
        replay.backward_graph.replay()
        input_grads: list[torch.Tensor | None] = [None] * len(replay.static_in)
        for slot, grad in zip(replay._input_grad_slots, replay.static_input_grads):
            input_grads[slot] = None if grad is None else grad.detach()
        return (None, None, *input_grads)  # nothing for the replay object and the anchor


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

