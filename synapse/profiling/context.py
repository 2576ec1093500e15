"""How the profiler calls a block: device, precision and memory format.

Precision and layout follow the trainer (``synapse.engine.device.ComputeSetup``): bf16 under
``torch.autocast``, channels_last for conv nets on CUDA. The few lines are repeated here rather
than imported, because that module pulls in the Hydra config layer, and a profiling run on a
bare GPU machine needs only torch and timm.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from .request import ProfileRequest


@dataclass(frozen=True)
class ComputeSetup:
    """Device, autocast dtype and memory format, as the trainer computes."""

    device: torch.device
    autocast_dtype: torch.dtype | None  # None: full fp32
    channels_last: bool

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def prepare_input(self, images: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device)
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images


@dataclass(frozen=True)
class MeasureContext:
    """One profile's request and compute setup."""

    request: ProfileRequest
    setup: ComputeSetup

    @property
    def device(self) -> torch.device:
        return self.setup.device


def forward_call(module: nn.Module, setup: ComputeSetup, x: torch.Tensor) -> torch.Tensor:
    """One forward under the setup's autocast (the caller chooses grad or no_grad)."""
    with setup.autocast():
        return module(x)


def loss_gradient(logits: torch.Tensor) -> torch.Tensor:
    # What a mean-reduced loss sends back: small and finite, whatever the logits are.
    return torch.full_like(logits, 1.0 / logits.numel())
