"""Image geometry shared by every decode path: seeded crop boxes drawn on the host, applied
on whatever device holds the decoded pixels; and normalisation of uint8 batches.

Why split drawing from applying: with GPU decoding an image's size is only known after the
main process decoded it, while the randomness must depend on (seed, epoch, index) alone so
that any worker count, decode path and resume gives the same crops. So a training crop is
drawn as *relative* numbers (area fraction, log aspect ratio, two position fractions, for
each of RandomResizedCrop's ten attempts, plus a flip bit) and turned into pixels by
``crop_box`` once the size is known: the same arithmetic on the host for every path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from synapse.data.seeding import seeded_generator

CROP_SCALE = (0.08, 1.0)  # RandomResizedCrop's defaults
CROP_RATIO = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10
CENTER_CROP_FRACTION = 0.875  # the usual 224/256 resize-then-crop ratio


@dataclass(frozen=True)
class CropDraw:
    """One sample's training geometry, independent of the image size.

    ``attempts``: float64 [CROP_ATTEMPTS, 4] = (area fraction, log aspect ratio, top
    fraction, left fraction); ``flip``: mirror left-right. ``None`` attempts mean the
    deterministic validation crop (resize the short side to size/0.875, centre crop).
    """

    attempts: torch.Tensor | None
    flip: bool


VALIDATION_DRAW = CropDraw(None, False)


def draw_train_crop(*seed_parts: int | str) -> CropDraw:
    """RandomResizedCrop + horizontal flip parameters from a generator seeded by the parts."""
    generator = seeded_generator(*seed_parts)
    uniform = torch.rand((CROP_ATTEMPTS, 4), generator=generator, dtype=torch.float64)
    low, high = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    attempts = torch.stack([
        CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * uniform[:, 0],
        low + (high - low) * uniform[:, 1],
        uniform[:, 2],
        uniform[:, 3],
    ], dim=1)
    flip = bool(torch.rand((), generator=generator) < 0.5)
    return CropDraw(attempts, flip)


def crop_box(draw: CropDraw, height: int, width: int, size: int) -> tuple[int, int, int, int]:
    """(top, left, box height, box width) in pixels of a ``height`` x ``width`` image."""
    if draw.attempts is None:
        return _center_box(height, width, size)
    area = height * width
    for scale, log_ratio, top_u, left_u in draw.attempts.tolist():
        ratio = math.exp(log_ratio)
        w = int(round(math.sqrt(area * scale * ratio)))
        h = int(round(math.sqrt(area * scale / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(top_u * (height - h + 1)), height - h)
            left = min(int(left_u * (width - w + 1)), width - w)
            return top, left, h, w
    return _fallback_box(height, width)


def _center_box(height: int, width: int, size: int) -> tuple[int, int, int, int]:
    """The square that Resize(size / 0.875) + CenterCrop(size) keeps, in original pixels."""
    side = min(height, width, max(1, round(min(height, width) * CENTER_CROP_FRACTION)))
    return (height - side) // 2, (width - side) // 2, side, side


def _fallback_box(height: int, width: int) -> tuple[int, int, int, int]:
    """RandomResizedCrop's fallback after ten misses: the whole image, aspect clamped, centred."""
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif in_ratio > CROP_RATIO[1]:
        h, w = height, int(round(height * CROP_RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resized_crop(image: torch.Tensor, draw: CropDraw, size: int) -> torch.Tensor:
    """uint8 [C, H, W] -> uint8 [C, size, size]: crop, antialiased bilinear resize, flip.

    Runs on the image's device and returns uint8 on every path: on the CPU torch's uint8
    kernel, on CUDA float then rounded; they differ by at most a level, so the CPU and GPU
    paths differ by the decoder and that rounding.
    """
    top, left, h, w = crop_box(draw, image.shape[-2], image.shape[-1], size)
    patch = image[:, top:top + h, left:left + w].unsqueeze(0)
    if (h, w) != (size, size):
        if image.device.type == "cpu":  # torch's uint8 antialiased kernel: ~4x faster than float, within 1 level
            patch = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        else:
            patch = F.interpolate(patch.float(), size=(size, size), mode="bilinear", align_corners=False,
                                  antialias=True).round_().clamp_(0, 255).to(torch.uint8)
    if draw.flip:
        patch = patch.flip(-1)
    return patch.squeeze(0).contiguous()


def resized_crops(images: list[torch.Tensor], draws: list[CropDraw], size: int) -> torch.Tensor:
    """Batched ``resized_crop`` for a GPU: uint8 [C, H, W] images -> uint8 [N, C, size, size].

    One ``resized_crop`` per image costs about ten kernel launches from Python, which on a
    256-image batch holds the interpreter lock for tens of milliseconds that the training
    thread needs. Here images of equal size are resampled together by two batched matrix
    products whose rows are the antialiased bilinear (triangle) filter that
    ``F.interpolate(..., antialias=True)`` uses, restricted to each crop box; a flip reverses
    the column filter. Same arithmetic as ``resized_crop``'s float path, up to summation order.
    """
    channels, device = images[0].shape[0], images[0].device
    out = torch.empty((len(images), channels, size, size), dtype=torch.uint8, device=device)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault((image.shape[-2], image.shape[-1]), []).append(i)
    for (height, width), members in groups.items():
        boxes = torch.tensor([crop_box(draws[i], height, width, size) for i in members], dtype=torch.float32)
        rows = _filter_rows(boxes[:, 0], boxes[:, 2], height, size, device)  # [g, size, H]
        cols = _filter_rows(boxes[:, 1], boxes[:, 3], width, size, device)  # [g, size, W]
        flipped = torch.tensor([draws[i].flip for i in members], device=device)
        cols = torch.where(flipped.view(-1, 1, 1), cols.flip(1), cols)
        stack = torch.stack([images[i] for i in members]).float()  # [g, C, H, W]
        resampled = rows.unsqueeze(1) @ stack @ cols.transpose(1, 2).unsqueeze(1)  # [g, C, size, size]
        index = torch.tensor(members, device=device)
        out.index_copy_(0, index, resampled.round_().clamp_(0, 255).to(torch.uint8))
    return out


def _filter_rows(starts: torch.Tensor, lengths: torch.Tensor, full: int, size: int,
                 device: torch.device) -> torch.Tensor:
    """[N, size, full] float32: output pixel i of crop n = sum_j w[n, i, j] * input pixel j.

    torch's antialiased bilinear: scale = length / size, support = max(scale, 1), centre of
    output i at scale * (i + 0.5) inside the crop, weight of input j (inside the crop only)
    proportional to max(0, 1 - |j + 0.5 - centre| / support), normalised to sum 1.
    """
    starts, lengths = starts.to(device).view(-1, 1, 1), lengths.to(device).view(-1, 1, 1)
    scale = lengths / size
    support = scale.clamp(min=1.0)
    centre = starts + scale * (torch.arange(size, device=device, dtype=torch.float32).view(1, -1, 1) + 0.5)
    taps = torch.arange(full, device=device, dtype=torch.float32).view(1, 1, -1)
    weights = (1 - (taps + 0.5 - centre).abs() / support).clamp(min=0)
    weights = weights * ((taps >= starts) & (taps < starts + lengths))
    return weights / weights.sum(-1, keepdim=True)


def normalize_uint8(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 [B, C, H, W] (0..255) -> float32 (x / 255 - mean) / std, on the images' device."""
    shift, scale = _normalization_constants(tuple(mean), tuple(std), images.device)
    return (images.float() - shift) / scale


@lru_cache(maxsize=16)
def _normalization_constants(mean: tuple[float, ...], std: tuple[float, ...],
                             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Made once per device: a host-to-device copy per batch would be a small synchronous copy each time."""
    shift = torch.tensor([255.0 * m for m in mean], device=device).view(1, -1, 1, 1)
    scale = torch.tensor([255.0 * s for s in std], device=device).view(1, -1, 1, 1)
    return shift, scale


def neutral_image(channels: int, size: int, mean: tuple[float, ...]) -> torch.Tensor:
    """The data set's mean colour as uint8 [C, size, size]: zero after normalisation, so a
    stand-in for an unreadable file carries no signal."""
    colour = torch.tensor([round(255 * m) for m in mean], dtype=torch.uint8)
    return colour.view(channels, 1, 1).expand(channels, size, size).clone()
