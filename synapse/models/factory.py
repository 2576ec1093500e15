"""Build teacher and student networks from timm by a short name, never downloading weights.

The short names are what configs use (``vit_large``, ``resnet152``); each maps to a timm
architecture plus the keyword arguments that make it fit our data (classes, channels, image
size). ``*_micro`` entries are tiny configurations that train in seconds on a CPU, for the
embedded default run and the multi-process tests.

Weights only ever come from local files (``load_weights``), loaded with
``torch.load(weights_only=True)`` so a checkpoint can never execute code.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

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


def load_weights(model: nn.Module, path: str | Path, *, what: str = "model", model_name: str | None = None) -> None:
    """Load a local weight file into ``model``, refusing files of another architecture or class count.

    Accepts a bare state dict or a Synapse/torch checkpoint with a ``model`` (or ``state_dict``) entry.
    ``what`` is the config key the file came from (``teacher.checkpoint``) and ``model_name`` the
    configured model; both appear in the error messages.
    """
    state = read_state_dict(path, what=what)
    check_weights_fit(model, state, Path(path), what, model_name)
    model.load_state_dict(state, strict=True)


def check_weights_file(model_name: str, path: str | Path, num_classes: int, in_chans: int = 3, img_size: int = 224,
                       *, what: str = "model") -> None:
    """Refuse a weight file that does not fit ``model_name`` for this data, before any worker loads it.

    Cheap even for ViT-Large: the model is built on the meta device (no memory, no init) and the
    file is memory-mapped (only its tensor headers are read).
    """
    with torch.device("meta"):
        model = build_model(model_name, num_classes, in_chans, img_size)
    check_weights_fit(model, read_state_dict(path, what=what, mmap=True), Path(path), what, model_name)


def read_state_dict(path: str | Path, *, what: str = "model", mmap: bool = False) -> dict[str, torch.Tensor]:
    """The state dict in a local weight file, loaded with ``weights_only=True``: a file holding code is refused."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{what} weights {str(path)!r} do not exist; give the path of a local "
                         f"checkpoint (weights are never downloaded)")
    try:
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            blob = torch.load(path, map_location="cpu", weights_only=True)  # legacy format: cannot be mapped
    except Exception as exc:  # a pickle with code in it, a truncated file, not a torch file
        raise ModelError(f"{what} weights {str(path)!r} cannot be read safely: {exc}; Synapse loads weights "
                         f"with weights_only=True and never runs code from a file: save a plain state dict "
                         f"(torch.save(model.state_dict(), path))") from exc
    return _extract_state_dict(blob, path)


def _extract_state_dict(blob: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(blob, dict):
        for key in ("model", "state_dict", "student"):
            if isinstance(blob.get(key), dict):
                return blob[key]
        if blob and all(isinstance(v, torch.Tensor) for v in blob.values()):
            return blob
    raise ModelError(f"{str(path)!r} holds no model state dict (expected a dict of tensors or a "
                     f"checkpoint with a 'model' entry)")


def check_weights_fit(model: nn.Module, state: dict[str, torch.Tensor], path: Path, what: str,
                      model_name: str | None = None) -> None:
    """Raise ModelError naming the configured model and what the file holds, unless every name and shape fits."""
    expected = model.state_dict()
    role = what.split(".")[0]
    configured = f"but {role}.name={model_name}" if model_name else "and the model is another one"
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelError(
            f"{what} weights {str(path)!r} are for another architecture: {len(missing)} missing keys "
            f"(e.g. {missing[:3]}) and {len(unexpected)} unexpected keys (e.g. {unexpected[:3]}); the file holds "
            f"{_describe_weights(state)} {configured}. Fix: pick the model name the file was trained with"
            f"{_suggest(role, state)}, or give weights of {model_name or 'this model'}")
    head = _classifier_keys(model)
    for key, tensor in expected.items():
        if tuple(state[key].shape) == tuple(tensor.shape):
            continue
        where = (f"{what} weights {str(path)!r} do not fit: {key} has shape {tuple(state[key].shape)} "
                 f"in the file but {tuple(tensor.shape)} in the model")
        if key in head and _fits_except(expected, state, head):
            file_classes, data_classes = state[head[0]].shape[0], tensor.shape[0]
            raise ModelError(
                f"{where}; the class count differs: the file was trained for {file_classes} classes, the "
                f"configured data has {data_classes}. Fix: give weights trained on this data set, or use the "
                f"data set the file was trained on")
        raise ModelError(
            f"{where}; the architecture differs: the file holds {_describe_weights(state)} {configured}. "
            f"Fix: pick the model name the file was trained with{_suggest(role, state)}, or give weights of "
            f"{model_name or 'this model'}")


def _fits_except(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], keys: list[str]) -> bool:
    return all(tuple(state[k].shape) == tuple(t.shape) for k, t in expected.items() if k not in keys)


def _classifier_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the final classifier (their shape depends on the class count), weight first."""
    classifier = model.get_classifier() if hasattr(model, "get_classifier") else None
    for prefix, module in model.named_modules():
        if module is classifier and prefix:
            return [f"{prefix}.{name}" for name, _ in module.named_parameters()]
    return [k for k in model.state_dict() if k.rsplit(".", 1)[0] in ("fc", "head", "classifier")]


@cache
def _architecture_signature(name: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Names and shapes of a registry model's tensors, leaving out those that depend on the data:
    the classifier (class count), position embeddings (image size) and the first layer (channels)."""
    with torch.device("meta"):
        model = build_model(name, num_classes=1)
    state = model.state_dict()
    stem = next(k for k, t in state.items() if t.dim() == 4)  # the first conv or patch embedding: in_chans
    data_dependent = {*_classifier_keys(model), stem}
    return tuple(sorted((k, tuple(t.shape) if k not in data_dependent and "pos_embed" not in k else ())
                        for k, t in state.items()))


def identify_weights(state: dict[str, torch.Tensor]) -> list[str]:
    """Registry names whose architecture matches the tensors of ``state`` (for error messages)."""
    matches = []
    for name in MODEL_REGISTRY:
        signature = _architecture_signature(name)
        keys = {k for k, _ in signature}
        if keys == set(state) and all(not shape or tuple(state[k].shape) == shape for k, shape in signature):
            matches.append(name)
    return matches


def _describe_weights(state: dict[str, torch.Tensor]) -> str:
    names = identify_weights(state)
    if len(names) == 1:
        return f"{names[0]} weights"
    if names:
        return f"weights of {' or '.join(names)} (the same architecture)"
    return f"weights of an architecture Synapse does not know ({len(state)} tensors, e.g. {sorted(state)[:2]})"


def _suggest(role: str, state: dict[str, torch.Tensor]) -> str:
    names = identify_weights(state)
    return f" ({role}={names[0]})" if names and role in ("teacher", "student") else ""


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
