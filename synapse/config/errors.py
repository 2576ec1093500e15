"""``ConfigError`` and the small checks every part of the validation uses."""
from __future__ import annotations

import math


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key and how to fix it."""


def fail(key: str, problem: str, fix: str) -> None:
    raise ConfigError(f"{key}: {problem}. Fix: {fix}")


def positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    finite(key, value)
    if value is None or (value < 0 if allow_zero else value <= 0):
        bound = ">= 0" if allow_zero else "> 0"
        fail(key, f"must be {bound}, got {value}", f"set {key} to a value {bound}")


def finite(key: str, value: float | None) -> None:
    """NaN passes every comparison (``nan <= 0`` is False), so it is refused explicitly, as is inf."""
    if isinstance(value, float) and not math.isfinite(value):
        fail(key, f"must be a finite number, got {value}", f"set {key} to a finite value (nan and inf are never valid)")
