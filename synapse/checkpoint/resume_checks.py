"""Checks before a resume: refuse a checkpoint this run cannot continue from, before any
worker starts.

Before a resume the supervisor calls ``check_resumable`` (a given path) or
``check_run_checkpoints`` (resume=auto), so a checkpoint of another version or another student
fails once, naming the fix, instead of in every worker after the launch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from synapse.checkpoint import dcp as dcp_store
from synapse.checkpoint.layout import (
    CheckpointError,
    IncompatibleCheckpointError,
    UnsafeCheckpointError,
    list_checkpoints,
)
from synapse.checkpoint.read import load_file, read_dcp, read_manifest, verify_checkpoint
from synapse.rundir import CONFIG


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
    config = CONFIG.path(Path(path).parent.parent)  # the config of the run whose checkpoints/ holds it
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
        saved.update(read_dcp(Path(path), dcp_store.model_shapes))
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
