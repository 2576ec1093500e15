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

On the loader path the pool lives on the training device: a worker ships three integers per
sample (pool slot, roll, label) and ``device_batch`` gathers the rolled images there, so
the host generates and copies nothing per image. The pool is drawn on the CPU from the seed
and copied once per device, so every device produces the same images as ``__getitem__``.
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
        images, labels = self.get_batch([index])
        return images[0], int(labels[0])

    def host_item(self, index: int) -> tuple[int, int, int]:
        """(pool slot, roll, label) of sample ``index``: all a worker computes and ships."""
        index = self._normalize_index(index)
        generator = seeded_generator(self.seed, self.split, index)
        label = int(torch.randint(self.info.num_classes, (1,), generator=generator))
        shift = int(torch.randint(self.info.image_size * self.info.image_size, (1,), generator=generator))
        return index % POOL_SIZE, shift, label

    def host_collate(self, items: list[tuple[int, int, int]]) -> torch.Tensor:
        return torch.tensor(items, dtype=torch.int64)  # [B, 3]

    def device_batch(self, host_batch: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's pool image rolled by its shift (over the flattened pixels), on ``device``."""
        codes = host_batch.to(device, non_blocking=True)
        slots, shifts, labels = codes.unbind(1)
        pool = self._pool(device)
        pixels = pool.shape[-2] * pool.shape[-1]
        source = (torch.arange(pixels, device=device).unsqueeze(0) - shifts.unsqueeze(1)) % pixels  # [B, HW]
        flat = pool.flatten(2)[slots]  # [B, C, HW]
        images = torch.gather(flat, 2, source.unsqueeze(1).expand_as(flat))
        return images.view(-1, *pool.shape[1:]), labels

    def labels_of(self, indices) -> torch.Tensor:
        return torch.tensor([self.host_item(i)[2] for i in indices], dtype=torch.int64)

    def _pool(self, device: torch.device) -> torch.Tensor:
        pools = self.__dict__.setdefault("_pools", {})
        if str(device) not in pools:
            generator = seeded_generator(self.seed, self.split, -1)
            shape = (POOL_SIZE, self.info.in_chans, self.info.image_size, self.info.image_size)
            pools[str(device)] = torch.randn(shape, generator=generator).to(device)
        return pools[str(device)]
