"""Block-wise model profiles in the CSV format written by TSPipe-based tools.

One CSV row describes one *block* (the unit a model is cut into) measured at one
micro-batch size::

    layer,forward_time_ms,backward_time_ms,input_activation_size_kb,
    output_activation_size_kb,accum_activation_size_kb,parameter_size_kb

Sizes are in KiB (1 KB = 1024 bytes: the shared ViT-L profile's input of
37632 KB is exactly 64 * 3 * 224 * 224 * 4 bytes). Optional metadata (model name,
micro-batch size, dtype, device) lives in a JSON sidecar ``<csv>.meta.json`` so
that the CSV itself stays byte-compatible with the existing tools; the shared
profiles have no sidecar and were measured at micro-batch 64 in fp32
(see ``SHARED_PROFILE_MICRO_BATCH``).

Pure module: csv + json + dataclasses, no torch, no pickle, no eval.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PROFILE_COLUMNS: tuple[str, ...] = (
    "layer",
    "forward_time_ms",
    "backward_time_ms",
    "input_activation_size_kb",
    "output_activation_size_kb",
    "accum_activation_size_kb",
    "parameter_size_kb",
)
NUMERIC_COLUMNS: tuple[str, ...] = PROFILE_COLUMNS[1:]
BYTES_PER_KB = 1024
# Micro-batch size and dtype at which /work/shared/data/synapse_profiles were measured.
SHARED_PROFILE_MICRO_BATCH = 64
SHARED_PROFILE_DTYPE = "float32"
_METADATA_KEYS = ("name", "model_name", "micro_batch", "dtype", "device")


class ProfileError(ValueError):
    """A profile file or value is malformed; the message says where and how to fix it."""


def _is_positive_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1


# Beyond these a value is a unit mistake or garbage, not a measurement: one block's pass taking over
# an hour, or a tensor over 10 TB. Accepted, they made the planner predict "step inf ms".
MAX_TIME_MS = 3.6e6
MAX_SIZE_KB = 1e10


def _check_quantity(value: float, where: str) -> None:
    if not math.isfinite(value):
        raise ProfileError(f"{where}: value {value!r} is not finite; re-run the profiler for this block")
    if value < 0:
        raise ProfileError(f"{where}: value {value!r} is negative; times and sizes must be >= 0 "
                           "(re-profile the model with mode=profile, or correct the value)")
    is_time = "time_ms" in where
    limit = MAX_TIME_MS if is_time else MAX_SIZE_KB
    if value > limit:
        what = "one block's time above 1 hour" if is_time else "a size above 10 TB"
        raise ProfileError(f"{where}: value {value!r} is implausibly large ({what}; the limit is {limit:g}); times "
                           "are in ms and sizes in KB: check the units, or re-profile the model with mode=profile")


@dataclass(frozen=True)
class BlockProfile:
    """Measurements of one block at the profile's micro-batch size (one CSV row)."""

    layer: str
    forward_time_ms: float
    backward_time_ms: float
    input_activation_size_kb: float
    output_activation_size_kb: float
    accum_activation_size_kb: float
    parameter_size_kb: float

    def __post_init__(self) -> None:
        if not self.layer:
            raise ProfileError("block layer name is empty; give every row a unique name such as 'layer0'")
        for column in NUMERIC_COLUMNS:
            _check_quantity(getattr(self, column), f"layer {self.layer!r}, column {column!r}")


@dataclass(frozen=True)
class ModelProfile:
    """An ordered sequence of block profiles plus optional measurement metadata."""

    name: str
    blocks: tuple[BlockProfile, ...]
    model_name: str | None = None
    micro_batch: int | None = None
    dtype: str | None = None
    device: str | None = None
    source: str | None = field(default=None, compare=False)  # the CSV it was read from, for records

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(self.blocks))
        if not self.blocks:
            raise ProfileError(f"profile {self.name!r} has no blocks; a model needs at least one block")
        seen: set[str] = set()
        for block in self.blocks:
            if block.layer in seen:
                raise ProfileError(
                    f"profile {self.name!r}: layer name {block.layer!r} appears twice; names must be unique")
            seen.add(block.layer)
        if self.micro_batch is not None and not _is_positive_int(self.micro_batch):
            raise ProfileError(
                f"profile {self.name!r}: micro_batch={self.micro_batch!r} must be a positive integer or None")

    def __len__(self) -> int:
        return len(self.blocks)

    def column(self, name: str) -> np.ndarray:
        """One numeric column as a float64 array (in the file's units: ms or KB)."""
        if name not in NUMERIC_COLUMNS:
            raise ProfileError(f"unknown column {name!r}; expected one of {', '.join(NUMERIC_COLUMNS)}")
        return np.array([getattr(block, name) for block in self.blocks], dtype=np.float64)

    def metadata(self) -> dict[str, object]:
        return {key: getattr(self, key) for key in _METADATA_KEYS}


def metadata_path(csv_path: str | Path) -> Path:
    """Where the sidecar metadata of a profile CSV lives: ``<csv>.meta.json``."""
    path = Path(csv_path)
    return path.with_name(path.name + ".meta.json")


def _parse_cell(text: str | None, path: Path, line: int, layer: str, column: str) -> float:
    where = f"{path}: line {line}, layer {layer!r}, column {column!r}"
    if text is None or text.strip() == "":
        raise ProfileError(f"{where}: value is missing; every row needs all {len(PROFILE_COLUMNS)} columns")
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{where}: {text!r} is not a number; write a decimal such as 1.5") from None
    _check_quantity(value, where)
    return value


def _check_header(header: list[str] | None, path: Path) -> list[str]:
    """The header's column names, stripped; refuses a file without one, or with wrong columns."""
    if header is None:
        raise ProfileError(f"{path}: file is empty; expected the header line {','.join(PROFILE_COLUMNS)}")
    stripped = [name.strip() for name in header]
    missing = [name for name in PROFILE_COLUMNS if name not in stripped]
    extra = [name for name in stripped if name not in PROFILE_COLUMNS]
    duplicated = sorted({name for name in stripped if stripped.count(name) > 1})
    problems = [f"{what} columns {names}" for what, names in
                (("missing", missing), ("unexpected", extra), ("duplicated", duplicated)) if names]
    if problems:
        raise ProfileError(
            f"{path}: the header (line 1) has {', '.join(problems)}; the header must be exactly "
            f"{','.join(PROFILE_COLUMNS)} (the format of TSPipe-based tools and of mode=profile)"
        )
    return stripped


def _parse_row(row: list[str], header: list[str], path: Path, line: int) -> BlockProfile:
    if len(row) != len(header):
        raise ProfileError(
            f"{path}: line {line} has {len(row)} fields but the header has {len(header)}; "
            "fix the row so that it has one value per column"
        )
    cells = dict(zip(header, row))
    layer = cells["layer"].strip()
    if not layer:
        raise ProfileError(f"{path}: line {line}, column 'layer' is empty; give the block a unique name")
    values = {column: _parse_cell(cells[column], path, line, layer, column) for column in NUMERIC_COLUMNS}
    return BlockProfile(layer=layer, **values)


def _load_metadata(csv_path: Path) -> dict[str, Any]:
    """The sidecar's keys (of ``_METADATA_KEYS``) and values, each checked to be None or of its field's type."""
    meta_file = metadata_path(csv_path)
    if not meta_file.exists():
        return {}
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as error:
        raise ProfileError(
            f"{meta_file}: not valid JSON ({error}); delete it or rewrite it with write_profile_csv") from None
    if not isinstance(meta, dict):
        raise ProfileError(f"{meta_file}: expected a JSON object with keys {list(_METADATA_KEYS)}")
    unknown = sorted(set(meta) - set(_METADATA_KEYS))
    if unknown:
        raise ProfileError(f"{meta_file}: unknown keys {unknown}; allowed keys are {list(_METADATA_KEYS)}")
    for key, value in meta.items():
        expected = int if key == "micro_batch" else str
        if value is not None and (isinstance(value, bool) or not isinstance(value, expected)):
            raise ProfileError(f"{meta_file}: {key}={value!r} must be {expected.__name__} or null")
    return meta


def load_profile_csv(path: str | Path) -> ModelProfile:
    """Read a profile CSV (and its optional ``.meta.json`` sidecar), validating every cell."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file; check the path (profiles are *.csv)")
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = _check_header(next(reader, None), path)
        blocks = [
            _parse_row(row, header, path, reader.line_num)
            for row in reader
            if any(cell.strip() for cell in row)  # tolerate blank trailing lines
        ]
    if not blocks:
        raise ProfileError(f"{path}: header but no block rows; profile the model again")
    meta = _load_metadata(path)
    name = meta.pop("name", None) or path.stem
    try:
        return ModelProfile(name=name, blocks=tuple(blocks), source=str(path), **meta)
    except ProfileError as error:
        raise ProfileError(f"{path}: {error}") from None


def write_profile_csv(profile: ModelProfile, path: str | Path) -> Path:
    """Write ``profile`` as CSV plus its ``.meta.json`` sidecar; floats round-trip exactly."""
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(PROFILE_COLUMNS)
        for block in profile.blocks:
            # repr() is the shortest string that parses back to the same float.
            writer.writerow([block.layer, *(repr(float(getattr(block, c))) for c in NUMERIC_COLUMNS)])
    # The sidecar is always written so that a stale one can never describe a new CSV.
    metadata_path(path).write_text(json.dumps(profile.metadata(), indent=2) + "\n")
    return path


def scale_to_micro_batch(profile: ModelProfile, micro_batch: int, from_micro_batch: int | None = None) -> ModelProfile:
    """Estimate the profile at another micro-batch size.

    Approximation: times and activation sizes are scaled linearly with the batch,
    parameter sizes are unchanged. Activation sizes are exactly linear; times are
    not (small batches under-use a GPU, so scaling 64 -> 8 under-estimates times).
    Re-profile at the target size when the prediction matters.
    """
    source = profile.micro_batch if from_micro_batch is None else from_micro_batch
    if source is None:
        raise ProfileError(
            f"profile {profile.name!r} does not record its micro-batch size; pass from_micro_batch "
            f"(the shared TSPipe profiles were measured at {SHARED_PROFILE_MICRO_BATCH})"
        )
    for label, value in (("micro_batch", micro_batch), ("from_micro_batch", source)):
        if not _is_positive_int(value):
            raise ProfileError(f"{label}={value!r} must be a positive integer")
    factor = micro_batch / source
    scaled_columns = [c for c in NUMERIC_COLUMNS if c != "parameter_size_kb"]
    blocks = tuple(
        dataclasses.replace(block, **{c: getattr(block, c) * factor for c in scaled_columns})
        for block in profile.blocks
    )
    return dataclasses.replace(profile, blocks=blocks, micro_batch=micro_batch)


TIME_COLUMNS: tuple[str, ...] = ("forward_time_ms", "backward_time_ms")


def profile_at_micro_batch(measured: Sequence[ModelProfile], micro_batch: float) -> ModelProfile:
    """The profile at ``micro_batch`` images from the same model measured at several micro-batch sizes.

    A block's time is not proportional to its images: a pass pays per-call costs (launches, the
    framework's own work) whatever it holds, so halving a micro-batch saves less than half its time.
    Each block's time is therefore read off the measurements piecewise linearly between the two
    measured sizes around ``micro_batch``, and along the nearest two beyond them (never below
    proportional scaling from the smallest size, never below the largest size's time above it).
    With one measured size it is that size's time scaled in proportion (``scale_to_micro_batch``).
    Activation sizes are exactly proportional; parameter sizes do not change.
    """
    if not measured:
        raise ProfileError("no measured profiles given; pass the model's profile at one micro-batch size or more")
    if not (isinstance(micro_batch, numbers.Real) and math.isfinite(micro_batch) and micro_batch > 0):
        raise ProfileError(f"micro_batch={micro_batch!r} must be a positive number of images")
    first = measured[0]
    for profile in measured:
        if profile.micro_batch is None:
            raise ProfileError(f"profile {profile.name!r} does not record its micro-batch size; profiles at "
                               f"several sizes need it (re-profile with mode=profile, which writes it)")
        if [b.layer for b in profile.blocks] != [b.layer for b in first.blocks]:
            raise ProfileError(f"profiles {first.name!r} and {profile.name!r} have different blocks; give profiles "
                               f"of one model at several micro-batch sizes")
    by_size = {int(p.micro_batch or 0): p for p in measured}  # every micro_batch checked above
    if len(by_size) != len(measured):
        raise ProfileError(f"profiles of {first.name!r} repeat a micro-batch size "
                           f"{sorted(int(p.micro_batch or 0) for p in measured)}; give one profile per size")
    sizes = sorted(by_size)
    nearest = min(sizes, key=lambda s: abs(s - micro_batch))
    base = by_size[nearest]
    blocks = []
    for index, block in enumerate(base.blocks):
        values = {c: getattr(block, c) * micro_batch / nearest for c in NUMERIC_COLUMNS
                  if c not in TIME_COLUMNS and c != "parameter_size_kb"}
        for column in TIME_COLUMNS:
            times = [getattr(by_size[s].blocks[index], column) for s in sizes]
            values[column] = _piecewise_time(sizes, times, float(micro_batch))
        blocks.append(dataclasses.replace(block, **values))
    return dataclasses.replace(base, blocks=tuple(blocks), micro_batch=max(1, round(micro_batch)))


def _piecewise_time(sizes: list[int], times: list[float], size: float) -> float:
    """One block's time at ``size`` images from its times at the measured ``sizes`` (ascending)."""
    if len(sizes) == 1:
        return times[0] * size / sizes[0]
    if size <= sizes[0]:
        s0, s1, t0, t1 = sizes[0], sizes[1], times[0], times[1]
        return max(t0 + (t1 - t0) * (size - s0) / (s1 - s0), t0 * size / s0)
    if size >= sizes[-1]:
        s0, s1, t0, t1 = sizes[-2], sizes[-1], times[-2], times[-1]
        return max(t1 + (t1 - t0) * (size - s1) / (s1 - s0), t1)
    upper = next(i for i, s in enumerate(sizes) if s >= size)
    s0, s1, t0, t1 = sizes[upper - 1], sizes[upper], times[upper - 1], times[upper]
    # Between two times >= 0 the line stays >= 0, but its rounding can land a hair below (hypothesis found
    # -6.7e-198 between a subnormal time and zero), which a profile refuses as negative.
    return max(0.0, t0 + (t1 - t0) * (size - s0) / (s1 - s0))
