"""Device, autocast dtype and memory format of one process's compute.

Kept free of the config layer so that tools which need only torch (the profiler on a bare
GPU machine) share the trainer's exact precision and layout rules.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ComputeSetup:
    """bf16 autocast + channels_last on CUDA by default, full fp32 on CPU."""

    device: torch.device
    autocast_dtype: torch.dtype | None  # None: full fp32
    channels_last: bool

    def autocast(self, cache: bool = True):
        """``cache=False`` where CUDA graphs are captured: they may not use the cast-weight cache."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype, cache_enabled=cache)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def prepare_input(self, images: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device, non_blocking=True)
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
