"""Embedded default data set: scikit-learn's handwritten digits (no download).

1797 real 8x8 grey images of the digits 0-9, shipped inside scikit-learn. They are
turned into tensors once (scaled to [0, 1], upsampled, normalised with the train split's
mean/std) and then served from memory: the default run must train a teacher and a
student in minutes on two CPU cores, so no PIL or per-item decoding.

Split: stratified 80/20, fixed by ``DIGITS_SPLIT_SEED`` and independent of the run
seed, so "val" is always the same 359 images. Within each class, samples are ordered by
a BLAKE2b hash of (split seed, sample index) rather than a library RNG, so the split
cannot change with a numpy or scikit-learn upgrade.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from synapse.data.base import DataError, DatasetInfo, EpochDataset, require_positive_int, require_split
from synapse.data.seeding import derive_seed, seeded_generator

DIGITS_NUM_CLASSES = 10
DIGITS_IN_CHANS = 1
DIGITS_NATIVE_SIZE = 8
DIGITS_DEFAULT_IMAGE_SIZE = 32
DIGITS_SPLIT_SEED = 1797
DIGITS_VAL_FRACTION = 0.2
INTERPOLATIONS = ("bilinear", "nearest")
_PIXEL_MAX = 16.0  # load_digits pixels are integers 0..16


@dataclass(frozen=True)
class Normalization:
    """Scalar mean/std of the (upsampled, [0, 1]-scaled) train pixels."""

    mean: float
    std: float


def digits_info(image_size: int = DIGITS_DEFAULT_IMAGE_SIZE) -> DatasetInfo:
    require_positive_int("image_size", image_size, minimum=DIGITS_NATIVE_SIZE)
    return DatasetInfo(DIGITS_NUM_CLASSES, DIGITS_IN_CHANS, image_size)


@lru_cache(maxsize=1)
def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [N, 8, 8] in [0, 1], labels int64 [N]); imported lazily because
    scikit-learn takes about a second to import."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / _PIXEL_MAX).astype(np.float32)
    return images, bunch.target.astype(np.int64)


def digits_split_indices(split: str) -> np.ndarray:
    """Sorted indices (into load_digits' order) of the train or val split."""
    require_split(split)
    _, labels = _raw_digits()
    chosen: list[np.ndarray] = []
    for label in range(DIGITS_NUM_CLASSES):
        members = np.flatnonzero(labels == label)
        ranked = sorted(members.tolist(), key=lambda i: derive_seed(DIGITS_SPLIT_SEED, i))
        num_val = round(len(ranked) * DIGITS_VAL_FRACTION)
        chosen.append(np.array(ranked[:num_val] if split == "val" else ranked[num_val:]))
    return np.sort(np.concatenate(chosen))


def _upsample(images: np.ndarray, image_size: int, interpolation: str) -> torch.Tensor:
    batch = torch.from_numpy(images).unsqueeze(1)  # [N, 1, 8, 8]
    if image_size == DIGITS_NATIVE_SIZE:
        return batch.clone()
    # align_corners=False: the usual pixel-area convention, no half-pixel shift at edges.
    extra = {"align_corners": False} if interpolation == "bilinear" else {}
    return F.interpolate(batch, size=(image_size, image_size), mode=interpolation, **extra)


@dataclass(frozen=True)
class _PreparedDigits:
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]  # split -> (images, labels)
    normalization: Normalization


@lru_cache(maxsize=4)
def _prepared(image_size: int, interpolation: str) -> _PreparedDigits:
    """Normalised tensors of both splits plus the train statistics, computed once."""
    images, labels = _raw_digits()
    train_idx, val_idx = digits_split_indices("train"), digits_split_indices("val")
    train = _upsample(images[train_idx], image_size, interpolation)
    norm = Normalization(mean=train.mean().item(), std=train.std().item())
    val = _upsample(images[val_idx], image_size, interpolation)
    splits = {
        split: ((pixels - norm.mean) / norm.std, torch.from_numpy(labels[idx]))
        for split, pixels, idx in (("train", train, train_idx), ("val", val, val_idx))
    }
    return _PreparedDigits(splits, norm)


def _shift_spans(shift: int, size: int) -> tuple[slice, slice]:
    """(destination, source) slices that move a row/column range by ``shift`` pixels."""
    return slice(max(shift, 0), size + min(shift, 0)), slice(max(-shift, 0), size - max(shift, 0))


def translate(image: torch.Tensor, dy: int, dx: int, fill: float) -> torch.Tensor:
    """Shift ``image`` [C, H, W] by (dy, dx) pixels; uncovered pixels get ``fill``."""
    _, height, width = image.shape
    out = torch.full_like(image, fill)
    if abs(dy) >= height or abs(dx) >= width:
        return out
    (dst_rows, src_rows), (dst_cols, src_cols) = _shift_spans(dy, height), _shift_spans(dx, width)
    out[:, dst_rows, dst_cols] = image[:, src_rows, src_cols]
    return out


class DigitsDataset(EpochDataset):
    """scikit-learn digits as normalised ``[1, image_size, image_size]`` float32 tensors.

    ``interpolation``: "bilinear" (default; smooth strokes, closer to natural images) or
    "nearest" (blocky, exact copies of the 8x8 pixels).
    ``augment`` (train split only; val is never augmented): random translation by up to
    ``max_shift`` pixels of the output image in each direction, drawn from a generator
    seeded by (seed, epoch, index), so a resumed run sees the same shifted images.
    The uncovered border is filled with the normalised background (pixel value 0).
    """

    def __init__(
        self,
        split: str = "train",
        image_size: int = DIGITS_DEFAULT_IMAGE_SIZE,
        interpolation: str = "bilinear",
        augment: bool = False,
        max_shift: int = 2,
        seed: int = 0,
    ) -> None:
        self.split = require_split(split)
        self.info = digits_info(image_size)
        if interpolation not in INTERPOLATIONS:
            raise DataError(f"interpolation must be one of {list(INTERPOLATIONS)}, "
                            f"got {interpolation!r}")
        require_positive_int("max_shift", max_shift, minimum=0)
        if max_shift >= image_size:
            raise DataError(f"max_shift={max_shift} must be smaller than image_size={image_size}")
        self.seed = require_positive_int("seed", seed, minimum=0)
        self.augment = bool(augment) and split == "train" and max_shift > 0
        self.max_shift = max_shift
        prepared = _prepared(image_size, interpolation)
        # Shared with the cache: read-only by convention, items are returned as copies.
        self.images, self.labels = prepared.splits[split]
        self.normalization = prepared.normalization
        self.background = (0.0 - self.normalization.mean) / self.normalization.std
        self.epoch = 0

    def __len__(self) -> int:
        return self.images.shape[0]

    def labels_of(self, indices) -> torch.Tensor:
        return self.labels[[self._normalize_index(i) for i in indices]].clone()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        index = self._normalize_index(index)
        image, label = self.images[index], int(self.labels[index])
        if not self.augment:
            return image.clone(), label
        generator = seeded_generator(self.seed, self.epoch, index)
        shift = torch.randint(-self.max_shift, self.max_shift + 1, (2,), generator=generator)
        dy, dx = shift.tolist()
        return translate(image, dy, dx, self.background), label
