"""What to profile: a validated request, the device it names, and the key it is cached under.

A request is plain data checked on construction (a misspelt role, dtype or device fails
here, before a model is built); whether the named CUDA device exists is checked when the
device is resolved, because that depends on the machine, not on the request.
"""
from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from synapse.models import model_spec

ROLES = ("teacher", "student")
DTYPES = ("fp32", "bf16")
# How the blocks will run: "eager" (kernels issued one by one: at small micro-batches the host's
# launch time) or "graphed" (replayed CUDA graphs: the GPU's own time; see profiling.graphed).
LAUNCHES = ("eager", "graphed")
PRECISIONS = ("auto", *DTYPES)
_DEVICE_PATTERN = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


class ProfilerError(ValueError):
    """A profiling request that cannot be measured; the message names the value and the fix."""


def _check_positive(label: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfilerError(f"{label}={value!r} must be an integer >= {minimum}")


def check_device_spec(device: str) -> None:
    """Syntax only: 'cpu', 'cuda' or 'cuda:N' (existence is checked by ``resolve_device``)."""
    match = _DEVICE_PATTERN.match(device) if isinstance(device, str) else None
    if match is None or (match.group(1) == "cpu" and match.group(2) is not None):
        raise ProfilerError(f"device={device!r} is not a device; use 'cpu', 'cuda' or 'cuda:N' (e.g. 'cuda:0')")


def resolve_device(device: str) -> torch.device:
    """The torch device a spec names, checked against this machine."""
    check_device_spec(device)
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ProfilerError(f"device={device!r} but no CUDA device is visible; profile with device='cpu'")
    index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise ProfilerError(f"device={device!r} does not exist (this machine has {count} GPUs: "
                            f"cuda:0..cuda:{count - 1}); choose one of those")
    return torch.device("cuda", index)


def resolve_precision(precision: str, device: str) -> str:
    """Map a trainer precision ('auto' | 'fp32' | 'bf16') to a profile dtype, as the trainer does:
    'auto' is bf16 autocast on CUDA and fp32 on CPU."""
    if precision not in PRECISIONS:
        raise ProfilerError(f"precision={precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    check_device_spec(device)
    return "bf16" if device.startswith("cuda") else "fp32"


def device_name(device: torch.device) -> str:
    """A human-readable name of the hardware: the GPU model, or the CPU model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux: fall back to what platform knows
        pass
    return platform.processor() or platform.machine() or "cpu"


@dataclass(frozen=True)
class ProfileRequest:
    """One model in one role, measured at one micro-batch size, precision and device."""

    model_name: str
    role: str
    micro_batch: int
    dtype: str = "fp32"
    device: str = "cpu"
    num_classes: int = 1000
    in_chans: int = 3
    image_size: int = 224
    warmup: int = 3
    repeats: int = 10
    launch: str = "eager"

    def __post_init__(self) -> None:
        model_spec(self.model_name)  # raises ModelError (a ValueError) listing the known names
        if self.role not in ROLES:
            raise ProfilerError(f"role={self.role!r} is unknown; use 'teacher' (forward only, no_grad) "
                                f"or 'student' (forward + backward)")
        if self.dtype not in DTYPES:
            raise ProfilerError(f"dtype={self.dtype!r} is unknown; use one of {', '.join(DTYPES)} "
                                f"(bf16 runs under torch.autocast)")
        check_device_spec(self.device)
        if self.launch not in LAUNCHES:
            raise ProfilerError(f"launch={self.launch!r} is unknown; use 'eager' or 'graphed'")
        if self.launch == "graphed" and not self.device.startswith("cuda"):
            raise ProfilerError(f"launch='graphed' needs a CUDA device, got device={self.device!r}; "
                                "profile with launch='eager' on the CPU")
        for label in ("micro_batch", "num_classes", "in_chans", "image_size", "repeats"):
            _check_positive(label, getattr(self, label))
        _check_positive("warmup", self.warmup, minimum=0)

    @property
    def is_teacher(self) -> bool:
        return self.role == "teacher"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def cache_key(request: ProfileRequest, hardware: str) -> str:
    """File stem of a cached profile: everything that changes the measured numbers.

    warmup and repeats are left out on purpose: they change the noise, not what is measured.
    """
    return "_".join([
        request.model_name, request.role, f"mb{request.micro_batch}", request.dtype, _slug(hardware)[:48],
        f"{request.image_size}px", f"{request.in_chans}ch", f"{request.num_classes}cls",
        # graphed profiles taken before blocks were timed inside one graph are measured again
        *(["graphed2"] if request.launch == "graphed" else []),
    ])
