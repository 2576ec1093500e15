"""Image files -> uint8 batches in loader workers -> normalised float batches on the device.

Two decode placements, one geometry (``crops``):

* ``cpu``: the worker decodes, crops and resizes; it ships uint8 [3, S, S] pixels (4x less
  than float32 through shared memory and the host-to-device link).
* ``device``: the worker reads the file's bytes and draws the crop; the training process
  decodes the whole batch on the device (nvJPEG on CUDA) and crops there. Files the device
  decoder should not get (CMYK, progressive, not a JPEG) are decoded by the worker as above,
  so a batch may mix both.

Normalisation always runs on the device. A file nobody can decode becomes the data set's mean
colour (zero after normalisation) with its own label, and a ``BadSample`` travels with the
batch so the training process can count and report it; the label is kept because a
labels-only rank (the last pipeline rank) must agree with rank 0 without reading images.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from synapse.data.crops import CropDraw, neutral_image, normalize_uint8, resized_crop
from synapse.data.jpeg import BadSample, UnreadableImage, decode_cpu, decode_many, device_decodable, read_bytes


@dataclass
class HostSample:
    """One sample as a worker ships it: decoded pixels, or file bytes for the device."""

    index: int
    path: str
    label: int
    draw: CropDraw
    pixels: torch.Tensor | None = None  # uint8 [3, S, S], finished geometry
    encoded: torch.Tensor | None = None  # uint8 file bytes, decoded on the device
    bad: BadSample | None = None


@dataclass
class ImageBatch:
    """A worker's batch: ``labels`` for every slot; pixels for the slots decoded on the host,
    bytes and crop draws for the slots the device decodes."""

    labels: torch.Tensor
    decoded_slots: list[int]
    decoded: torch.Tensor | None  # uint8 [n, 3, S, S]
    encoded_slots: list[int]
    encoded: list[torch.Tensor]
    draws: list[CropDraw]
    sources: list[tuple[int, str]]  # (index, path) of each encoded slot, to name a bad file
    bad: list[BadSample] = field(default_factory=list)

    def pin_memory(self) -> "ImageBatch":
        """Called by the DataLoader's pinning thread: pinned pixels copy asynchronously.
        (File bytes stay pageable: the decoder reads them on the host.)"""
        self.labels = self.labels.pin_memory()
        if self.decoded is not None:
            self.decoded = self.decoded.pin_memory()
        return self


def load_sample(index: int, path: str, label: int, draw: CropDraw, size: int,
                mean: tuple[float, ...], for_device: bool) -> HostSample:
    """Read one file; keep its bytes for the device decoder when it can take them, else
    decode and crop here. Never raises for a bad file: it becomes a stand-in with a reason."""
    sample = HostSample(index, path, label, draw)
    try:
        data = read_bytes(path)
    except OSError as error:
        return _stand_in(sample, size, mean, f"cannot read the file: {error}")
    if for_device and device_decodable(data):
        sample.encoded = data
        return sample
    try:
        sample.pixels = resized_crop(decode_cpu(data), draw, size)
    except UnreadableImage as error:
        return _stand_in(sample, size, mean, str(error))
    return sample


def _stand_in(sample: HostSample, size: int, mean: tuple[float, ...], reason: str) -> HostSample:
    sample.pixels = neutral_image(len(mean), size, mean)
    sample.bad = BadSample(sample.index, sample.path, reason)
    return sample


def collate_samples(samples: list[HostSample]) -> ImageBatch:
    decoded = [(slot, s.pixels) for slot, s in enumerate(samples) if s.encoded is None]
    encoded = [(slot, s) for slot, s in enumerate(samples) if s.encoded is not None]
    return ImageBatch(
        labels=torch.tensor([s.label for s in samples], dtype=torch.int64),
        decoded_slots=[slot for slot, _ in decoded],
        decoded=torch.stack([pixels for _, pixels in decoded]) if decoded else None,
        encoded_slots=[slot for slot, _ in encoded],
        encoded=[s.encoded for _, s in encoded],
        draws=[s.draw for _, s in encoded],
        sources=[(s.index, s.path) for _, s in encoded],
        bad=[s.bad for s in samples if s.bad is not None],
    )


def finish_on_device(batch: ImageBatch, device: torch.device, size: int, mean: tuple[float, ...],
                     std: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode the encoded slots on ``device``, crop them, merge with the host-decoded slots,
    normalise. Files the device could not decode are appended to ``batch.bad``."""
    count = batch.labels.shape[0]
    pixels = torch.empty((count, len(mean), size, size), dtype=torch.uint8, device=device)
    if batch.decoded is not None:
        slots = torch.tensor(batch.decoded_slots, device=device)
        pixels.index_copy_(0, slots, batch.decoded.to(device, non_blocking=True))
    if batch.encoded:
        crops = []
        for image, draw, (index, path) in zip(decode_many(batch.encoded, device), batch.draws, batch.sources):
            if isinstance(image, str):
                batch.bad.append(BadSample(index, path, image))
                crops.append(neutral_image(len(mean), size, mean).to(device))
            else:
                crops.append(resized_crop(image, draw, size))
        pixels.index_copy_(0, torch.tensor(batch.encoded_slots, device=device), torch.stack(crops))
    return normalize_uint8(pixels, mean, std), batch.labels.to(device, non_blocking=True)
