"""Where and in what precision a process computes: device, autocast, memory format, threads.

``ComputeSetup`` needs torch alone, so that tools without a config (the profiler on a bare GPU
machine) share the trainer's exact precision and layout rules; ``build_compute_setup`` makes
one from the trainer's settings.
"""
from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass

import torch
from torch import nn

from synapse.config import TrainerConfig, cuda_index, resolve_accelerator, shares_a_gpu


@dataclass(frozen=True)
class ComputeSetup:
    """bf16 autocast + channels_last on CUDA by default, full fp32 on CPU."""

    device: torch.device
    autocast_dtype: torch.dtype | None  # None: full fp32
    channels_last: bool
    # Where tensors cross between processes (stage boundaries, collectives): the device itself
    # under NCCL and on the CPU; host memory when several ranks share one GPU (gloo cannot send
    # CUDA tensors, NCCL refuses two ranks on one GPU). None: the device.
    wire_device: torch.device | None = None

    @property
    def wire(self) -> torch.device:
        return self.wire_device or self.device

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


def available_cores() -> int:
    """The cores this process may run on (its affinity: a container or a Slurm step may grant fewer)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads(local_processes: int) -> int:
    """Intra-op threads per process: the cores shared out, never oversubscribed.

    More threads than cores make OpenMP spin against the other processes: small CPU models
    then run several times slower, not faster.
    """
    return max(1, available_cores() // max(1, local_processes))


def build_compute_setup(trainer: TrainerConfig, device_id: int = 0, local_processes: int = 1) -> ComputeSetup:
    """Device and precision for one process: bf16 autocast + channels_last on CUDA, fp32 NCHW on CPU (by default)."""
    accelerator = resolve_accelerator(trainer)
    torch.set_num_threads(trainer.threads or default_threads(local_processes))
    if accelerator == "cuda":
        device = torch.device("cuda", cuda_index(trainer, device_id))
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = trainer.cudnn_benchmark and not trainer.deterministic
        if trainer.deterministic:
            # cuBLAS is reproducible only with a fixed workspace (read when its first handle is made);
            # ops without a deterministic kernel (atomics in some backward passes) warn, not fail.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.deterministic = True
            torch.use_deterministic_algorithms(True, warn_only=True)
        bf16 = trainer.precision in ("auto", "bf16")
        return ComputeSetup(device, torch.bfloat16 if bf16 else None, trainer.channels_last is not False,
                            wire_device=torch.device("cpu") if shares_a_gpu(trainer) else None)
    bf16 = trainer.precision == "bf16"
    # channels_last on the CPU only when asked for: the exactness tests run a channels_last
    # pipeline against a channels_last single device this way
    return ComputeSetup(torch.device("cpu"), torch.bfloat16 if bf16 else None, trainer.channels_last is True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
