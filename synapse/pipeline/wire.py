"""How a stage's 4-D activations travel between stages: in the memory order the models run them.

A conv net runs channels_last on CUDA, but a point-to-point send needs a dense tensor and
torch.distributed.pipelining allocates its receive buffers dense in the shape's default (NCHW)
order. Sending ``.contiguous()`` therefore turned every boundary activation into NCHW, and the
next stage's first block paid format copies and a strided residual add: a ViT-B/16 -> ResNet-50
stage at micro-batch 128 on an H200 ran 14.30 ms per iteration with an NCHW input against 11.95 ms
with a channels_last one (experiments/results/h200/graphs/probe_stage_kernels_vitb_r50_mb128.txt).

With ``channels_last`` on, a 4-D activation travels as its NHWC view: dense, the same memory, no
copy on either side; the receiver views it back as a channels_last NCHW tensor. Gradients travel
the same way, through autograd's permutes. The teacher's activations travel the same way as the
student's. Everything else (tokens, logits, 4-D tensors when channels_last is off, as on the
CPU by default) travels as before.

Gradients of received inputs: torch.distributed.pipelining before 2.13 registers a backward send
for *every* floating-point tensor a stage receives, and fails with "has gradients None and is
expecting to send gradients" when the no-grad teacher activation gets no gradient.
``attach_zero_grad`` gives that input an exact zero gradient without touching the forward values
(an identity, not ``x + 0 * t``, which would turn an inf in t into NaN). Newer versions skip the
send, so the zeros are only produced where they are needed.

Ranks that share one GPU (``trainer.shared_gpu``) exchange through host memory: NCCL refuses two
ranks on one GPU and gloo cannot send CUDA tensors. ``ThroughHost`` keeps the stage on its GPU
and puts its boundary on the host; pipelining's buffers, sends and receives are then gloo's. What
leaves the GPU (a stage's outputs forward, its inputs' gradients backward) lands in pinned host
memory, copied synchronously: the DMA engine writes it directly, with no staging through a pageable
bounce buffer, and the copy is complete before gloo reads it (an asynchronous copy would let gloo
send a buffer still being written). Pinned blocks come from torch's caching host allocator, so a
step reuses the last step's. What arrives (pipelining's receive buffers, pageable, reused from
micro-batch to micro-batch) is copied to the GPU synchronously too, so the next receive cannot
overwrite a buffer a copy still reads.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from synapse.config import torch_version

_TO_NHWC = (0, 2, 3, 1)
_TO_NCHW = (0, 3, 1, 2)


def to_wire(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """What a stage sends: dense, NHWC-shaped for a channels_last 4-D activation."""
    if channels_last and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last).permute(_TO_NHWC)
    return x.contiguous()  # a block may hand on a view (a ViT's class-token slice)


def from_wire(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """What a stage computes on: the received tensor, viewed back as channels_last NCHW."""
    if not (channels_last and x.dim() == 4):
        return x
    if x.requires_grad and x.is_leaf:
        # A received activation is a leaf, and an in-place first block (ReLU(inplace=True)) may
        # not modify a view of a leaf that requires grad. The copy is exact and keeps the layout.
        x = x.clone()
    return x.permute(_TO_NCHW)


# Oldest release whose pipelining accepts a received input that gets no gradient.
NO_GRAD_INPUTS_SUPPORTED = torch_version() >= (2, 13)


class _AttachZeroGrad(torch.autograd.Function):
    """Returns ``output`` unchanged; in backward gives ``companion`` a zero gradient."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, companion: torch.Tensor) -> torch.Tensor:
        ctx.companion_meta = (companion.shape, companion.dtype, companion.device)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        shape, dtype, device = ctx.companion_meta
        return grad_output, torch.zeros(shape, dtype=dtype, device=device)


def attach_zero_grad(output: torch.Tensor, companion: torch.Tensor) -> torch.Tensor:
    return _AttachZeroGrad.apply(output, companion)


def _to_pinned_host(t: torch.Tensor) -> torch.Tensor:
    """A synchronous copy of a CUDA tensor into pinned host memory, strides kept (a channels_last
    activation's NHWC view stays dense)."""
    host = torch.empty_like(t, device="cpu", pin_memory=True)
    host.copy_(t)  # blocking: complete before gloo reads it
    return host


class _HostToDevice(torch.autograd.Function):
    """A received input onto the stage's GPU; its gradient back to pinned host memory for the send upstream."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        return x.to(device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _to_pinned_host(grad), None


class _DeviceToHost(torch.autograd.Function):
    """A stage's output into pinned host memory for the send downstream; its gradient back onto the GPU."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        ctx.device = y.device
        return _to_pinned_host(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.device)


class ThroughHost(nn.Module):
    """A stage computed on its GPU whose received inputs and sent outputs live in host memory.

    torch.distributed.pipelining allocates receive buffers on its stage's device and moves its
    module there; here that device is the host, so ``to`` leaves the stage where it is. Gradients
    come back through the two copies' backwards to the host tensors that pipelining sends
    upstream. The last stage's outputs stay on the GPU, where the loss is.
    """

    def __init__(self, stage: nn.Module, device: torch.device, outputs_to_host: bool):
        super().__init__()
        self.stage, self.device, self.outputs_to_host = stage, device, outputs_to_host

    @property
    def graphs(self) -> Any:  # the stage's captures (TimedPipelineStage selects a micro-batch's)
        return getattr(self.stage, "graphs", None)

    def to(self, *args: Any, **kwargs: Any) -> ThroughHost:  # type: ignore[override]
        return self  # pipelining's move to the wire device: the stage computes on its GPU

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        on_device = tuple(_HostToDevice.apply(x, self.device) if x.device.type == "cpu" else x for x in inputs)
        outputs = self.stage(*on_device)
        if not self.outputs_to_host:
            return outputs
        return tuple(_DeviceToHost.apply(y) for y in outputs)
