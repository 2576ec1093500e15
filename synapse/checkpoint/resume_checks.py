"""Checks before a run starts: refuse a checkpoint this run cannot continue from, and a run
directory holding another run's checkpoints, before any worker starts.

Before a resume the supervisor calls ``check_resumable`` (a given path) or
``check_run_checkpoints`` (resume=auto), so a checkpoint of another version or another student
fails once, naming the fix, instead of in every worker after the launch; and before any run,
``check_run_dir_checkpoints``, so a fresh run never mixes its checkpoints with an earlier run's.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from synapse.checkpoint import dcp as dcp_store
from synapse.checkpoint.layout import CheckpointError, ForeignCheckpointError, IncompatibleCheckpointError
from synapse.checkpoint.read import (
    ListedCheckpoint,
    load_file,
    ordered_checkpoints,
    read_dcp,
    read_manifest,
    resume_checkpoint,
    verify_checkpoint,
)
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
    """What ``resume=auto`` may pick must belong to this run: a finished checkpoint under ``root``
    of another format version or another student (by its manifest) raises, and the one it will
    pick (the newest intact, ``resume_checkpoint``) must hold the configured student's tensors.

    Damage is no refusal: the checkpoint is skipped (with a message when resume=auto chooses) for
    the newest intact one. Its checksums are checked before anything else is read from it, so a
    flipped byte in DCP's index is damage, never mistaken for code or for another student; only
    where every checkpoint is damaged does ``NoIntactCheckpointError`` stop the run.
    """
    for item in ordered_checkpoints(root):
        if isinstance(item.error, IncompatibleCheckpointError):
            raise item.error
        if item.manifest is not None:
            _check_student_name(item.ref.path, item.manifest, student)
    chosen = resume_checkpoint(root)
    if chosen is not None and expected_shapes is not None:
        _check_student_shapes(chosen.path, read_manifest(chosen.path), student, expected_shapes)


def check_run_dir_checkpoints(root: Path, resume: str | None) -> None:
    """Refuse to start a run whose checkpoints would mix with another run's in ``root`` (the run
    directory's ``checkpoints/``); read only, before anything is written.

    ``resume=None`` (a fresh run): ``root`` must hold no checkpoint at all, or the new run's saves
    would sit among the earlier run's (and ``resume=auto`` later continue whichever is newest).
    ``resume=<path>``: checkpoints in ``root`` must be of the run that path continues (by the
    identity in their manifests; a path inside ``root`` is that run's own). ``resume=auto``
    continues the run ``root`` holds: nothing to check here.
    """
    root = Path(root)
    if resume == "auto":
        return
    listed = ordered_checkpoints(root)
    if not listed:
        return
    if resume is None:
        raise ForeignCheckpointError(
            f"{root.parent} already holds the checkpoints of an earlier run ({_described(listed)}) and resume=null "
            f"starts a fresh run: its checkpoints would mix with those, and a later resume=auto could continue the "
            f"earlier run's. Nothing was started, and the earlier run's files are untouched. Fix: continue the "
            f"earlier run with resume=auto, or start this one in a new directory (run_dir=<new directory>)")
    path = Path(resume)
    if path.resolve().parent == root.resolve():
        return  # a checkpoint of this directory: its own run, gone back to an earlier step
    try:
        run = read_manifest(path).get("run")
    except CheckpointError:
        return  # damage is check_resumable's to refuse
    others = [item for item in listed if item.manifest is not None and item.run != run]
    if others:
        raise ForeignCheckpointError(
            f"{root.parent} holds the checkpoints of another run ({_described(others)}) than the one resume={path} "
            f"continues: the two runs' checkpoints would mix, and a later resume=auto could continue the other's. "
            f"Nothing was started, and that run's files are untouched. Fix: resume into a new directory "
            f"(run_dir=<new directory>), or continue the run in {root.parent} with resume=auto")


def _described(listed: list[ListedCheckpoint]) -> str:
    steps = [item.ref for item in listed]
    shown = ", ".join(str(ref.step) for ref in steps[-5:])
    return f"{len(steps)} checkpoint{'s' if len(steps) != 1 else ''} in {steps[0].path.parent}, " \
           f"step{'s' if len(steps) != 1 else ''} {'..., ' if len(steps) > 5 else ''}{shown}"


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
