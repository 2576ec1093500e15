"""Optimizer and learning-rate schedule, shared by the single-device trainer and the pipeline.

Optimizer state is saved and restored *by parameter name*, so a checkpoint written by one
partition loads into any other (each stage restores the names it owns).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from synapse.config import OptimConfig


def build_optimizer(params: Iterable[nn.Parameter], cfg: OptimConfig,
                    fused: bool | None = None) -> torch.optim.Optimizer:
    """``fused``: AdamW's single-kernel CUDA update (on an H200 the unfused multi-tensor one cost
    ViT-L/16 -> ResNet-152 a fifth of its step: docs/gpu.md); the same arithmetic up to rounding.
    None: fused where the parameters are on a GPU. One rule for every loop: a pipeline's stages and
    the single-device loop that is its reference must update with the same kernel, or a GPU run
    cannot match its reference bit for bit (it did not, while only the stages were fused)."""
    # A stage may own only parameter-free blocks (activation, pooling): it still gets a real
    # optimizer and schedule, with one empty group, so every rank runs the same code.
    params = [{"params": list(params)}]
    if fused is None:
        fused = any(p.is_cuda for p in params[0]["params"])
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)
    raise ValueError(f"optim.name={cfg.name!r} is unknown; use sgd or adamw")


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Multiplier of the base learning rate after ``step`` optimizer steps (linear warm-up, then the schedule)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "step":
        return cfg.gamma ** (step // cfg.step_size)
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class ResumableLambdaLR(LambdaLR):
    """LambdaLR whose ``load_state_dict`` also puts the restored learning rate back on the optimizer.

    LambdaLR restores only its own counters; the optimizer's param groups would keep the
    learning rate of step 0 for the first step after a resume, and the resumed run would
    drift from the uninterrupted one.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group, lr in zip(self.optimizer.param_groups, self.get_last_lr()):
            group["lr"] = lr


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> LambdaLR:
    return ResumableLambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))


def optimizer_state_by_name(optimizer: torch.optim.Optimizer, named_params: dict[str, nn.Parameter],
                            clone: bool = True) -> dict[str, dict[str, Any]]:
    """Per-parameter optimizer state (momentum, Adam moments, step) keyed by parameter name.

    ``clone=False`` hands out the optimizer's own tensors (a checkpoint stager copies them anyway)."""
    return {name: {k: ((v.detach().clone() if clone else v.detach()) if torch.is_tensor(v) else v)
                   for k, v in optimizer.state[p].items()}
            for name, p in named_params.items() if p in optimizer.state}


def load_optimizer_state_by_name(optimizer: torch.optim.Optimizer, named_params: dict[str, nn.Parameter],
                                 saved: dict[str, dict[str, Any]]) -> None:
    """Restore the state of the parameters this optimizer holds; names it does not hold are ignored."""
    # 'step' stays where torch keeps it (the CPU) unless the optimizer is fused or capturable: their
    # kernels read it on the parameter's device, as float32 (what torch's own load_state_dict does).
    on_device_step = bool(optimizer.defaults.get("fused") or optimizer.defaults.get("capturable"))
    for name, param in named_params.items():
        if name not in saved:
            continue
        optimizer.state[param] = {k: _state_value(k, v, param, on_device_step) for k, v in saved[name].items()}


def _state_value(key: str, value: Any, param: nn.Parameter, on_device_step: bool) -> Any:
    if not torch.is_tensor(value):
        return value
    if key == "step":
        return value.to(param.device, torch.float32) if on_device_step else value.cpu()
    if value.shape == param.shape:
        # A moment takes its parameter's memory layout: a checkpoint holds it dense (NCHW), a conv weight
        # runs channels_last on CUDA, and the fused AdamW kernel refuses moments strided unlike their
        # parameter ("must have same dtype, device, and layout"). The copy is exact.
        return torch.empty_like(param, dtype=value.dtype).copy_(value)
    return value.to(param.device)


def scale_gradients(params: Iterable[nn.Parameter], divisor: int) -> None:
    """Divide accumulated gradients by the micro-batch count.

    Losses are summed over micro-batches and the sum divided once at the end, in the same
    order torch.distributed.pipelining does it, so both paths compute identical gradients.
    """
    if divisor == 1:
        return
    for p in params:
        if p.grad is not None:
            p.grad.div_(divisor)
