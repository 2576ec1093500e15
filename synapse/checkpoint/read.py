"""Reading a checkpoint: its manifest and format version, its checksums, and its contents,
without ever running code from it.

Loading verifies every checksum and uses ``torch.load(weights_only=True)`` (and, for DCP's
index, an unpickler that rebuilds only its metadata types; `dcp.py`): a checkpoint can never
execute code. A damaged checkpoint raises ``CheckpointError``; ``latest_valid_checkpoint``
skips it for the newest one that verifies, and ``resume_checkpoint`` refuses a directory whose
checkpoints are all damaged rather than starting over. Checkpoints are ordered by the step
their manifest records, never by their directory names.
"""
from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass
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
    NoIntactCheckpointError,
    UnsafeCheckpointError,
    list_checkpoints,
    sha256_of,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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
    _check_manifest_fields(manifest, manifest_path)
    return manifest


def _check_manifest_fields(manifest: dict[str, Any], manifest_path: Path) -> None:
    """Every value a reader relies on, so an edited or damaged manifest is named as such instead
    of failing later as a bare KeyError or TypeError."""
    def corrupt(problem: str) -> CheckpointError:
        return CheckpointError(f"{manifest_path} is corrupt: {problem}; the manifest was edited or damaged")

    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise corrupt(f"its 'step' is {step!r}, not a step number")
    for name, info in manifest["files"].items():
        # A plain name: a manifest can never make a reader open a file outside its checkpoint.
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise corrupt(f"it names the file {name!r}, which is not a plain file name")
        if not isinstance(info, dict):
            raise corrupt(f"the entry of {name} is {info!r}, not a table of 'sha256' and 'bytes'")
        size, digest = info.get("bytes"), info.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise corrupt(f"the entry of {name} has no valid 'bytes' (found {size!r}; every file needs its "
                          f"'sha256' and its size in 'bytes')")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise corrupt(f"the entry of {name} has no valid 'sha256' (found {digest!r}; every file needs its "
                          f"'sha256' and its size in 'bytes')")
    run = manifest.get("run")
    if run is not None and not isinstance(run, str):
        raise corrupt(f"its 'run' is {run!r}, not a run identity")


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
    """Check that every file a load reads is named by the manifest and has the recorded size and
    checksum, and that the training state holds the step the manifest says.

    Checking only the files the manifest names would pass anything once those entries are gone
    (an emptied file list vouched for a flipped tensor byte), so the files a load reads are
    required: ``state.pt``, and DCP's ``.metadata`` with every storage file it points to (version
    2) or at least one ``shard_XX.pt`` (version 1).
    """
    path = Path(path)
    manifest = read_manifest(path)
    files = manifest["files"]
    version = manifest.get("format_version", 1)
    required = [STATE_FILE, *([dcp_store.METADATA_FILE] if version >= 2 else [])]
    if version < 2 and not any(name.startswith("shard_") for name in files):
        required.append("shard_00.pt")
    for name in required:
        _require_listed(path, files, name)
    for name, info in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if file.stat().st_size != info["bytes"] or sha256_of(file) != info["sha256"]:
            raise CheckpointError(f"{path}: {name} is corrupt or truncated (checksum mismatch)")
    if version >= 2:  # the index is authentic now: every file it reads tensors from must be too
        for name in sorted(read_dcp(path, dcp_store.storage_files)):
            _require_listed(path, files, name)
    state = load_file(path / STATE_FILE)
    saved_step = state.get("step") if isinstance(state, dict) else None
    if saved_step != manifest["step"]:
        raise CheckpointError(f"{path}: {MANIFEST} says step {manifest['step']} but {STATE_FILE} holds step "
                              f"{saved_step!r}; the manifest was edited or damaged")
    return manifest


def _require_listed(path: Path, files: dict[str, Any], name: str) -> None:
    if name not in files and not (path / name).is_file():
        raise CheckpointError(f"{path}: {name} is missing")
    if name not in files:
        raise CheckpointError(f"{path}: {MANIFEST} does not list {name}, which a load reads, so nothing vouches "
                              f"for its bytes; the manifest was edited or damaged")


@dataclass(frozen=True)
class ListedCheckpoint:
    """A finished checkpoint directory with what its manifest says (or why it cannot be read)."""

    ref: CheckpointRef  # its step: the manifest's where readable, else the directory name's
    named_step: int  # the step in the directory's name
    manifest: dict[str, Any] | None
    error: CheckpointError | None  # why the manifest cannot be read (then ``manifest`` is None)

    @property
    def run(self) -> str | None:
        return None if self.manifest is None else self.manifest.get("run")


def ordered_checkpoints(root: Path) -> list[ListedCheckpoint]:
    """Finished checkpoints under ``root``, oldest first by the step their manifests record.

    A directory renamed or copied past the newest (a copy of step 10 as ``step_00000099``) counts
    as the step it holds; of two holding the same step, the one whose name says so counts as the
    newer. A checkpoint whose manifest cannot be read sits where its name puts it.
    """
    listed = []
    for ref in list_checkpoints(root):
        try:
            manifest = read_manifest(ref.path)
            listed.append(ListedCheckpoint(CheckpointRef(ref.path, manifest["step"]), ref.step, manifest, None))
        except CheckpointError as exc:
            listed.append(ListedCheckpoint(ref, ref.step, None, exc))
    return sorted(listed, key=lambda c: (c.ref.step, c.named_step == c.ref.step, c.named_step))


def latest_valid_checkpoint(root: Path, on_skip=None) -> CheckpointRef | None:
    """The newest checkpoint (by its manifest's step) whose files verify.

    Each checkpoint passed over is reported through ``on_skip(ref, error)``: the damaged ones
    tried before the one chosen, and any whose directory name put it after the one chosen
    although its manifest holds an older step (so the user learns why it was not resumed).
    """
    listed = ordered_checkpoints(root)
    chosen, reported = None, set()

    def skip(item: ListedCheckpoint, error: CheckpointError) -> None:
        reported.add(item.ref.path)
        if on_skip is not None:
            on_skip(item.ref, error)

    for item in reversed(listed):
        try:
            if item.error is not None:
                raise item.error
            verify_checkpoint(item.ref.path)
            chosen = item.ref
            break
        except CheckpointError as exc:
            skip(item, exc)
    if chosen is None:
        return None  # every one was tried, and reported
    for item in listed:
        if item.ref.path not in reported and item.ref != chosen and item.named_step > chosen.step > item.ref.step:
            skip(item, CheckpointError(
                f"{item.ref.path} is named step {item.named_step} but its manifest says step {item.ref.step} (a "
                f"renamed or copied checkpoint): it counts as step {item.ref.step}, older than step {chosen.step}"))
    return chosen


def resume_checkpoint(root: Path, on_skip=None) -> CheckpointRef | None:
    """What ``resume=auto`` continues from: ``latest_valid_checkpoint``, or None where ``root``
    holds no checkpoint at all. Where it holds some and none is intact, ``NoIntactCheckpointError``
    names each one's damage: starting from step 0 there would silently lose all finished work,
    so that is only done when the user asks for it (a fresh run, in a new directory)."""
    skipped: list[tuple[CheckpointRef, CheckpointError]] = []

    def note(ref: CheckpointRef, error: CheckpointError) -> None:
        skipped.append((ref, error))
        if on_skip is not None:
            on_skip(ref, error)

    chosen = latest_valid_checkpoint(root, note)
    if chosen is not None or not skipped:
        return chosen
    damage = "; ".join(f"{ref.path.name}: {error}" for ref, error in skipped)
    raise NoIntactCheckpointError(
        f"resume=auto: none of the {len(skipped)} checkpoints in {root} is intact, so there is nothing to continue "
        f"from ({damage}). Nothing was started and nothing was deleted. Fix: put back an intact copy of one of them "
        f"(e.g. from a backup); or, to start over from step 0, run with resume=null in a new run_dir "
        f"(run_dir=<new directory>), which leaves these checkpoints as they are for inspection")


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
