"""Where and in what precision a process computes: device, autocast, memory format, threads."""
from __future__ import annotations

import os
import random

import torch

from synapse.config import TrainerConfig, resolve_accelerator
from synapse.engine.compute import ComputeSetup


def default_threads(local_processes: int) -> int:
    """Intra-op threads per process: the cores shared out, never oversubscribed.

    More threads than cores make OpenMP spin against the other processes: small CPU models
    then run several times slower, not faster.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_processes))


def build_compute_setup(trainer: TrainerConfig, device_id: int = 0, local_processes: int = 1) -> ComputeSetup:
    """Device and precision for one process: bf16 autocast + channels_last on CUDA, fp32 NCHW on CPU (by default)."""
    accelerator = resolve_accelerator(trainer)
    torch.set_num_threads(trainer.threads or default_threads(local_processes))
    if accelerator == "cuda":
        torch.cuda.set_device(device_id)
        torch.backends.cudnn.benchmark = trainer.cudnn_benchmark and not trainer.deterministic
        device = torch.device("cuda", device_id)
        bf16 = trainer.precision in ("auto", "bf16")
        return ComputeSetup(device, torch.bfloat16 if bf16 else None, trainer.channels_last is not False)
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
