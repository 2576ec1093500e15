"""Build teacher and student networks from timm by a short name, never downloading weights.

The short names are what configs use (``vit_large``, ``resnet152``); each maps to a timm
architecture plus the keyword arguments that make it fit our data (classes, channels, image
size). ``*_micro`` entries are tiny configurations that train in seconds on a CPU, for the
embedded default run and the multi-process tests.

Weights only ever come from local files (``load_weights``), loaded with
``torch.load(weights_only=True)`` so a checkpoint can never execute code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import timm
import torch
from torch import nn


class ModelError(ValueError):
    """A model name, architecture or weight file that cannot be used; the message says how to fix it."""


@dataclass(frozen=True)
class ModelSpec:
    """How to build one named model: the timm architecture and its fixed keyword arguments."""

    timm_name: str
    family: str  # 'vit' | 'resnet' | 'efficientnet': decides how the model is cut into blocks
    kwargs: dict[str, Any] = field(default_factory=dict)
    takes_img_size: bool = False  # ViTs bake the image size into their position embedding
    description: str = ""


def _small_resnet(width: int) -> Callable[..., nn.Module]:
    # One BasicBlock per stage: a real ResNet (BatchNorm, residuals, downsampling) that
    # trains on 32x32 digits in seconds on one CPU core.
    def build(**kwargs: Any) -> nn.Module:
        from timm.models.resnet import BasicBlock, ResNet

        return ResNet(block=BasicBlock, layers=(1, 1, 1, 1), channels=tuple(width * 2**i for i in range(4)),
                      stem_width=width, **kwargs)

    return build


_CUSTOM_BUILDERS: dict[str, Callable[..., nn.Module]] = {"resnet_micro": _small_resnet(16),
                                                         "resnet_mini": _small_resnet(32)}

MODEL_REGISTRY: dict[str, ModelSpec] = {
    "vit_large": ModelSpec("vit_large_patch16_224", "vit", takes_img_size=True),
    "vit_base": ModelSpec("vit_base_patch16_224", "vit", takes_img_size=True),
    "vit_small": ModelSpec("vit_small_patch16_224", "vit", takes_img_size=True),
    "vit_tiny": ModelSpec("vit_tiny_patch16_224", "vit", takes_img_size=True),
    "deit_base": ModelSpec("deit_base_patch16_224", "vit", takes_img_size=True),
    "deit_small": ModelSpec("deit_small_patch16_224", "vit", takes_img_size=True),
    "deit_tiny": ModelSpec("deit_tiny_patch16_224", "vit", takes_img_size=True),
    "resnet152": ModelSpec("resnet152", "resnet"),
    "resnet101": ModelSpec("resnet101", "resnet"),
    "resnet50": ModelSpec("resnet50", "resnet"),
    "resnet34": ModelSpec("resnet34", "resnet"),
    "resnet18": ModelSpec("resnet18", "resnet"),
    "efficientnet_b0": ModelSpec("efficientnet_b0", "efficientnet"),
    # Small configurations for CPU runs and tests (32x32 inputs).
    "vit_micro": ModelSpec(
        "vit_tiny_patch16_224", "vit", takes_img_size=True,
        kwargs=dict(patch_size=4, embed_dim=96, depth=4, num_heads=3, mlp_ratio=2.0),
        description="4-block ViT for 32x32 inputs",
    ),
    "resnet_micro": ModelSpec("resnet_micro", "resnet",
                              description="ResNet with one BasicBlock per stage, 16-128 channels"),
    "resnet_mini": ModelSpec("resnet_mini", "resnet",
                             description="ResNet with one BasicBlock per stage, 32-256 channels"),
    "efficientnet_micro": ModelSpec("tinynet_e", "efficientnet",
                                    description="TinyNet-E: the smallest EfficientNet scaling"),
}


def model_family(name: str) -> str:
    return model_spec(name).family


def model_spec(name: str) -> ModelSpec:
    try:
        return MODEL_REGISTRY[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}; choose one of: {', '.join(sorted(MODEL_REGISTRY))}"
        ) from None


def build_model(name: str, num_classes: int, in_chans: int = 3, img_size: int = 224,
                drop_rate: float = 0.0) -> nn.Module:
    """Create a freshly initialised model (no weight download, ever)."""
    spec = model_spec(name)
    if num_classes < 1:
        raise ModelError(f"num_classes must be >= 1, got {num_classes}")
    kwargs: dict[str, Any] = dict(spec.kwargs, num_classes=num_classes, in_chans=in_chans,
                                  drop_rate=drop_rate)
    if spec.takes_img_size:
        kwargs["img_size"] = img_size
    if spec.timm_name in _CUSTOM_BUILDERS:
        return _CUSTOM_BUILDERS[spec.timm_name](**kwargs)
    return timm.create_model(spec.timm_name, pretrained=False, **kwargs)


def load_weights(model: nn.Module, path: str | Path, *, what: str = "model") -> None:
    """Load a local weight file into ``model``, refusing files of another architecture or class count.

    Accepts a bare state dict or a Synapse/torch checkpoint with a ``model`` (or ``state_dict``) entry.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{what} weights {str(path)!r} do not exist; give the path of a local "
                         f"checkpoint (weights are never downloaded)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle with code in it, a truncated file, not a torch file
        raise ModelError(f"{what} weights {str(path)!r} cannot be read safely: {exc}") from exc
    state = _extract_state_dict(blob, path)
    _check_compatible(model, state, path, what)
    model.load_state_dict(state, strict=True)


def _extract_state_dict(blob: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(blob, dict):
        for key in ("model", "state_dict", "student"):
            if isinstance(blob.get(key), dict):
                return blob[key]
        if all(isinstance(v, torch.Tensor) for v in blob.values()):
            return blob
    raise ModelError(f"{str(path)!r} holds no model state dict (expected a dict of tensors or a "
                     f"checkpoint with a 'model' entry)")


def _check_compatible(model: nn.Module, state: dict[str, torch.Tensor], path: Path, what: str) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelError(
            f"{what} weights {str(path)!r} are for another architecture: {len(missing)} missing keys "
            f"(e.g. {missing[:3]}) and {len(unexpected)} unexpected keys (e.g. {unexpected[:3]}); "
            f"pick the model name the file was trained with"
        )
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            hint = ("the class count differs (data.num_classes)" if key.endswith(("fc.weight", "head.weight",
                    "classifier.weight", "fc.bias", "head.bias", "classifier.bias")) else
                    "the architecture differs")
            raise ModelError(
                f"{what} weights {str(path)!r} do not fit: {key} has shape {tuple(state[key].shape)} "
                f"in the file but {tuple(tensor.shape)} in the model; {hint}"
            )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
