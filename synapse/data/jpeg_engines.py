"""JPEG decoding on the GPU's hardware JPEG engines (NVJPG), through nvImageCodec.

Data-centre GPUs since the A100 carry fixed-function JPEG decoders beside the SMs (an H200 has
seven). torchvision's nvJPEG decodes on the SMs instead, with the entropy decoding on the host:
on an H200 host that is ~25 ms of host time and ~8 ms of GPU time per 256-image batch, which a
training step sharing the GPU and the interpreter pays for (ViT-B/16 -> ResNet-50 fed by nvJPEG
with 2 loader workers ran at 0.90 of resident data). The engines take both off the step.

nvImageCodec is optional (``pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg``, or the cu12
pair). Without it, or on a GPU without engines, ``hardware_jpeg_decoder`` returns None and the
device decodes with nvJPEG as before. Only the engines' backend is enabled: nvImageCodec's own
CPU and CUDA fallbacks would duplicate what ``synapse.data.jpeg`` already does and names.
"""
from __future__ import annotations

import contextlib
import io
import os
import threading
from functools import cache

import torch

# Host threads nvImageCodec may use per decoder: the engines need the host only to parse headers and
# queue work, and its default (one per core) would give every rank of a host a thread per core.
_HOST_THREADS = 2


class HardwareJpegDecoder:
    """Batches of JPEG files -> uint8 [3, H, W] RGB tensors on the device, or None per file the
    engines did not decode (the caller decodes those another way). One nvImageCodec decoder, made
    once (it reports each optional codec library it cannot load as it is made), its calls taken in
    turn: several threads may finish batches at once (``DevicePrefetcher``), and the engines are
    one resource anyway."""

    def __init__(self, device: torch.device) -> None:
        from nvidia import nvimgcodec  # optional: hardware_jpeg_decoder checks it imports

        self.device = device
        self._nvimgcodec = nvimgcodec
        # What the other decoders produce: RGB in storage order (EXIF orientation not applied, as
        # torchvision's decode_jpeg and the CPU path do), 8 bits, interleaved (the engines' layout).
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                               allow_any_depth=False, sample_format=nvimgcodec.SampleFormat.I_RGB)
        self._decoder = nvimgcodec.Decoder(device_id=device.index or 0, max_num_cpu_threads=_HOST_THREADS,
                                           backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)])
        self._lock = threading.Lock()

    def decode(self, datas: list[torch.Tensor]) -> list[torch.Tensor | None]:
        streams = [self._nvimgcodec.CodeStream(data.numpy()) for data in datas]
        stream = torch.cuda.current_stream(self.device)  # the finisher's side stream: results are ordered on it
        with self._lock:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=stream.cuda_stream)
        return [_as_chw(image, self.device) for image in images]


def _as_chw(image, device: torch.device) -> torch.Tensor | None:
    if image is None:
        return None
    pixels = torch.as_tensor(image, device=device)  # shares the decoder's buffer, and keeps it alive
    if pixels.dim() != 3 or pixels.shape[-1] != 3 or pixels.dtype != torch.uint8:
        return None
    return pixels.permute(2, 0, 1)


@cache
def hardware_jpeg_decoder(device: torch.device) -> HardwareJpegDecoder | None:
    """The engines' decoder for ``device``, or None where nvImageCodec is missing, the GPU has no
    engines, or a probe JPEG does not come back right. Probed once per device and process."""
    if device.type != "cuda":
        return None
    try:
        with _quiet_stderr():  # it reports every optional codec library it cannot load
            decoder = HardwareJpegDecoder(device)
            probe = _probe_jpeg()
            decoded = decoder.decode([probe])[0]
    except Exception:  # ImportError, or any failure of an optional library: fall back to nvJPEG
        return None
    if decoded is None or tuple(decoded.shape) != (3, 48, 64):
        return None
    return decoder


def _probe_jpeg() -> torch.Tensor:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 60, 30)).save(buffer, format="JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (nvImageCodec's C++ writes there directly) while it loads."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
