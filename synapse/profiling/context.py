"""How the profiler calls a block: device, precision and memory format.

Precision and layout are the trainer's own (``synapse.engine.device.ComputeSetup``): bf16
under ``torch.autocast``, channels_last for conv nets on CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from synapse.engine import ComputeSetup
from synapse.profiling.request import ProfileRequest


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
