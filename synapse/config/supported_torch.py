"""The torch releases Synapse runs on, checked before any work starts.

The floor is the oldest release the suite has run on: 2.11, the GPU image's (the default suite on
its CPU ranks passed but for one model-gradient test of efficientnet_b0, and the GPU tests on one
H200: experiments/results/h200/torch211_suite_2026-12-03), besides 2.14 here. On 2.9 every launch fails:
its elastic ``LaunchConfig`` has no ``signals_to_handle``, through which the supervisor turns
Ctrl-C and SIGTERM into "checkpoint and stop" (``synapse/launch/interrupt.py``).
"""
from __future__ import annotations

import torch

from synapse.config.errors import ConfigError

OLDEST_SUPPORTED = (2, 11)


class UnsupportedTorchError(ConfigError):
    """The installed torch is older than Synapse supports; the message says which to install."""


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``version`` (default: the installed torch), local tags like +cu130 dropped."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def require_supported_torch(version: str | None = None) -> None:
    found = version or torch.__version__
    if torch_version(found) < OLDEST_SUPPORTED:
        oldest = ".".join(map(str, OLDEST_SUPPORTED))
        raise UnsupportedTorchError(
            f"torch {found} is installed but Synapse needs torch >= {oldest} (it is tested on 2.11 and 2.14; "
            f"older releases lack launcher features it uses). Fix: pip install 'torch>={oldest}' "
            f"'torchvision>=0.26'")
