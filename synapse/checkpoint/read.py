"""Reading a checkpoint: its manifest and format version, its checksums, and its contents,
without ever running code from it.

Loading verifies every checksum and uses ``torch.load(weights_only=True)`` (and, for DCP's
index, an unpickler that rebuilds only its metadata types; `dcp.py`): a checkpoint can never
execute code. A damaged checkpoint raises ``CheckpointError``; ``latest_valid_checkpoint``
skips it for the newest one that verifies.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch

from synapse.checkpoint import dcp as dcp_store
from synapse.checkpoint.layout import (
    FORMAT_VERSION,
    MANIFEST,
    READABLE_VERSIONS,
    STATE_FILE,
    CheckpointError,
    CheckpointRef,
    IncompatibleCheckpointError,
    UnsafeCheckpointError,
    list_checkpoints,
    sha256_of,
)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a finished checkpoint whose format this Synapse reads (else CheckpointError)."""
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: it is not a finished checkpoint")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{manifest_path} is corrupt: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{manifest_path} is corrupt: expected a JSON object with a 'files' table")
    check_format_version(manifest, path)
    return manifest


def check_format_version(manifest: dict[str, Any], path: Path) -> int:
    """The manifest's format version, if this Synapse reads it.

    Checkpoints written before the manifest recorded a version are version 1 (the format has
    not changed since), so they stay readable.
    """
    version = manifest.get("format_version", 1)
    if version in READABLE_VERSIONS and not isinstance(version, bool):
        return version
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        why = "it was written by a newer Synapse: update this installation to resume it"
    else:
        why = f"{version!r} is not a version any Synapse release wrote: the manifest was edited or damaged"
    raise IncompatibleCheckpointError(
        f"{path} has checkpoint format version {version!r}, this Synapse reads version {FORMAT_VERSION}; "
        f"resume it with the Synapse release that wrote it ({why}), or start afresh with resume=null in a new run dir "
        f"(versions {', '.join(map(str, READABLE_VERSIONS))} are read)")


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check that every file the manifest names exists with the recorded size and checksum."""
    path = Path(path)
    manifest = read_manifest(path)
    for name, info in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if file.stat().st_size != info["bytes"] or sha256_of(file) != info["sha256"]:
            raise CheckpointError(f"{path}: {name} is corrupt or truncated (checksum mismatch)")
    return manifest


def latest_valid_checkpoint(root: Path, on_skip=None) -> CheckpointRef | None:
    """The newest checkpoint whose files verify; corrupt ones are reported through ``on_skip`` and skipped."""
    for ref in reversed(list_checkpoints(root)):
        try:
            verify_checkpoint(ref.path)
            return ref
        except CheckpointError as exc:
            if on_skip is not None:
                on_skip(ref, exc)
    return None


def load_file(path: Path, *, mmap: bool = False) -> Any:
    """``torch.load`` that can only rebuild tensors and plain containers: a pickle holding code is refused.

    ``mmap`` maps the tensors' bytes instead of reading them (for checks that only need shapes).
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:  # weights_only met an object it will not rebuild
        raise UnsafeCheckpointError(f"{path} cannot be read safely ({exc}); Synapse loads checkpoints with "
                                    f"weights_only=True and never runs code from them; use a checkpoint "
                                    f"written by Synapse") from exc
    except Exception as exc:  # a truncated or foreign file
        raise CheckpointError(f"{path} cannot be read ({type(exc).__name__}: {exc}); it is damaged or not a "
                              f"Synapse checkpoint file") from exc


def load_student_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Every rank's part as one model state dict and one optimizer state, keyed by parameter name."""
    model, optim, _ = load_training_state(path)
    return model, optim


def load_training_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]],
                                             dict[int, dict[str, Any]]]:
    """``load_student_state`` plus each rank's RNG states (rank -> states; ranks that saved none left out)."""
    manifest = verify_checkpoint(path)
    if manifest.get("format_version", 1) >= 2:
        flat = read_dcp(Path(path), dcp_store.read_state)
        return (*dcp_store.split_state(flat), dcp_store.rng_by_rank(flat))
    model: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] = {}
    rng: dict[int, dict[str, Any]] = {}
    for name in sorted(manifest["files"]):
        if name.startswith("shard_"):
            shard = load_file(Path(path) / name)
            model.update(shard["model"])
            optim.update(shard["optim"])
            if shard.get("rng") is not None:
                rng[int(name[len("shard_"):-len(".pt")])] = shard["rng"]
    return model, optim, rng


def load_run_state(path: Path) -> dict[str, Any]:
    return load_file(Path(path) / STATE_FILE)


def read_dcp(path: Path, read):
    """``read(path)`` of the DCP part, its failures said as this module's errors."""
    try:
        try:
            return read(path)
        except dcp_store.CheckpointException as exc:  # DCP wraps a failure of its read (a BaseException)
            raise dcp_store.first_failure(exc) from exc
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(f"{path} cannot be read safely ({exc}); Synapse loads checkpoints with "
                                    f"weights_only=True and never runs code from them; use a checkpoint "
                                    f"written by Synapse") from exc
    except Exception as exc:
        raise CheckpointError(f"{path} cannot be read ({type(exc).__name__}: {exc}); it is damaged or not a "
                              f"Synapse checkpoint") from exc
