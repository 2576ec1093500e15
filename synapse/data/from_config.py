"""A data config node as the dataset builders' arguments (the one place that knows both)."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from synapse.data.registry import build_dataset


def data_kwargs(data: DictConfig, seed: int, split: str | None = None) -> dict[str, Any]:
    """Keyword arguments of ``build_dataset`` (for ``split``) or ``dataset_info`` (split None)."""
    if data.name == "digits":
        return {"image_size": data.image_size, **({"augment": data.augment, "seed": seed} if split == "train" else {})}
    if data.name == "imagenet100":
        return {"root": data.root, "image_size": data.image_size, **({"seed": seed, "decode": data.decode, "gpu_share": data.gpu_decode_share} if split else {})}
    kwargs = {"image_size": data.image_size, "num_classes": data.synthetic_num_classes,
              "in_chans": data.synthetic_in_chans}
    if split:
        size = data.synthetic_train_size if split == "train" else data.synthetic_val_size
        kwargs.update(num_samples=size, seed=seed)
    return kwargs


def build_datasets(data: DictConfig, seed: int):
    return (build_dataset(data.name, "train", **data_kwargs(data, seed, "train")),
            build_dataset(data.name, "val", **data_kwargs(data, seed, "val")))
