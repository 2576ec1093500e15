"""Atomic, verifiable, partition-independent checkpoints.

Layout of one checkpoint (a directory, so K ranks can each write their shard)::

    checkpoints/step_00000120/
        shard_00.pt      student parameters, buffers and optimizer state of the blocks rank 0 owns,
        shard_01.pt      keyed by the *original* parameter names (any partition can load them)
        state.pt         step, epoch, sampler position, scheduler, RNG states, extra component state
        manifest.json    format version, step, sha256 and size of every file: written last

A checkpoint is written into ``step_X.tmp-<nonce>/``, every file fsync'ed, the manifest written,
and the directory renamed into place, so a process killed mid-write leaves at most a stray
``.tmp`` directory and the previous checkpoint untouched. Loading verifies every checksum and
uses ``torch.load(weights_only=True)``: a checkpoint can never execute code.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or from an incompatible version."""


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def shard_name(rank: int) -> str:
    return f"shard_{rank:02d}.pt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_tensor_file(obj: Any, path: Path) -> None:
    """torch.save and fsync, so the bytes are on disk before the manifest names them."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def new_nonce() -> str:
    """A fresh suffix for a temporary checkpoint directory (ranks share the one rank 0 draws)."""
    return uuid.uuid4().hex[:8]


def begin_checkpoint(root: Path, step: int, nonce: str | None = None) -> Path:
    """Create the temporary directory every rank writes its files into."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{step_dir_name(step)}.tmp-{nonce or new_nonce()}"
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


def commit_checkpoint(tmp: Path, step: int, meta: dict[str, Any] | None = None) -> Path:
    """Checksum every file, write the manifest, and atomically move the directory into place."""
    files = {p.name: {"sha256": sha256_of(p), "bytes": p.stat().st_size}
             for p in sorted(tmp.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"format_version": FORMAT_VERSION, "step": step, "files": files, "meta": meta or {}}
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = tmp.parent / step_dir_name(step)
    if final.exists():
        # The same step saved again (e.g. right after a resume). A verified copy holds the same
        # training state: keep it, so there is never a moment without that step on disk.
        try:
            verify_checkpoint(final)
            shutil.rmtree(tmp)
            return final
        except CheckpointError:
            os.replace(final, final.with_name(f"{final.name}.corrupt-{new_nonce()}"))
    os.replace(tmp, final)
    _fsync_dir(tmp.parent)
    return final


def read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: it is not a finished checkpoint")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{manifest_path} is corrupt: {exc}") from exc
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {version}, this Synapse reads version "
                              f"{FORMAT_VERSION}; resume it with the Synapse release that wrote it")
    return manifest


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


def list_checkpoints(root: Path) -> list[CheckpointRef]:
    """Finished checkpoints under ``root``, oldest first (temporary directories are ignored)."""
    if not Path(root).is_dir():
        return []
    refs = [CheckpointRef(p, int(m.group(1))) for p in Path(root).iterdir()
            if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(refs, key=lambda r: r.step)


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


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints, and stray temporary directories."""
    refs = list_checkpoints(root)
    for ref in refs[: max(0, len(refs) - keep)]:
        shutil.rmtree(ref.path, ignore_errors=True)
    for stray in [*Path(root).glob("step_*.tmp-*"), *Path(root).glob("step_*.corrupt-*")]:
        shutil.rmtree(stray, ignore_errors=True)


def load_file(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_student_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Merge every shard into one model state dict and one optimizer state, keyed by parameter name."""
    manifest = verify_checkpoint(path)
    model: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] = {}
    for name in sorted(manifest["files"]):
        if name.startswith("shard_"):
            shard = load_file(Path(path) / name)
            model.update(shard["model"])
            optim.update(shard["optim"])
    return model, optim


def load_run_state(path: Path) -> dict[str, Any]:
    return load_file(Path(path) / STATE_FILE)
