"""What a checkpoint is on disk: its layout, its format versions, its errors, and which
directories under a run's ``checkpoints/`` are finished checkpoints.

Layout of one checkpoint (format version 2; a directory, so K ranks can each write their part)::

    checkpoints/step_00000120/   (where, and how it is named: synapse.rundir's layout, CHECKPOINT)
        .metadata        torch.distributed.checkpoint's global index of every tensor, by name
        __0_0.distcp     student parameters, buffers and optimizer state of the blocks rank 0 owns,
        __1_0.distcp     keyed by the *original* parameter names (any partition can load them; dcp.py),
                         and each rank's RNG states (a resume on the same ranks continues them)
        state.pt         step, epoch, sampler position, scheduler, RNG states, extra component state
        manifest.json    format version, step, the run's identity, sha256 and size of every file: written last

``checkpoints/run_identity.json`` names the run whose checkpoints the directory holds (drawn at
its first commit, kept across restarts and ``resume=auto``): every manifest records it, pruning
deletes only checkpoints that carry it, and a fresh run refuses a directory holding others.

Version 1 (before DCP) held one ``shard_XX.pt`` per rank instead of the DCP files; it is still
read (``load_student_state``), never written. Manifests without ``format_version`` (none were
written) count as version 1.

The writer (`write.py`), the reader (`read.py`) and the checks before a resume
(`resume_checks.py`) all build on this module; `synapse.checkpoint` is their one face.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from synapse.rundir import CHECKPOINT, CHECKPOINT_RUN_IDENTITY, CHECKPOINT_SET_ASIDE, CHECKPOINT_STAGING

FORMAT_VERSION = 2  # what this Synapse writes: tensors in torch.distributed.checkpoint storage
READABLE_VERSIONS = (1, 2)  # 1: one torch.save shard per rank (before DCP), still loaded
MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
RUN_FILE = CHECKPOINT_RUN_IDENTITY.name()  # in the checkpoints directory: which run its checkpoints belong to
STEP_DIR_PATTERN = CHECKPOINT.name_regex  # group 1: the step
# A save in progress, or a damaged checkpoint set aside: never a checkpoint to resume from.
TEMPORARY_PATTERN = re.compile("|".join(e.name_regex.pattern for e in (CHECKPOINT_STAGING, CHECKPOINT_SET_ASIDE)))


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or from an incompatible version."""


class IncompatibleCheckpointError(CheckpointError):
    """A sound checkpoint this run cannot continue from: another format version or another student.

    Unlike damage, which ``latest_valid_checkpoint`` skips, this is a mistake in the run's
    configuration, so ``check_run_checkpoints`` stops the run instead of silently starting over.
    """


class NoIntactCheckpointError(CheckpointError):
    """``resume=auto`` over checkpoints that are all damaged: the run stops instead of quietly
    starting from step 0 (all finished work would be lost); the message names each damage."""


class ForeignCheckpointError(CheckpointError):
    """The run directory holds checkpoints of another run than this one would continue: writing
    there would mix the two (pruning one's by the other's steps, ``resume=auto`` picking either)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only or missing directory).

    An ``OSError`` with the original ``errno``; the message names the file, the reason, the
    newest checkpoint that is still intact and the fix. Nothing already on disk was changed.
    """


class StaleEpochCommitError(CheckpointError):
    """A checkpoint written by workers of a decider epoch that a newer decider has replaced: not committed."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holding objects other than tensors and plain containers (possibly code): never loaded."""


class NonFiniteCheckpointError(CheckpointError):
    """A checkpoint would hold NaN or infinite values: it is never written."""


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


def step_dir_name(step: int) -> str:
    return CHECKPOINT.name(step=step)


def shard_name(rank: int) -> str:
    """A rank's file of a version-1 checkpoint (read only)."""
    return f"shard_{rank:02d}.pt"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def list_checkpoints(root: Path) -> list[CheckpointRef]:
    """Finished checkpoints under ``root`` by their directory names, oldest first (temporary
    directories are ignored). What a checkpoint holds is what its manifest says: choosing and
    pruning order by that (``read.ordered_checkpoints``), since a directory can be renamed or copied."""
    if not Path(root).is_dir():
        return []
    refs = [CheckpointRef(p, int(m.group(1))) for p in Path(root).iterdir()
            if p.is_dir() and (m := STEP_DIR_PATTERN.match(p.name))]
    return sorted(refs, key=lambda r: r.step)
