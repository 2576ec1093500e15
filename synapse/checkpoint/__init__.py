"""Atomic, verifiable, partition-independent checkpoints.

Layout of one checkpoint (format version 2; a directory, so K ranks can each write their part)::

    checkpoints/step_00000120/
        .metadata        torch.distributed.checkpoint's global index of every tensor, by name
        __0_0.distcp     student parameters, buffers and optimizer state of the blocks rank 0 owns,
        __1_0.distcp     keyed by the *original* parameter names (any partition can load them; dcp.py),
                         and each rank's RNG states (a resume on the same ranks continues them)
        state.pt         step, epoch, sampler position, scheduler, RNG states, extra component state
        manifest.json    format version, step, sha256 and size of every file: written last

Version 1 (before DCP) held one ``shard_XX.pt`` per rank instead of the DCP files; it is still read (``load_student_state``), never written.

A checkpoint is written into ``step_X.tmp-<nonce>/``, every file fsync'ed, the manifest written,
and the directory renamed into place, so a process killed mid-write leaves at most a stray
``.tmp`` directory and the previous checkpoint untouched. Loading verifies every checksum and
uses ``torch.load(weights_only=True)`` (and, for DCP's index, an unpickler that rebuilds only its
metadata types): a checkpoint can never execute code.

A write that fails (disk full, read-only or vanished directory) raises ``CheckpointWriteError``
with the operating system's reason, the file it was writing and the newest checkpoint that is
still intact; the half-written file is removed, and the next save removes any temporary
directory a failed or killed save left behind *before* it writes (on a full disk, that space
is what the next checkpoint needs).

Manifests without ``format_version`` (none were written) count as version 1. Before a resume the
supervisor calls ``check_resumable`` (a given path) or ``check_run_checkpoints`` (resume=auto), so
a checkpoint of another version or another student fails once, before any worker starts.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from . import dcp as dcp_store

FORMAT_VERSION = 2  # what this Synapse writes: tensors in torch.distributed.checkpoint storage
READABLE_VERSIONS = (1, 2)  # 1: one torch.save shard per rank (before DCP), still loaded
MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_TEMPORARY = re.compile(r"^step_\d{8}\.(tmp|corrupt)-")


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or from an incompatible version."""


class IncompatibleCheckpointError(CheckpointError):
    """A sound checkpoint this run cannot continue from: another format version or another student.

    Unlike damage, which ``latest_valid_checkpoint`` skips, this is a mistake in the run's
    configuration, so ``check_run_checkpoints`` stops the run instead of silently starting over.
    """


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only or missing directory).

    An ``OSError`` with the original ``errno``; the message names the file, the reason, the
    newest checkpoint that is still intact and the fix. Nothing already on disk was changed.
    """


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holding objects other than tensors and plain containers (possibly code): never loaded."""


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def shard_name(rank: int) -> str:
    """A rank's file of a version-1 checkpoint (read only)."""
    return f"shard_{rank:02d}.pt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _ErrorKeepingWriter:
    """A file for ``torch.save`` that remembers the OSError of a failed write: torch reports a full
    disk as "unexpected pos 704 vs 598", so the real reason would otherwise be lost."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.file.flush()

    def fileno(self) -> int:
        return self.file.fileno()


class NonFiniteCheckpointError(CheckpointError):
    """A checkpoint would hold NaN or infinite values: it is never written."""


def first_nonfinite(obj: Any, name: str = "") -> str | None:
    """The name of the first floating-point tensor in ``obj`` (nested dicts, lists) holding NaN or inf."""
    if torch.is_tensor(obj):
        return name if obj.is_floating_point() and not bool(torch.isfinite(obj).all()) else None
    items = obj.items() if isinstance(obj, Mapping) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = first_nonfinite(value, f"{name}.{key}" if name else str(key))
        if found is not None:
            return found
    return None


def save_tensor_file(obj: Any, path: Path) -> None:
    """torch.save and fsync, so the bytes are on disk before the manifest names them.

    A failed write removes what it wrote and raises ``CheckpointWriteError`` with the OS's reason.
    Tensors holding NaN or inf are never written (``NonFiniteCheckpointError``): a resume from
    such a checkpoint could only diverge, and the previous checkpoint stays the newest.
    """
    path = Path(path)
    bad = first_nonfinite(obj)
    if bad is not None:
        raise NonFiniteCheckpointError(
            f"refusing to write {path}: tensor {bad!r} holds NaN or infinite values (training diverged); no "
            f"checkpoint with non-finite values is ever written, so the newest intact one in {path.parent.parent} "
            f"stays the newest. Fix: lower optim.lr (or raise optim.warmup_steps), then resume=auto from it")
    writer = None
    try:
        with open(path, "wb") as f:
            writer = _ErrorKeepingWriter(f)
            torch.save(obj, writer)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as exc:
        reason = exc if isinstance(exc, OSError) else (writer.error if writer is not None else None)
        if reason is None:
            raise  # not a write failure: a bug, shown as it is
        _remove_quietly(path)
        raise write_error(path, reason) from exc


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only directory keeps the piece; the next save's clean-up removes it


def write_error(target: Path, reason: OSError) -> CheckpointWriteError:
    """The error of a failed checkpoint write to ``target`` (a file or directory under the root)."""
    target = Path(target)
    root = target.parent
    while _TEMPORARY.match(root.name) or _STEP_DIR.match(root.name):
        root = root.parent
    try:
        intact = list_checkpoints(root)
    except OSError:
        intact = []
    newest = f"the newest intact checkpoint is {intact[-1].path}" if intact else "no checkpoint was finished yet"
    message = (f"cannot write checkpoint file {target}: {reason.strerror or reason}; {newest}, untouched. Fix: "
               f"free space on that filesystem or make {root} writable (or set run_dir to another disk), then "
               f"continue with resume=auto")
    return CheckpointWriteError(reason.errno, message)


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
    tmp = Path(root) / f"{step_dir_name(step)}.tmp-{nonce or new_nonce()}"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(tmp, exc) from exc
    return tmp


def remove_stray_temporaries(root: Path, keep: Path | None = None) -> None:
    """Delete what failed or killed saves left (``step_*.tmp-*``, ``step_*.corrupt-*``), except ``keep``.

    Called by the one process that commits, before the other files of a save are big: on a
    nearly full disk the space they hold is what the new checkpoint needs.
    """
    for stray in [*Path(root).glob("step_*.tmp-*"), *Path(root).glob("step_*.corrupt-*")]:
        if keep is None or stray != Path(keep):
            shutil.rmtree(stray, ignore_errors=True)


def commit_checkpoint(tmp: Path, step: int, meta: dict[str, Any] | None = None) -> Path:
    """Checksum every file, write the manifest, and atomically move the directory into place."""
    files = {p.name: {"sha256": sha256_of(p), "bytes": p.stat().st_size}
             for p in sorted(tmp.iterdir()) if p.is_file() and p.name != MANIFEST}
    # The layout says the version: DCP storage is 2, torch.save shards (tests, older writers) are 1.
    version = FORMAT_VERSION if (tmp / dcp_store.METADATA_FILE).is_file() else 1
    manifest = {"format_version": version, "step": step, "files": files, "meta": meta or {}}
    try:
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
    except OSError as exc:
        _remove_quietly(tmp / MANIFEST)
        raise write_error(tmp / MANIFEST, exc) from exc
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
    remove_stray_temporaries(root)


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
        flat = _read_dcp(Path(path), dcp_store.read_state)
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


def _read_dcp(path: Path, read):
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


# ----------------------------------------------------------------------------- checks before a resume

def check_resumable(path: Path, student: str, expected_shapes: Mapping[str, tuple[int, ...]] | None = None
                    ) -> dict[str, Any]:
    """Refuse a checkpoint this run cannot continue from, before any worker starts.

    Checks that it is finished and undamaged (checksums), of a format version this Synapse
    reads, and that it holds ``student``: the name recorded at save time and, given
    ``expected_shapes`` (parameter name -> shape of the configured student), every tensor's
    name and shape (so another class count or width is caught too). Returns the manifest.
    """
    path = Path(path)
    manifest = verify_checkpoint(path)
    _check_student_name(path, manifest, student)
    if expected_shapes is not None:
        _check_student_shapes(path, manifest, student, expected_shapes)
    return manifest


def check_run_checkpoints(root: Path, student: str,
                          expected_shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """What ``resume=auto`` may pick must belong to this run: every finished checkpoint under
    ``root`` of another format version or another student raises; damaged ones are left to
    ``latest_valid_checkpoint``, which skips them (so no checksums are computed here)."""
    for ref in list_checkpoints(root):
        try:
            manifest = read_manifest(ref.path)
            _check_student_name(ref.path, manifest, student)
            if expected_shapes is not None:
                _check_student_shapes(ref.path, manifest, student, expected_shapes)
        except (IncompatibleCheckpointError, UnsafeCheckpointError):
            raise
        except CheckpointError:
            continue  # damage: skipped with a message when resume=auto chooses


def _written_with(path: Path) -> str:
    config = Path(path).parent.parent / "config.yaml"
    return f" (its run's settings: {config})" if config.is_file() else ""


def _check_student_name(path: Path, manifest: dict[str, Any], student: str) -> None:
    saved = (manifest.get("meta") or {}).get("student")
    if saved is not None and saved != student:
        raise IncompatibleCheckpointError(
            f"{path} holds the student {saved!r} but this run's student is {student!r}{_written_with(path)}; "
            f"set student={saved} to continue that run, or start afresh with resume=null in a new run dir")


def _check_student_shapes(path: Path, manifest: dict[str, Any], student: str,
                          expected: Mapping[str, tuple[int, ...]]) -> None:
    saved: dict[str, tuple[int, ...]] = {}
    if manifest.get("format_version", 1) >= 2:
        saved.update(_read_dcp(Path(path), dcp_store.model_shapes))
    for name in sorted(manifest["files"]):
        if name.startswith("shard_"):
            try:
                tensors = load_file(Path(path) / name, mmap=True)["model"]  # shapes only: no data is read
            except (KeyError, TypeError) as exc:
                raise CheckpointError(f"{path}: {name} is not a Synapse shard (no 'model' table)") from exc
            saved.update({key: tuple(t.shape) for key, t in tensors.items()})
    fix = (f"resume with the settings that wrote it{_written_with(path)}, or start afresh with resume=null "
           f"in a new run dir")
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or extra:
        raise IncompatibleCheckpointError(
            f"{path} was written for another student model than {student!r}: it lacks {len(missing)} of its "
            f"tensors (e.g. {missing[:3]}) and has {len(extra)} others (e.g. {extra[:3]}); {fix}")
    for key, shape in expected.items():
        if saved[key] != tuple(shape):
            raise IncompatibleCheckpointError(
                f"{path} does not fit the student {student!r}: {key} has shape {saved[key]} in the checkpoint "
                f"but {tuple(shape)} in the configured model (another class count, image size or width); {fix}")
