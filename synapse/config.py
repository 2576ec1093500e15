"""Structured configuration: one dataclass per component, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` merge onto these dataclasses, so a misspelt key or a value of
the wrong type fails while Hydra composes the config. ``validate`` then checks what types
cannot express (a temperature <= 0, a model name we do not know, a GPU id that does not exist)
and raises ``ConfigError`` naming the offending override and a fix, before any work starts.
Only the entry point sees the whole tree; each component receives its own slice.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

MODES = ("kd", "teacher", "baseline", "profile")
ACCELERATORS = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "step", "constant")
PIPELINE_SCHEDULES = ("1f1b", "gpipe")
STRATEGIES = ("auto", "single", "pipeline")
PARTITION_MODES = ("even", "manual", "auto")
NONFINITE_POLICIES = ("stop", "skip")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key and how to fix it."""


@dataclass
class TeacherConfig:
    name: str = MISSING
    checkpoint: Optional[str] = None  # local weights file (the seed's --t_model); never downloaded
    # With no checkpoint, train one on the configured data first (cached by model/data/seed).
    auto_train: bool = True
    auto_train_epochs: int = 5
    auto_train_lr: float = 2e-3


@dataclass
class StudentConfig:
    name: str = MISSING
    init: Optional[str] = None  # local initial weights (the seed's --s_init)
    drop_rate: float = 0.0


@dataclass
class DataConfig:
    name: str = "digits"  # digits | imagenet100 | synthetic
    root: Optional[str] = None  # ImageNet100: folder holding train/ and val/
    image_size: int = 32
    batch_size: int = 64
    val_batch_size: int = 256
    num_workers: int = 0
    augment: bool = True
    synthetic_train_size: int = 4096
    synthetic_val_size: int = 512
    synthetic_num_classes: int = 100
    synthetic_in_chans: int = 3


@dataclass
class KDConfig:
    mode: str = "st"  # st: soft targets (KL, T^2) | logits: MSE on logits
    T: float = 4.0
    lambda_kd: float = 0.9


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 2e-3
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: str = "cosine"
    warmup_steps: int = 0
    step_size: int = 1000  # for schedule=step
    gamma: float = 0.1


@dataclass
class TrainerConfig:
    accelerator: str = "auto"  # auto: cuda if available, else cpu
    spare_devices: list[int] = field(default_factory=list)  # idle devices a REPLACE may swap in
    devices: Any = 1  # per node. CPU: number of slots; CUDA: list of GPU ids (or a count)
    # auto: the single-device trainer for one device, the pipeline for several;
    # pipeline: the pipeline runtime even on one device (K = 1).
    strategy: str = "auto"
    nodes: int = 1  # machines taking part; each runs train.py with the same config
    node_rank: int = 0  # 0 hosts the rendezvous store; c10d rendezvous assigns the process ranks
    rdzv_endpoint: Optional[str] = None  # host:port of the c10d store for nodes > 1 (default: a free local port)
    rdzv_id: Optional[str] = None  # the same string on every node of one run (default: derived from run_dir)
    collective_timeout_s: float = 120.0  # a hung peer fails the launch after this, never a silent hang
    rdzv_timeout_s: int = 60
    epochs: int = 6
    max_steps: Optional[int] = None  # length of the schedule in optimizer steps (overrides epochs)
    # Stop this launch after N steps with a checkpoint (the schedule is unchanged): splits a run
    # into pieces that resume=auto continues, e.g. to fit a job time limit.
    stop_after: Optional[int] = None
    precision: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    channels_last: bool = True  # CUDA only
    cudnn_benchmark: bool = True
    threads: Optional[int] = None  # torch intra-op threads per process (None: torch's default)
    eval_every_epochs: int = 1
    log_every: int = 1
    progress: bool = True
    deterministic: bool = False
    # A step whose loss is NaN or infinite: stop (raise before the update, naming the step) or
    # skip (drop its update on every rank; the step still counts and the schedule advances).
    nonfinite: str = "stop"


@dataclass
class PipelineConfig:
    schedule: str = "1f1b"
    # Micro-batches per step. With one device this is gradient accumulation over the same
    # micro-batches, the reference the pipelined runtime must reproduce.
    microbatches: int = 1


@dataclass
class PartitionConfig:
    mode: str = "even"
    teacher: Optional[list[int]] = None  # blocks per stage, for mode=manual
    student: Optional[list[int]] = None
    # mode=auto: relative device speeds (1.0 = as profiled; e.g. [1, 1, 3] for a slowed device),
    # link bandwidth between neighbours (None: communication not modelled), profiling effort.
    alphas: Optional[list[float]] = None
    link_bandwidth_gbps: Optional[float] = None
    profile_warmup: int = 3
    profile_repeats: int = 10


@dataclass
class CheckpointConfig:
    every: int = 0  # save every N optimizer steps (0: only at epoch ends and the end)
    keep: int = 2  # how many recent checkpoints to keep
    at_epoch_end: bool = True


@dataclass
class InjectionConfig:
    name: str = "none"
    faults: list[Any] = field(default_factory=list)


@dataclass
class MonitorConfig:
    """The supervisor's health monitor: worker liveness and hangs, NVML, CUDA probes."""

    enabled: bool = True
    period_s: float = 5.0
    hang_timeout_s: float = 300.0  # covers evaluation and checkpoints, which write no heartbeat
    nvml: bool = True
    probe: bool = True
    probe_every_s: float = 60.0
    probe_timeout_s: float = 30.0


@dataclass
class PolicyConfig:
    name: str = "eta"
    params: dict[str, Any] = field(default_factory=dict)


def _defaults_of(module: str, name: str) -> dict[str, Any]:
    """The default settings of a pure component's config dataclass (one source for the numbers)."""
    import importlib

    return dataclasses.asdict(getattr(importlib.import_module(module), name)())


@dataclass
class FailoverConfig:
    """The supervisor's failover loop: watch step timings, decide by ETA, checkpoint and restart."""

    enabled: bool = True  # false: a plain pipeline run (a worker failure ends the run)
    max_restarts: int = 3  # planned (REPLAN/DEGRADE/REPLACE) and failure restarts together
    decide_every: int = 1  # steps between two decisions while a slowdown is detected
    # live: the running workers swap blocks and carry on (no checkpoint, no new processes);
    # restart: checkpoint, tear down, relaunch with the new partition
    replan_mode: str = "live"
    restart_cost_file: Optional[str] = None  # JSON of experiments/bench_restart_cost.py (None: the repo's)
    # SlowdownDetector and AlphaBetaEstimator settings, with their defaults (failover.detector.window=5)
    detector: dict[str, Any] = field(default_factory=lambda: _defaults_of("synapse.monitor.detector", "DetectorConfig"))
    estimator: dict[str, Any] = field(default_factory=lambda: _defaults_of("synapse.planner.estimator",
                                                                           "EstimatorConfig"))
    # Fire drills: forced actions at given steps, e.g. [{step: 40, action: replan}] (measures a restart's
    # cost, proves a restart changes nothing that is learned). Keys: step, action (replan|degrade|replace), device.
    drills: list[Any] = field(default_factory=list)


@dataclass
class ExperimentConfig:
    name: str = "default"
    description: str = ""


@dataclass
class SynapseConfig:
    mode: str = "kd"
    seed: int = 0
    resume: Optional[str] = None  # a checkpoint path, or 'auto' for the newest one in the run dir
    report: bool = True  # write figures and report.md (synapse.analysis) into the run dir at the end
    run_dir: str = MISSING
    cache_dir: str = MISSING
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    data: DataConfig = field(default_factory=DataConfig)
    kd: KDConfig = field(default_factory=KDConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    injection: InjectionConfig = field(default_factory=InjectionConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)


def register_configs() -> None:
    """Make the schema available to ``conf/config.yaml``'s defaults list as ``synapse_schema``."""
    ConfigStore.instance().store(name="synapse_schema", node=SynapseConfig)


register_configs()


def to_container(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _fail(key: str, problem: str, fix: str) -> None:
    raise ConfigError(f"{key}: {problem}. Fix: {fix}")


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, f"{value!r} is not a valid choice", f"use one of {', '.join(choices)} (e.g. {key}={choices[0]})")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value is None or (value < 0 if allow_zero else value <= 0):
        bound = ">= 0" if allow_zero else "> 0"
        _fail(key, f"must be {bound}, got {value}", f"set {key} to a value {bound}")


def validate(cfg: DictConfig) -> None:
    """Check every value that types cannot; raise ConfigError before any work starts."""
    _validate_known_keys(cfg)
    _choice("mode", cfg.mode, MODES)
    _validate_models(cfg)
    _validate_data(cfg.data)
    _validate_kd(cfg.kd)
    _validate_optim(cfg.optim)
    _validate_trainer(cfg.trainer)
    _validate_pipeline(cfg)
    _validate_partition(cfg)
    _validate_injection(cfg)
    _validate_monitor(cfg)
    _validate_failover(cfg)
    _positive("checkpoint.every", cfg.checkpoint.every, allow_zero=True)
    _positive("checkpoint.keep", cfg.checkpoint.keep)
    _validate_block_counts(cfg)
    _validate_weight_files(cfg)
    _validate_resume(cfg)


def _validate_block_counts(cfg: DictConfig) -> None:
    """Pipeline runs: at most one stage per block, and manual counts that sum to the models' blocks.

    The models are built on the meta device to count their blocks: no memory, a few ms even for ViT-L.
    """
    if cfg.mode != "kd" or not uses_pipeline(cfg.trainer):
        return
    from .data import dataset_info
    from .engine.trainer import data_kwargs
    from .pipeline.partition import count_blocks, even_counts

    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    k = num_stages(cfg.trainer)
    for role in ("teacher", "student"):
        name = cfg[role].name
        blocks = count_blocks(name, info.num_classes, info.in_chans, info.image_size)
        if k > blocks:
            _fail("trainer.devices", f"{k} pipeline stages but the {role} {name} has only {blocks} blocks "
                  f"(every stage holds at least one)", f"use at most {blocks} devices, or a deeper {role}")
        counts = cfg.partition[role]
        if cfg.partition.mode == "manual" and sum(counts) != blocks:
            _fail(f"partition.{role}", f"{list(counts)} covers {sum(counts)} blocks but the {role} {name} has "
                  f"{blocks}", f"make the counts sum to {blocks}, e.g. partition.{role}={list(even_counts(blocks, k))}")


def _validate_weight_files(cfg: DictConfig) -> None:
    """teacher.checkpoint and student.init must fit the configured models and data (names and shapes),
    checked here so that a wrong file fails once, not in every pipeline worker."""
    from .data import dataset_info
    from .engine.trainer import data_kwargs
    from .models.factory import check_weights_file

    used = {"kd": ("teacher.checkpoint", "student.init"), "baseline": ("student.init",)}.get(cfg.mode, ())
    files = [(key, OmegaConf.select(cfg, key)) for key in used if OmegaConf.select(cfg, key)]
    if not files:
        return
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    for key, path in files:
        model_name = cfg[key.split(".")[0]].name
        check_weights_file(model_name, path, info.num_classes, info.in_chans, info.image_size, what=key)


def _validate_resume(cfg: DictConfig) -> None:
    """The checkpoint a KD run resumes from must be finished, of a format version this Synapse reads,
    and hold the configured student (names and shapes): refused here, before any worker starts."""
    if cfg.resume is None:
        return
    if cfg.resume != "auto" and not Path(cfg.resume).exists():
        _fail("resume", f"checkpoint {cfg.resume!r} does not exist",
              "give the path of a checkpoint directory, or resume=auto to take the newest in the run dir")
    if cfg.mode != "kd":
        return  # only distillation resumes
    import torch

    from . import checkpoint as ckpt
    from .data import dataset_info
    from .engine.trainer import data_kwargs
    from .models import build_model

    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    with torch.device("meta"):
        student = build_model(cfg.student.name, info.num_classes, info.in_chans, info.image_size)
    shapes = {key: tuple(t.shape) for key, t in student.state_dict().items()}
    if cfg.resume == "auto":
        ckpt.check_run_checkpoints(Path(cfg.run_dir) / "checkpoints", cfg.student.name, shapes)
    else:
        ckpt.check_resumable(Path(cfg.resume), cfg.student.name, shapes)


def _unknown_keys(node: DictConfig, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys outside the schema, each with its closest valid spelling.

    Hydra rejects ``trainer.epoch=3`` but then suggests ``+trainer.epoch=3``, which it accepts
    silently even on a typed node: a misspelt setting would be ignored without a word.
    """
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []  # free-form dicts (policy.params) take any key
    allowed = sorted(f.name for f in dataclasses.fields(schema))
    unknown: list[tuple[str, list[str]]] = []
    for key in node.keys():
        if key not in allowed:
            unknown.append((f"{prefix}{key}", difflib.get_close_matches(str(key), allowed, n=1)))
        elif dataclasses.is_dataclass(OmegaConf.get_type(node, key)):
            unknown += _unknown_keys(node[key], f"{prefix}{key}.")
    return unknown


def _validate_known_keys(cfg: DictConfig) -> None:
    for key, close in _unknown_keys(cfg):
        parent = key.rpartition(".")[0]
        suggestion = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
        _fail(key, "is not a Synapse setting (added with a '+' override?)",
              f"remove the override{suggestion or '.'} Valid keys are the fields in synapse/config.py")


def _validate_models(cfg: DictConfig) -> None:
    from .models.factory import MODEL_REGISTRY

    for key in ("teacher.name", "student.name"):
        name = OmegaConf.select(cfg, key)
        if name not in MODEL_REGISTRY:
            _fail(key, f"unknown model {name!r}", f"choose one of {', '.join(sorted(MODEL_REGISTRY))}")
    for key in ("teacher.checkpoint", "student.init"):
        path = OmegaConf.select(cfg, key)
        if path is not None and not Path(path).is_file():
            _fail(key, f"file {path!r} does not exist", "give the path of a local weights file (weights are never downloaded)")
    _positive("teacher.auto_train_epochs", cfg.teacher.auto_train_epochs, allow_zero=True)
    _positive("teacher.auto_train_lr", cfg.teacher.auto_train_lr)
    if not 0 <= cfg.student.drop_rate < 1:
        _fail("student.drop_rate", f"must be in [0, 1), got {cfg.student.drop_rate}", "use e.g. student.drop_rate=0.1")


def _validate_data(data: DictConfig) -> None:
    from .data import check_imagenet100_root, dataset_names

    _choice("data.name", data.name, tuple(dataset_names()))
    for key in ("batch_size", "val_batch_size", "image_size"):
        _positive(f"data.{key}", data[key])
    _positive("data.num_workers", data.num_workers, allow_zero=True)
    if data.name == "imagenet100":
        if data.root is None:
            _fail("data.root", "ImageNet100 needs a data root", "set data.root=/path/to/imagenet (holding train/ and val/)")
        check_imagenet100_root(data.root)


def _validate_kd(kd: DictConfig) -> None:
    from .kd import KD_MODES

    _choice("kd.mode", kd.mode, KD_MODES)
    _positive("kd.T", kd.T)
    if not 0.0 <= kd.lambda_kd <= 1.0:
        _fail("kd.lambda_kd", f"must be in [0, 1], got {kd.lambda_kd}", "kd.lambda_kd=0.9 weighs KD 0.9 and cross-entropy 0.1")


def _validate_optim(optim: DictConfig) -> None:
    _choice("optim.name", optim.name, OPTIMIZERS)
    _choice("optim.schedule", optim.schedule, SCHEDULES)
    _positive("optim.lr", optim.lr)
    _positive("optim.weight_decay", optim.weight_decay, allow_zero=True)
    _positive("optim.warmup_steps", optim.warmup_steps, allow_zero=True)
    _positive("optim.step_size", optim.step_size)
    if not 0 <= optim.momentum < 1:
        _fail("optim.momentum", f"must be in [0, 1), got {optim.momentum}", "use e.g. optim.momentum=0.9")


def _validate_trainer(trainer: DictConfig) -> None:
    _choice("trainer.accelerator", trainer.accelerator, ACCELERATORS)
    _validate_cpu_slot_ids(trainer)
    _choice("trainer.precision", trainer.precision, PRECISIONS)
    _choice("trainer.strategy", trainer.strategy, STRATEGIES)
    _positive("trainer.nodes", trainer.nodes)
    _positive("trainer.collective_timeout_s", trainer.collective_timeout_s)
    _positive("trainer.rdzv_timeout_s", trainer.rdzv_timeout_s)
    if trainer.strategy == "single" and num_stages(trainer) > 1:
        _fail("trainer.strategy", f"single runs on one device but {num_stages(trainer)} are configured",
              "use trainer.strategy=auto (pipeline over all devices) or trainer.devices=1")
    if trainer.nodes > 1 and not trainer.rdzv_endpoint:
        _fail("trainer.rdzv_endpoint", f"trainer.nodes={trainer.nodes} needs a rendezvous endpoint every node can reach",
              "set trainer.rdzv_endpoint=host:port (the same on every node)")
    _positive("trainer.epochs", trainer.epochs, allow_zero=True)
    if trainer.max_steps is not None:
        _positive("trainer.max_steps", trainer.max_steps, allow_zero=True)
    if trainer.stop_after is not None:
        _positive("trainer.stop_after", trainer.stop_after)
    if trainer.threads is not None:
        _positive("trainer.threads", trainer.threads)
    _positive("trainer.eval_every_epochs", trainer.eval_every_epochs)
    _positive("trainer.log_every", trainer.log_every)
    _choice("trainer.nonfinite", trainer.nonfinite, NONFINITE_POLICIES)
    resolve_devices(trainer)


def _validate_cpu_slot_ids(trainer: DictConfig) -> None:
    """A CPU slot id beyond the 64 worker processes Synapse starts at most, named as such."""
    devices = trainer.devices
    if trainer.accelerator != "cuda" and isinstance(devices, ListConfig) and resolve_accelerator(trainer) == "cpu":
        too_high = [d for d in devices if isinstance(d, int) and d >= 64]
        if too_high:
            _fail("trainer.devices", f"CPU slot ids {too_high} are out of range (slots are 0..63)",
                  f"number CPU slots from 0, e.g. trainer.devices={len(devices)}")


def resolve_accelerator(trainer: DictConfig) -> str:
    if trainer.accelerator != "auto":
        return trainer.accelerator
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_devices(trainer: DictConfig) -> list[int]:
    """The device ids the run uses: CPU slots 0..n-1, or GPU ids checked against the machine."""
    accelerator = resolve_accelerator(trainer)
    devices = trainer.devices
    if isinstance(devices, (list, tuple, ListConfig)):
        ids = [int(d) for d in devices]
    elif isinstance(devices, int) and not isinstance(devices, bool):
        ids = list(range(devices))
    else:
        _fail("trainer.devices", f"{devices!r} is neither a count nor a list of ids", "use trainer.devices=2 or trainer.devices=[0,1]")
    if not ids:
        _fail("trainer.devices", "no devices given", "use at least one device, e.g. trainer.devices=1")
    if len(set(ids)) != len(ids):
        _fail("trainer.devices", f"duplicate device ids in {ids}", "list each device once")
    if min(ids) < 0:
        _fail("trainer.devices", f"negative device id in {ids}", "device ids start at 0")
    if accelerator == "cuda":
        _check_gpu_ids(ids)
    elif max(ids) >= 64:
        _fail("trainer.devices", f"{len(ids)} CPU slots requested", "use at most 64 CPU worker processes")
    return ids


def num_stages(trainer: DictConfig) -> int:
    """K: pipeline stages = processes in the run (devices per node times nodes)."""
    return len(resolve_devices(trainer)) * trainer.nodes


def uses_pipeline(trainer: DictConfig) -> bool:
    return trainer.strategy == "pipeline" or (trainer.strategy == "auto" and num_stages(trainer) > 1)


def _check_gpu_ids(ids: list[int]) -> None:
    import torch

    if not torch.cuda.is_available():
        _fail("trainer.accelerator", "cuda requested but no CUDA device is visible", "use trainer.accelerator=cpu")
    count = torch.cuda.device_count()
    missing = [i for i in ids if i >= count]
    if missing:
        _fail("trainer.devices", f"GPU ids {missing} do not exist (this machine has {count}: 0..{count - 1})",
              f"choose ids below {count}")


def _validate_pipeline(cfg: DictConfig) -> None:
    _choice("pipeline.schedule", cfg.pipeline.schedule, PIPELINE_SCHEDULES)
    _positive("pipeline.microbatches", cfg.pipeline.microbatches)
    if cfg.data.batch_size % cfg.pipeline.microbatches:
        _fail("pipeline.microbatches", f"{cfg.pipeline.microbatches} micro-batches do not divide data.batch_size="
              f"{cfg.data.batch_size}", "choose a divisor of the batch size")


def _validate_partition(cfg: DictConfig) -> None:
    part = cfg.partition
    _choice("partition.mode", part.mode, PARTITION_MODES)
    k = num_stages(cfg.trainer)
    _positive("partition.profile_warmup", part.profile_warmup, allow_zero=True)
    _positive("partition.profile_repeats", part.profile_repeats)
    if part.link_bandwidth_gbps is not None:
        _positive("partition.link_bandwidth_gbps", part.link_bandwidth_gbps)
    if part.alphas is not None:
        if len(part.alphas) != k:
            _fail("partition.alphas", f"{len(part.alphas)} speeds given for {k} devices", f"give exactly {k} values")
        if min(part.alphas) <= 0:
            _fail("partition.alphas", f"slowdowns must be > 0, got {list(part.alphas)}", "use 1.0 for a nominal device")
    if part.mode != "manual":
        return
    for key in ("teacher", "student"):
        counts = part[key]
        if counts is None:
            _fail(f"partition.{key}", "partition.mode=manual needs blocks per stage",
                  f"set partition.{key}=[n_0,...,n_{k - 1}] or use partition=even")
        if len(counts) != k:
            _fail(f"partition.{key}", f"{len(counts)} stages given for {k} devices", f"give exactly {k} block counts")
        if min(counts) < 1:
            _fail(f"partition.{key}", f"every stage needs at least one block, got {list(counts)}", "make each count >= 1")


def _validate_injection(cfg: DictConfig) -> None:
    from .monitor.injection import InjectionError, parse_faults

    try:
        parse_faults(OmegaConf.to_container(cfg.injection.faults, resolve=True), num_stages(cfg.trainer))
    except (InjectionError, KeyError, TypeError, ValueError) as exc:
        hint = ""
        if cfg.injection.name == "demo":  # the default: a user who changed the devices did not ask for it
            hint = " (the default demo slows rank 2 of 3: add injection=none for a run on fewer devices)"
        _fail("injection.faults", str(exc), "see conf/injection/ for examples" + hint)


def _validate_monitor(cfg: DictConfig) -> None:
    from .monitor.health import HealthConfigError, HealthSettings

    try:
        HealthSettings.from_config(cfg.monitor)
    except HealthConfigError as exc:
        _fail("monitor", str(exc), "see MonitorConfig in synapse/config.py")


REPLAN_MODES = ("live", "restart")


def _validate_failover(cfg: DictConfig) -> None:
    from .monitor.detector import DetectorConfig, DetectorConfigError
    from .planner.estimator import EstimatorConfig, EstimatorConfigError
    from .planner.policy import PolicyConfigError, make_policy

    failover = cfg.failover
    _positive("failover.max_restarts", failover.max_restarts, allow_zero=True)
    _positive("failover.decide_every", failover.decide_every)
    _choice("failover.replan_mode", failover.replan_mode, REPLAN_MODES)
    for key, settings, error in (("failover.detector", DetectorConfig, DetectorConfigError),
                                 ("failover.estimator", EstimatorConfig, EstimatorConfigError)):
        try:
            settings(**OmegaConf.to_container(failover[key.split(".")[1]], resolve=True))
        except TypeError as exc:
            valid = ", ".join(f.name for f in dataclasses.fields(settings))
            _fail(key, str(exc), f"use only these keys: {valid}")
        except error as exc:
            _fail(key, str(exc), f"see {settings.__name__} for the ranges")
    try:
        make_policy(cfg.policy.name, **OmegaConf.to_container(cfg.policy.params, resolve=True))
    except PolicyConfigError as exc:
        _fail("policy", str(exc), "choose policy=eta|keep|replan|degrade|ski_rental with its documented params")
    for i, drill in enumerate(failover.drills):
        if not isinstance(drill, DictConfig) or set(drill) - {"step", "action", "device"} or "step" not in drill \
                or drill.get("action") not in ("replan", "degrade", "replace") or int(drill.step) < 1:
            _fail(f"failover.drills[{i}]", f"{drill!r} is not a drill",
                  "write {step: N (>= 1), action: replan|degrade|replace, device: D (optional)}")
    if failover.restart_cost_file is not None and not Path(failover.restart_cost_file).is_file():
        _fail("failover.restart_cost_file", f"{failover.restart_cost_file!r} is not a file",
              "give the JSON written by experiments/bench_restart_cost.py, or null for the repository's default")
    spares = [int(d) for d in cfg.trainer.spare_devices]
    clash = sorted(set(spares) & set(resolve_devices(cfg.trainer)))
    if clash or len(set(spares)) != len(spares):
        _fail("trainer.spare_devices", f"spares {spares} repeat a device or overlap the running devices "
              f"{resolve_devices(cfg.trainer)}", "list idle devices only, each once")
    if resolve_accelerator(cfg.trainer) == "cuda" and spares:
        _check_gpu_ids(spares)


def default_cache_dir() -> str:
    return os.environ.get("SYNAPSE_CACHE", str(Path.home() / ".cache" / "synapse"))
