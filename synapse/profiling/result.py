"""A measured profile plus how it was measured, and how both are stored on disk.

The planner reads only the CSV (and its ``.meta.json``, written by ``write_profile_csv``),
whose metadata keys are fixed by ``synapse.partitioning.profile``. Everything else a reader
may want to check (torch version, warmup/repeats, the whole-model sanity check) goes
into a third file next to them, ``<csv>.details.json``, so the CSV stays byte-compatible
with the TSPipe tools.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from synapse.partitioning import ModelProfile, load_profile_csv, metadata_path, write_profile_csv
from synapse.profiling.request import ProfilerError


@dataclass(frozen=True)
class ProfileDetails:
    """How a profile was measured, and whether its blocks add up to the whole model."""

    model_name: str
    role: str
    micro_batch: int
    dtype: str
    device: str  # the spec measured on, e.g. 'cuda:0'
    device_name: str  # the hardware, e.g. 'NVIDIA H200'
    torch_version: str
    timm_version: str
    image_size: int
    in_chans: int
    num_classes: int
    warmup: int
    repeats: int
    channels_last: bool
    accum_method: str  # 'saved_tensors' | 'cuda_peak_memory' | 'output_size'
    num_blocks: int
    blocks_forward_ms: float  # sum over blocks
    blocks_backward_ms: float
    whole_forward_ms: float  # the model called as one module
    whole_backward_ms: float
    forward_ratio: float  # blocks / whole: near 1 when cutting into blocks costs nothing
    backward_ratio: float | None  # None for the teacher (no backward)
    elapsed_s: float
    measured_at: str
    launch: str = "eager"  # 'eager' | 'graphed' (profiles written before graphed ones existed: eager)
    # The factor the CSV's block times carry (graphed: the whole replay over the blocks' sum; eager: 1)
    block_scale_forward: float = 1.0
    block_scale_backward: float = 1.0
    # how the blocks were timed: 'sweeps' (eager), 'in_graph' (inside one whole-model graph) or
    # 'block_replays' (each block's own graph, where this torch cannot time inside one)
    block_timing: str = "sweeps"


@dataclass(frozen=True)
class ProfileResult:
    profile: ModelProfile
    details: ProfileDetails | None  # None for a CSV that came without a details file


def details_path(csv_path: str | Path) -> Path:
    path = Path(csv_path)
    return path.with_name(path.name + ".details.json")


def save_result(result: ProfileResult, csv_path: str | Path) -> Path:
    """Write CSV, ``.meta.json`` and ``.details.json``; the CSV appears last, so a CSV on disk is complete."""
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=csv_path.parent, prefix=".writing-") as scratch:
        staged = write_profile_csv(result.profile, Path(scratch) / csv_path.name)
        if result.details is not None:
            details_path(staged).write_text(json.dumps(asdict(result.details), indent=2) + "\n")
            os.replace(details_path(staged), details_path(csv_path))
        os.replace(metadata_path(staged), metadata_path(csv_path))
        os.replace(staged, csv_path)
    return csv_path


def load_result(csv_path: str | Path) -> ProfileResult:
    """Read a profile written by ``save_result`` (or any profile CSV: then ``details`` is None)."""
    profile = load_profile_csv(csv_path)
    path = details_path(csv_path)
    if not path.exists():
        return ProfileResult(profile, None)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ProfilerError(f"{path}: not valid JSON ({error}); delete it and the CSV next to it "
                            f"to re-profile") from None
    names = {f.name for f in fields(ProfileDetails)}
    required = {f.name for f in fields(ProfileDetails) if f.default is MISSING}
    missing = sorted(required - set(data)) if isinstance(data, dict) else sorted(required)
    if missing:
        raise ProfilerError(f"{path}: missing {missing}; it was written by another version, delete it and "
                            f"the CSV next to it to re-profile")
    return ProfileResult(profile, ProfileDetails(**{name: data[name] for name in names if name in data}))
