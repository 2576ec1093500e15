"""Reading and decoding image files, on the CPU or on the training device, with bad files
turned into reasons instead of crashes.

Decoders, in the order tried:

* ``torchvision.io.decode_jpeg`` (libjpeg-turbo on the CPU, nvJPEG on CUDA, batched): RGB,
  grey-scale and CMYK JPEGs (grey and CMYK converted to RGB);
* PIL, for files that are not JPEGs despite their name (a PNG saved as ``.JPEG`` exists in
  the real ImageNet train set) and anything libjpeg rejects that PIL can still read.

A file no decoder reads (truncated, not an image) yields a reason string; the caller
replaces the sample and counts it (``BadSample``), so one bad file never ends an epoch.
"""
from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

# torchvision >= 0.29 warns on every decode call that its decoders move to TorchCodec; they
# still work, and a warning per batch would bury the ones about bad files.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)

_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_BASELINE_SOF = {0xC0, 0xC1}  # huffman-coded sequential: what nvJPEG's batched GPU path decodes
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers without a length field


@dataclass(frozen=True)
class BadSample:
    """A sample whose file could not be decoded and was replaced by a stand-in."""

    index: int
    path: str
    reason: str


class UnreadableImage(ValueError):
    """No decoder could read the bytes; the message says what each decoder said."""


def read_bytes(path: str | os.PathLike[str]) -> torch.Tensor:
    """The file's bytes as a uint8 1-D tensor (what a GPU decode needs shipped)."""
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    return torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def jpeg_frame(data: torch.Tensor) -> tuple[int, int] | None:
    """(SOF marker, colour components) from a JPEG header, or None if ``data`` is no JPEG.

    Reads markers up to the first start-of-frame; cheap enough for a loader worker to decide
    per file whether the GPU may decode it.
    """
    raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)
    if raw[:3] != b"\xff\xd8\xff":
        return None
    pos = 2
    while pos + 4 <= len(raw):
        if raw[pos] != 0xFF:
            return None
        marker = raw[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in _SOF_MARKERS:
            return (marker, raw[pos + 9]) if pos + 9 < len(raw) else None
        pos += 2 + int.from_bytes(raw[pos + 2:pos + 4], "big")
    return None


def device_decodable(data: torch.Tensor) -> bool:
    """Whether the batched device decoder should get these bytes: baseline JPEG, grey or
    YCbCr. CMYK, progressive and non-JPEG files are decoded on the CPU by the worker."""
    frame = jpeg_frame(data)
    return frame is not None and frame[0] in _BASELINE_SOF and frame[1] in (1, 3)


def decode_cpu(data: torch.Tensor) -> torch.Tensor:
    """uint8 [3, H, W] RGB from the file bytes; raises ``UnreadableImage`` with each decoder's reason."""
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB)
    except RuntimeError as jpeg_error:
        try:
            with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
                pixels = np.array(image.convert("RGB"))
        except Exception as pil_error:  # PIL raises many types (OSError, SyntaxError, ValueError ...)
            raise UnreadableImage(f"libjpeg: {_first_line(jpeg_error)}; PIL: {_first_line(pil_error)}") from None
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def decode_many(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | str]:
    """Decode a batch on ``device``: uint8 [3, H, W] tensors there, or a reason per bad file.

    On CUDA one batched nvJPEG call; if it fails (one bad file fails the whole call) each file
    is retried alone, then on the CPU, so only the truly unreadable ones come back as reasons.
    """
    if not datas:
        return []
    if device.type == "cuda":
        try:
            return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            return [_decode_one_on(data, device) for data in datas]
    return [_decode_one_on(data, device) for data in datas]


def _decode_one_on(data: torch.Tensor, device: torch.device) -> torch.Tensor | str:
    if device.type == "cuda":
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass  # the CPU decoders below say why, or read it
    try:
        return decode_cpu(data).to(device)
    except UnreadableImage as error:
        return str(error)


def device_decoding_available(device: torch.device) -> bool:
    """Whether torchvision can decode JPEGs on ``device`` (nvJPEG present on this build)."""
    if device.type != "cuda":
        return False
    probe = _tiny_jpeg()
    try:
        decode_jpeg([probe], mode=ImageReadMode.RGB, device=device)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _tiny_jpeg() -> torch.Tensor:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 60, 30)).save(buffer, format="JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[-1] if text else type(error).__name__)[:200]
