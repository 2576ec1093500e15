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

from synapse.data.crops import CropDraw, neutral_image, normalize_uint8, resized_crop, resized_crops
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
    """A worker's batch: ``labels`` for every slot; pixels for the slots decoded on the host;
    for the slots the device decodes, the files' bytes packed into one tensor (``encoded``, cut
    by ``encoded_sizes``) and their crop draws packed into one (``attempts``, ``flips``).

    Packed because every tensor a worker ships costs a shared-memory segment and a file
    descriptor passed to the training process: two per sample would be 512 per batch.
    """

    labels: torch.Tensor
    decoded_slots: list[int]
    decoded: torch.Tensor | None  # uint8 [n, 3, S, S]
    encoded_slots: list[int]
    encoded: torch.Tensor | None  # uint8 [sum of sizes]: the files, back to back
    encoded_sizes: list[int]
    attempts: torch.Tensor | None  # float64 [m, CROP_ATTEMPTS, 4], None for validation crops
    flips: list[bool]
    sources: list[tuple[int, str]]  # (index, path) of each encoded slot, to name a bad file
    bad: list[BadSample] = field(default_factory=list)

    def pin_memory(self) -> ImageBatch:
        """Called by the DataLoader's pinning thread: pinned pixels copy asynchronously.
        (File bytes stay pageable: the decoder reads them on the host.)"""
        self.labels = self.labels.pin_memory()
        if self.decoded is not None:
            self.decoded = self.decoded.pin_memory()
        return self

    def encoded_files(self) -> list[torch.Tensor]:
        return list(torch.split(self.encoded, self.encoded_sizes)) if self.encoded_slots else []

    def encoded_draws(self) -> list[CropDraw]:
        if self.attempts is None:
            return [CropDraw(None, flip) for flip in self.flips]
        return [CropDraw(attempts, flip) for attempts, flip in zip(self.attempts, self.flips)]


def on_device_share(index: int, share: float) -> bool:
    """Whether sample ``index`` is one of the ``share`` of samples decoded on the device.

    A fixed function of the index (a multiplicative hash), never of timing, so the same
    sample takes the same decoder in every run and after a resume.
    """
    return ((index * 2654435761) % 2**32) < share * 2**32


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
    decoded = [(slot, s) for slot, s in enumerate(samples) if s.encoded is None]
    encoded = [(slot, s) for slot, s in enumerate(samples) if s.encoded is not None]
    attempts = [s.draw.attempts for _, s in encoded]
    return ImageBatch(
        labels=torch.tensor([s.label for s in samples], dtype=torch.int64),
        decoded_slots=[slot for slot, _ in decoded],
        decoded=torch.stack([s.pixels for _, s in decoded]) if decoded else None,
        encoded_slots=[slot for slot, _ in encoded],
        encoded=torch.cat([s.encoded for _, s in encoded]) if encoded else None,
        encoded_sizes=[s.encoded.numel() for _, s in encoded],
        attempts=torch.stack(attempts) if encoded and attempts[0] is not None else None,
        flips=[s.draw.flip for _, s in encoded],
        sources=[(s.index, s.path) for _, s in encoded],
        bad=[s.bad for s in samples if s.bad is not None],
    )


def finish_on_device(batch: ImageBatch, device: torch.device, size: int, mean: tuple[float, ...],
                     std: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode the encoded slots on ``device``, crop them, merge with the host-decoded slots,
    normalise. Files the device could not decode are appended to ``batch.bad``."""
    host = batch.decoded.to(device, non_blocking=True) if batch.decoded is not None else None
    made = _decode_and_crop(batch, device, size, mean) if batch.encoded_slots else None
    if made is None or host is None:  # one kind only: already in slot order
        pixels = host if made is None else made
    else:
        pixels = torch.empty((batch.labels.shape[0], *host.shape[1:]), dtype=torch.uint8, device=device)
        pixels.index_copy_(0, torch.tensor(batch.decoded_slots, device=device), host)
        pixels.index_copy_(0, torch.tensor(batch.encoded_slots, device=device), made)
    return normalize_uint8(pixels, mean, std), batch.labels.to(device, non_blocking=True)


def _decode_and_crop(batch: ImageBatch, device: torch.device, size: int, mean: tuple[float, ...]) -> torch.Tensor:
    images, draws = [], batch.encoded_draws()
    for slot, image in enumerate(decode_many(batch.encoded_files(), device)):
        if isinstance(image, str):
            index, path = batch.sources[slot]
            batch.bad.append(BadSample(index, path, image))
            image = neutral_image(len(mean), size, mean).to(device)
            draws[slot] = CropDraw(None, False)  # the stand-in is already the output size
        images.append(image)
    return _crops(images, draws, size)


def _crops(images: list[torch.Tensor], draws: list[CropDraw], size: int) -> torch.Tensor:
    """On CUDA the batched resampler; on the CPU (tests) torch's per-image uint8 kernel."""
    if images[0].device.type == "cuda":
        return resized_crops(images, draws, size)
    return torch.stack([resized_crop(image, draw, size) for image, draw in zip(images, draws)])
