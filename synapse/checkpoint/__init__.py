"""Atomic, verifiable, partition-independent checkpoints: the package's one face.

`layout.py` says what a checkpoint is on disk (format, errors, which directories count),
`write.py` writes one atomically, `read.py` verifies and loads one without running code,
`resume_checks.py` refuses one a run cannot continue from, and `dcp.py` keeps the tensors in
torch.distributed.checkpoint storage. Callers use ``from synapse import checkpoint as ckpt``.

"""
from synapse.checkpoint import dcp as dcp_store
from synapse.checkpoint.layout import (
    FORMAT_VERSION,
    MANIFEST,
    READABLE_VERSIONS,
    RUN_FILE,
    STATE_FILE,
    CheckpointError,
    CheckpointRef,
    CheckpointWriteError,
    ForeignCheckpointError,
    IncompatibleCheckpointError,
    NoIntactCheckpointError,
    NonFiniteCheckpointError,
    StaleEpochCommitError,
    UnsafeCheckpointError,
    list_checkpoints,
    sha256_of,
    shard_name,
    step_dir_name,
)
from synapse.checkpoint.read import (
    ListedCheckpoint,
    check_format_version,
    latest_valid_checkpoint,
    load_file,
    load_run_state,
    load_student_state,
    load_training_state,
    ordered_checkpoints,
    read_manifest,
    resume_checkpoint,
    verify_checkpoint,
)
from synapse.checkpoint.resume_checks import check_resumable, check_run_checkpoints, check_run_dir_checkpoints
from synapse.checkpoint.write import (
    begin_checkpoint,
    commit_checkpoint,
    first_nonfinite,
    new_nonce,
    prune_checkpoints,
    remove_stray_temporaries,
    run_identity,
    save_tensor_file,
    write_error,
)

__all__ = ["CheckpointError", "CheckpointRef", "CheckpointWriteError", "FORMAT_VERSION", "ForeignCheckpointError",
           "IncompatibleCheckpointError", "ListedCheckpoint", "MANIFEST", "NoIntactCheckpointError",
           "NonFiniteCheckpointError", "READABLE_VERSIONS", "RUN_FILE", "STATE_FILE", "StaleEpochCommitError",
           "UnsafeCheckpointError",
           "begin_checkpoint", "check_format_version", "check_resumable", "check_run_checkpoints",
           "check_run_dir_checkpoints", "commit_checkpoint", "dcp_store", "first_nonfinite", "latest_valid_checkpoint",
           "list_checkpoints", "load_file", "load_run_state", "load_student_state", "load_training_state",
           "new_nonce", "ordered_checkpoints", "prune_checkpoints", "read_manifest", "remove_stray_temporaries",
           "resume_checkpoint", "run_identity", "save_tensor_file", "sha256_of", "shard_name", "step_dir_name",
           "verify_checkpoint", "write_error"]
