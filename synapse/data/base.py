"""What every Synapse data set shares: a description, an epoch, and batch access."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from synapse.data.errors import DataError

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
    """

    info: DatasetInfo
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = require_positive_int("epoch", epoch, minimum=0)

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    def get_batch(
        self, indices: Sequence[int], epoch: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked ``(images [B, C, H, W], labels int64 [B])``, equal to what a DataLoader
        collates from the same indices. ``epoch``, when given, is set first."""
        if epoch is not None:
            self.set_epoch(epoch)
        if len(indices) == 0:
            raise DataError("get_batch needs at least one index, got an empty list")
        items = [self[index] for index in indices]
        images = torch.stack([image for image, _ in items])
        labels = torch.tensor([label for _, label in items], dtype=torch.int64)
        return images, labels

    def _normalize_index(self, index: int) -> int:
        """Python-style negative indices, mapped to the non-negative index they mean so
        that a sample's seeded augmentation does not depend on how it was addressed."""
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"index {index} out of range for a data set of {size} samples")
        return index % size
