"""The training loop every path shares (batches, optimizer, checkpointing, evaluation,
progress, the teacher), and the single-device loop the pipeline is measured against.
"""
from synapse.engine.accuracy import evaluate, topk_correct
from synapse.engine.batches import (
    BadSampleLog,
    Batch,
    DataWarning,
    eval_batches,
    loader_workers,
    train_batches,
    with_host_data_path,
)
from synapse.engine.checkpointer import Checkpointer, HeldState, HostBufferStager, SingleShard
from synapse.engine.device import (
    ComputeSetup,
    available_cores,
    build_compute_setup,
    default_threads,
    rng_state,
    set_rng_state,
)
from synapse.engine.graph_capture import WARMUP_ITERATIONS, ForwardReplay, TrainingReplay, capture_kwargs
from synapse.engine.optim import (
    build_optimizer,
    build_scheduler,
    load_optimizer_state_by_name,
    lr_factor,
    optimizer_state_by_name,
)
from synapse.engine.prefetch import DevicePrefetcher
from synapse.engine.progress import (
    CLEAR_LINE,
    ConsoleBar,
    Milestones,
    Progress,
    StepRate,
    format_seconds,
    is_terminal,
    lines_above,
    progress_text,
)
from synapse.engine.reference import distil_on_one_device
from synapse.engine.step import (
    NonFiniteGuard,
    NonFiniteLossError,
    SingleDeviceStep,
    checks_loss_late,
    ensure_training,
    training_loss,
)
from synapse.engine.teacher import prepare_teacher, teacher_weights, train_label_model
from synapse.engine.trainer import (
    LoopSettings,
    Trainer,
    build_run_parts,
    build_trainer,
    kd_params,
    loop_settings,
    resolve_resume,
)

__all__ = ["BadSampleLog", "Batch", "CLEAR_LINE", "Checkpointer", "ComputeSetup", "ConsoleBar",
           "DataWarning", "DevicePrefetcher", "ForwardReplay", "HeldState", "HostBufferStager",
           "LoopSettings", "Milestones", "NonFiniteGuard", "NonFiniteLossError", "Progress",
           "SingleDeviceStep", "SingleShard", "StepRate", "Trainer", "TrainingReplay", "WARMUP_ITERATIONS",
           "available_cores",
           "build_compute_setup", "build_optimizer", "build_run_parts", "build_scheduler", "build_trainer",
           "capture_kwargs", "checks_loss_late", "default_threads", "distil_on_one_device",
           "ensure_training", "eval_batches", "evaluate", "format_seconds", "is_terminal", "kd_params",
           "lines_above", "load_optimizer_state_by_name", "loader_workers", "loop_settings", "lr_factor",
           "optimizer_state_by_name", "prepare_teacher", "progress_text", "resolve_resume", "rng_state",
           "set_rng_state", "teacher_weights", "topk_correct", "train_batches", "train_label_model",
           "training_loss", "with_host_data_path"]
