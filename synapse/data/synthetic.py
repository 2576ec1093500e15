"""Synthetic images for throughput benchmarks: nothing stored, nothing read from disk.

Sample ``i`` is generated from a generator seeded by (seed, split, i), so any index can be
produced on its own, in any order, in any worker, and always comes out the same. Images
are standard-normal noise (roughly what normalised real images look like to a model's
first layer) and labels uniform; there is nothing to learn, only work to time.

Drawing 150k normal numbers per 224 px image costs about a millisecond of host time, which
caps a data loader worker near 1,000 images/s: slower than one H200 trains. So each split
draws a pool of ``POOL_SIZE`` noise images once (per process) and sample ``i`` is pool image
``i % POOL_SIZE`` rolled by an offset drawn from its own generator: still deterministic per
index, still noise, and about a memory copy per sample.
"""
from __future__ import annotations

import torch

from synapse.data.base import DatasetInfo, EpochDataset, require_positive_int, require_split
from synapse.data.seeding import seeded_generator

SYNTHETIC_DEFAULT_NUM_SAMPLES = 1024
SYNTHETIC_DEFAULT_NUM_CLASSES = 100
SYNTHETIC_DEFAULT_IMAGE_SIZE = 224
SYNTHETIC_DEFAULT_IN_CHANS = 3
POOL_SIZE = 64


def synthetic_info(
    num_classes: int = SYNTHETIC_DEFAULT_NUM_CLASSES,
    image_size: int = SYNTHETIC_DEFAULT_IMAGE_SIZE,
    in_chans: int = SYNTHETIC_DEFAULT_IN_CHANS,
) -> DatasetInfo:
    return DatasetInfo(
        num_classes=require_positive_int("num_classes", num_classes),
        in_chans=require_positive_int("in_chans", in_chans),
        image_size=require_positive_int("image_size", image_size),
    )


class SyntheticImages(EpochDataset):
    """``num_samples`` random ``[in_chans, image_size, image_size]`` images with labels.

    Train and val draw from different streams. The epoch does not change the items (no
    augmentation); ``set_epoch`` exists so callers treat all data sets alike.
    """

    def __init__(
        self,
        split: str = "train",
        num_samples: int = SYNTHETIC_DEFAULT_NUM_SAMPLES,
        num_classes: int = SYNTHETIC_DEFAULT_NUM_CLASSES,
        image_size: int = SYNTHETIC_DEFAULT_IMAGE_SIZE,
        in_chans: int = SYNTHETIC_DEFAULT_IN_CHANS,
        seed: int = 0,
    ) -> None:
        self.split = require_split(split)
        self.info = synthetic_info(num_classes, image_size, in_chans)
        self.num_samples = require_positive_int("num_samples", num_samples)
        self.seed = require_positive_int("seed", seed, minimum=0)
        self.epoch = 0

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        index = self._normalize_index(index)
        generator = seeded_generator(self.seed, self.split, index)
        label = int(torch.randint(self.info.num_classes, (1,), generator=generator))
        shift = int(torch.randint(self.info.image_size * self.info.image_size, (1,), generator=generator))
        image = self._pool()[index % POOL_SIZE]
        return torch.roll(image.flatten(1), shift, dims=1).view_as(image), label

    def _pool(self) -> torch.Tensor:
        if getattr(self, "_images", None) is None:
            generator = seeded_generator(self.seed, self.split, -1)
            shape = (POOL_SIZE, self.info.in_chans, self.info.image_size, self.info.image_size)
            self._images = torch.randn(shape, generator=generator)
        return self._images
