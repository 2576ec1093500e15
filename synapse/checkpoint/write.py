"""Writing a checkpoint atomically: files fsync'ed into a temporary directory, checksummed,
the manifest written last, the directory renamed into place.

A checkpoint is written into ``step_X.tmp-<nonce>/``, every file fsync'ed, the manifest written,
and the directory renamed into place, so a process killed mid-write leaves at most a stray
``.tmp`` directory and the previous checkpoint untouched.

A write that fails (disk full, read-only or vanished directory) raises ``CheckpointWriteError``
with the operating system's reason, the file it was writing and the newest checkpoint that is
still intact; the half-written file is removed, and the next save removes any temporary
directory a failed or killed save left behind *before* it writes (on a full disk, that space
is what the next checkpoint needs).

Every manifest records the run's identity (``run_identity``), and pruning deletes only
checkpoints that carry it, oldest first by the step their manifests record: a run never deletes
what it did not write, whatever else the directory holds or however its folders are named.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from synapse.checkpoint import dcp as dcp_store
from synapse.checkpoint.layout import (
    FORMAT_VERSION,
    MANIFEST,
    RUN_FILE,
    STEP_DIR_PATTERN,
    TEMPORARY_PATTERN,
    CheckpointError,
    CheckpointWriteError,
    NonFiniteCheckpointError,
    StaleEpochCommitError,
    list_checkpoints,
    sha256_of,
    step_dir_name,
)
from synapse.checkpoint.read import ordered_checkpoints, verify_checkpoint
from synapse.rundir import CHECKPOINT_SET_ASIDE, CHECKPOINT_STAGING, CHECKPOINTS, DECIDER_EPOCH


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
            f"stays the newest. Fix: lower optim.lr (or raise optim.warmup_steps) in a new run (resume=null in a new "
            f"run directory: a resumed run keeps the learning settings of the run it continues)")
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
    while TEMPORARY_PATTERN.match(root.name) or STEP_DIR_PATTERN.match(root.name):
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


def new_nonce() -> str:
    """A fresh suffix for a temporary checkpoint directory (ranks share the one rank 0 draws)."""
    return uuid.uuid4().hex[:8]


def begin_checkpoint(root: Path, step: int, nonce: str | None = None) -> Path:
    """Create the temporary directory every rank writes its files into."""
    tmp = Path(root) / CHECKPOINT_STAGING.name(step=step, nonce=nonce or new_nonce())
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
    for stray in [*Path(root).glob(CHECKPOINT_STAGING.glob(within=CHECKPOINTS)),
                  *Path(root).glob(CHECKPOINT_SET_ASIDE.glob(within=CHECKPOINTS))]:
        if keep is None or stray != Path(keep):
            shutil.rmtree(stray, ignore_errors=True)
    for stray in Path(root).glob(f"{RUN_FILE}.tmp-*"):  # an identity write cut short
        _remove_quietly(stray)


def run_identity(root: Path) -> str:
    """The identity of the run whose checkpoints ``root`` holds, recorded in ``root/<RUN_FILE>``.

    Drawn by the run's first commit and kept from then on (failover restarts, ``resume=auto``).
    Without the file (deleted, or a directory of checkpoints copied elsewhere) the newest
    checkpoint's recorded identity is taken up again, so the run goes on pruning its own; a
    directory without any is a new run's. A fresh run never starts in a directory holding
    checkpoints (``resume_checks.check_run_dir_checkpoints``), so it never takes up another's.
    """
    root = Path(root)
    path = root / RUN_FILE
    try:
        run = json.loads(path.read_text()).get("run")
        if isinstance(run, str) and run:
            return run
    except (OSError, ValueError, AttributeError):
        pass  # absent or unreadable: taken up or drawn below, and written anew
    known = [c.run for c in ordered_checkpoints(root) if c.run]
    run = known[-1] if known else uuid.uuid4().hex
    tmp = root / f"{RUN_FILE}.tmp-{new_nonce()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"run": run}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(root)
    except OSError as exc:
        _remove_quietly(tmp)
        raise write_error(path, exc) from exc
    return run


# torch's elastic agent gives every worker of a launch its rendezvous run id; across nodes the decider names
# each launch with it in failover/decider_epoch.json (``launch``), the one launch whose workers may commit
LAUNCH_ENV = "TORCHELASTIC_RUN_ID"


def commit_fence(root: Path) -> tuple[int, str]:
    """Who may commit in the run whose checkpoints are in ``root``: (the decider epoch whose workers may,
    the launch whose workers may: "" for any of that epoch); (0, "") for none recorded (one node).
    ``workers`` of failover/decider_epoch.json (a restarted decider that adopted the running workers leaves
    it at theirs), else its ``epoch``."""
    try:
        data = json.loads(DECIDER_EPOCH.path(Path(root).parent).read_text())
        return int(data.get("workers") or data["epoch"]), str(data.get("launch") or "")
    except FileNotFoundError:
        return 0, ""
    except (OSError, ValueError, KeyError, TypeError):
        # unreadable: the fence cannot say no; the decider's own start refuses such a file, naming the fix
        return 0, ""


def refuse_stale_commit(tmp: Path, step: int, epoch: int) -> None:
    """Across nodes, stale workers must not commit beside the ones that replaced them: those of a replaced
    decider (still training after a newer decider took the run over), and those of a launch the decider no
    longer runs (a node's, judged lost, whose agent was only stalled: they share their epoch with the launch
    that replaces them). Raise ``StaleEpochCommitError``, removing what they wrote, if a decider of a newer
    epoch than ``epoch`` exists or the decider named another launch than this worker's. Checked just before
    the rename; a decider is raised only after the launcher has seen the old one dead and told every agent
    to tear its workers down, so the window between this check and the rename is never open in practice."""
    newest, launch = commit_fence(tmp.parent)
    if epoch and newest > epoch:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StaleEpochCommitError(
            f"checkpoint of step {step} not committed: these workers belong to decider epoch {epoch}, and a decider "
            f"of epoch {newest} has taken the run over ({DECIDER_EPOCH.path(tmp.parent.parent)}); only its workers "
            f"commit. Nothing to fix: these workers are stale and stop here")
    own = os.environ.get(LAUNCH_ENV, "")
    if epoch and launch and own != launch:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StaleEpochCommitError(
            f"checkpoint of step {step} not committed: these workers are of launch {own or '(none)'}, and the "
            f"decider's fence ({DECIDER_EPOCH.path(tmp.parent.parent)}) admits {launch}: a node of this launch "
            f"was declared lost, or the launch was replaced. Nothing to fix: these workers are stale and stop here")


def commit_checkpoint(tmp: Path, step: int, meta: dict[str, Any] | None = None) -> Path:
    """Checksum every file, write the manifest, and atomically move the directory into place (refused for
    workers of a replaced decider epoch, ``meta["epoch"]``, or of a launch the decider no longer runs: the
    manifest's ``meta.launch``)."""
    epoch = int((meta or {}).get("epoch") or 0)
    if epoch:  # across nodes: the launch the commit's writers are of, beside their epoch (the commit's fence)
        meta = {**(meta or {}), "launch": os.environ.get(LAUNCH_ENV, "")}
    refuse_stale_commit(tmp, step, epoch)
    files = {p.name: {"sha256": sha256_of(p), "bytes": p.stat().st_size}
             for p in sorted(tmp.iterdir()) if p.is_file() and p.name != MANIFEST}
    # The layout says the version: DCP storage is 2, torch.save shards (tests, older writers) are 1.
    version = FORMAT_VERSION if (tmp / dcp_store.METADATA_FILE).is_file() else 1
    manifest = {"format_version": version, "step": step, "run": run_identity(tmp.parent), "files": files,
                "meta": meta or {}}
    try:
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
    except OSError as exc:
        _remove_quietly(tmp / MANIFEST)
        raise write_error(tmp / MANIFEST, exc) from exc
    refuse_stale_commit(tmp, step, epoch)  # again, as close to the rename as it can be
    final = tmp.parent / step_dir_name(step)
    if final.exists():
        # The same step saved again (e.g. right after a resume). A verified copy holds the same
        # training state: keep it, so there is never a moment without that step on disk.
        try:
            verify_checkpoint(final)
            shutil.rmtree(tmp)
            return final
        except CheckpointError:
            os.replace(final, final.with_name(CHECKPOINT_SET_ASIDE.name(step=step, nonce=new_nonce())))
    os.replace(tmp, final)
    _fsync_dir(tmp.parent)
    return final


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` of this run's checkpoints, and stray temporary directories.

    Only checkpoints whose manifests carry this run's identity are ever deleted, oldest first by
    the step they record: another run's, one written before runs had identities, and one whose
    manifest cannot be read (whose run is unknown) all stay.
    """
    run = run_identity(root)
    own = [c.ref for c in ordered_checkpoints(root) if c.run == run]
    for ref in own[: max(0, len(own) - keep)]:
        shutil.rmtree(ref.path, ignore_errors=True)
    remove_stray_temporaries(root)
