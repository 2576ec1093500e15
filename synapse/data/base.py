"""What every Synapse data set shares: a description, an epoch, batch access, and the one error
type of the data package (``DataError``) and its warning about what a folder scan left out
(``DataLayoutWarning``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate


class DataError(ValueError):
    """Bad data input (missing folder, unknown data set name, bad argument).

    A ``ValueError`` subclass so that callers validating a whole configuration can catch
    every bad-value error in one place; the message names the offending value and the fix.
    """


class DataLayoutWarning(UserWarning):
    """Something in a data folder was left out of the data set (the message says what, and why)."""


SPLITS = ("train", "val")


@dataclass(frozen=True)
class DatasetInfo:
    """Shape of what a data set produces; models are checked against it before any work."""

    num_classes: int
    in_chans: int
    image_size: int


def require_split(split: object) -> str:
    if split not in SPLITS:
        raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
    return str(split)


def require_positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class EpochDataset(Dataset[tuple[torch.Tensor, int]]):
    """Map-style data set whose items may depend on the epoch (seeded augmentation).

    Items are ``(image float32 [C, H, W], label int)``. With a DataLoader and
    ``num_workers > 0``, call ``set_epoch`` *before* ``iter(loader)``: workers take a
    copy of the data set when the iteration starts (keep ``persistent_workers=False``).

    The fast path splits an item in two, so that what crosses process boundaries and the
    host-to-device link is small (uint8 pixels, file bytes, a few integers) and the float
    work happens on the training device:

    * ``host_item(index)`` runs in a loader worker; ``host_collate(items)`` makes the batch
      the worker ships (pinned by the loader if it has a ``pin_memory`` method or is tensors);
    * ``device_batch(host_batch, device)`` runs in the training process, on a side stream,
      and returns ``(images float32 [B, C, H, W], labels int64 [B])`` on ``device``.

    The defaults ship the finished float item (small data sets); ``get_batch`` and
    ``__getitem__`` of the subclasses that override them go through the same two halves on
    the CPU, so the tests' path and the GPU path are one code path.
    ``labels_of`` gives labels without reading any image (a last pipeline rank).
    """

    info: DatasetInfo
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = require_positive_int("epoch", epoch, minimum=0)

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    # ---------------------------------------------------------------- the two halves of a batch
    def host_item(self, index: int) -> Any:
        """What a loader worker produces for sample ``index`` (default: the finished item)."""
        return self[index]

    def host_collate(self, items: list[Any]) -> Any:
        """The batch a worker ships (default: stacked images and int64 labels)."""
        return default_collate(items)

    def device_batch(self, host_batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images float32, labels int64)`` on ``device`` from a ``host_collate`` batch."""
        images, labels = host_batch
        return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    def bind_device(self, device: torch.device) -> None:
        """Called before loading for ``device`` (before workers start): resolve choices such as
        where to decode. Default: nothing to choose."""

    @property
    def device_finishers(self) -> int:
        """How many threads finish host batches on the device at once (after ``bind_device``).
        One, unless finishing spends host time outside the interpreter lock (override)."""
        return 1

    def labels_of(self, indices: Sequence[int]) -> torch.Tensor:
        """int64 labels of ``indices`` without decoding images where the data set can (override)."""
        return torch.tensor([self[index][1] for index in indices], dtype=torch.int64)

    def get_batch(
        self, indices: Sequence[int], epoch: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked ``(images [B, C, H, W], labels int64 [B])`` on the CPU, equal to what the
        loader path produces from the same indices. ``epoch``, when given, is set first."""
        if epoch is not None:
            self.set_epoch(epoch)
        if len(indices) == 0:
            raise DataError("get_batch needs at least one index, got an empty list")
        host = self.host_collate([self.host_item(index) for index in indices])
        return self.device_batch(host, torch.device("cpu"))

    def _normalize_index(self, index: int) -> int:
        """Python-style negative indices, mapped to the non-negative index they mean so
        that a sample's seeded augmentation does not depend on how it was addressed."""
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"index {index} out of range for a data set of {size} samples")
        return index % size
