"""Data sets by name: build one, or describe it without loading anything.

``build_dataset`` and ``dataset_info`` accept the same keyword arguments (those of the
data set's class), so the config layer can pass one config slice to both: first
``dataset_info`` to check models against the data before any work, later
``build_dataset``. Arguments that do not change the description (``root``, ``seed``,
``augment`` ...) are accepted and ignored by ``dataset_info``, which reads no file.

``data_kwargs`` turns the config's data slice into those arguments (the one place that knows both).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from synapse.data.base import DataError, DatasetInfo, EpochDataset, require_split
from synapse.data.digits import DigitsDataset, digits_info
from synapse.data.imagenet100 import ImageNet100, imagenet100_info
from synapse.data.synthetic import SyntheticImages, synthetic_info


@dataclass(frozen=True)
class _Entry:
    builder: Callable[..., EpochDataset]  # called with split=... plus the user's kwargs
    describe: Callable[..., DatasetInfo]  # takes a subset of the builder's kwargs
    # Modules the builder imports lazily because they are slow to import (scikit-learn: seconds on
    # a small CPU). A launcher imports them once in the process its workers are forked from.
    lazy_imports: tuple[str, ...] = ()
    # Whether its loader workers decode image files (what data.num_workers=auto sizes them for).
    decodes_files: bool = False


_REGISTRY: Mapping[str, _Entry] = {
    "digits": _Entry(DigitsDataset, digits_info, lazy_imports=("sklearn.datasets",)),
    "imagenet100": _Entry(ImageNet100, imagenet100_info, decodes_files=True),
    "synthetic": _Entry(SyntheticImages, synthetic_info),
}


def dataset_names() -> list[str]:
    return sorted(_REGISTRY)


def dataset_lazy_imports(name: str) -> tuple[str, ...]:
    """Modules that building data set ``name`` imports on first use (see ``_Entry.lazy_imports``)."""
    return _entry(name).lazy_imports


def dataset_decodes_files(name: str) -> bool:
    """Whether data set ``name``'s loader workers decode image files (synthetic images are made on
    the device, digits sit in memory)."""
    return _entry(name).decodes_files


def _entry(name: object) -> _Entry:
    if name not in _REGISTRY:
        raise DataError(f"unknown data set {name!r}; valid names: {dataset_names()}")
    return _REGISTRY[str(name)]


def _parameter_names(function: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "split"]


def _check_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    accepted = _parameter_names(_entry(name).builder)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise DataError(f"data set {name!r} has no argument(s) {unknown}; "
                        f"it accepts: {accepted}")


def build_dataset(name: str, split: str, **kwargs: Any) -> EpochDataset:
    """Build data set ``name`` ('digits' | 'imagenet100' | 'synthetic') for ``split``."""
    entry = _entry(name)
    require_split(split)
    _check_kwargs(name, kwargs)
    return entry.builder(split=split, **kwargs)


def dataset_info(name: str, **kwargs: Any) -> DatasetInfo:
    """Classes, channels and image size of ``name`` with these arguments; loads no data."""
    entry = _entry(name)
    _check_kwargs(name, kwargs)
    relevant = set(_parameter_names(entry.describe))
    return entry.describe(**{k: v for k, v in kwargs.items() if k in relevant})


class DataSettings(Protocol):
    """The data config slice ``data_kwargs`` reads: ``synapse.config.DataConfig`` (or a DictConfig of it),
    described here because the config package sits above this one and cannot be imported."""

    @property
    def name(self) -> str: ...
    @property
    def root(self) -> str | None: ...
    @property
    def image_size(self) -> int: ...
    @property
    def augment(self) -> bool: ...
    @property
    def decode(self) -> str: ...
    @property
    def gpu_decode_share(self) -> float: ...
    @property
    def synthetic_train_size(self) -> int: ...
    @property
    def synthetic_val_size(self) -> int: ...
    @property
    def synthetic_num_classes(self) -> int: ...
    @property
    def synthetic_in_chans(self) -> int: ...


def data_kwargs(data: DataSettings, seed: int, split: str | None = None) -> dict[str, Any]:
    """Keyword arguments of ``build_dataset`` (for ``split``) or ``dataset_info`` (split None)."""
    if data.name == "digits":
        return {"image_size": data.image_size, **({"augment": data.augment, "seed": seed} if split == "train" else {})}
    if data.name == "imagenet100":
        return {"root": data.root, "image_size": data.image_size,
                **({"seed": seed, "decode": data.decode, "gpu_share": data.gpu_decode_share} if split else {})}
    kwargs = {"image_size": data.image_size, "num_classes": data.synthetic_num_classes,
              "in_chans": data.synthetic_in_chans}
    if split:
        size = data.synthetic_train_size if split == "train" else data.synthetic_val_size
        kwargs.update(num_samples=size, seed=seed)
    return kwargs


def train_samples(data: DataSettings) -> int | None:
    """How many training samples the configured data set holds, found without loading any image;
    None where only reading its files would tell (imagenet100). What a run's schedule length, and
    so a check of steps against it before any work, is computed from."""
    if data.name == "digits":
        from synapse.data.digits import digits_split_indices

        return len(digits_split_indices("train"))
    if data.name == "synthetic":
        return int(data.synthetic_train_size)
    return None


def build_datasets(data: DataSettings, seed: int) -> tuple[EpochDataset, EpochDataset]:
    return (build_dataset(data.name, "train", **data_kwargs(data, seed, "train")),
            build_dataset(data.name, "val", **data_kwargs(data, seed, "val")))
