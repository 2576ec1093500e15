"""The configuration schema: one dataclass per component, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` merge onto these dataclasses, so a misspelt key or a value of
the wrong type fails while Hydra composes the config.
"""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from synapse.calibration import EstimatorConfig
from synapse.detection import DetectorConfig


def settings_node(settings: type) -> type:
    """A component's frozen settings dataclass as a schema node: the same fields, types and defaults
    (one source for the numbers), but mutable, as Hydra overrides need (a frozen one is read-only)."""
    hints = typing.get_type_hints(settings)

    def schema_type(hint: Any) -> Any:
        if isinstance(hint, types.UnionType):  # OmegaConf reads typing.Optional, not X | None
            return typing.Union[hint.__args__]  # noqa: UP007
        return hint

    return dataclasses.make_dataclass(
        f"{settings.__name__}Node",
        [(f.name, schema_type(hints[f.name]), field(default=f.default)) for f in dataclasses.fields(settings)])


DetectorSettings = settings_node(DetectorConfig)
EstimatorSettings = settings_node(EstimatorConfig)

MODES = ("kd", "teacher", "baseline", "profile")
ACCELERATORS = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "step", "constant")
PIPELINE_SCHEDULES = ("1f1b", "gpipe")
PARTITION_MODES = ("even", "manual", "auto")
NONFINITE_POLICIES = ("stop", "skip")
NONFINITE_CHECKS = ("auto", "at_step", "late")
TIMING_READS = NONFINITE_CHECKS  # the same question: when the host reads what the GPU computed


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
    decode: str = "auto"  # imagenet100: cpu (loader workers) | gpu (training device, nvJPEG) | auto (gpu on CUDA)
    gpu_decode_share: float = 1.0  # decode=gpu/auto on CUDA: fraction of JPEGs the GPU decodes (workers: the rest)
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
    nodes: int = 1  # machines taking part; each runs train.py with the same config
    node_rank: int = 0  # 0 hosts the rendezvous store; c10d rendezvous assigns the process ranks
    # The devices of each node when they differ (a failover segment after a device or node was dropped,
    # composed by the supervisor); None: trainer.devices on every node.
    node_devices: Optional[list[list[int]]] = None
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
    channels_last: Optional[bool] = None  # None: on CUDA, off on the CPU; true/false: on/off on both
    cudnn_benchmark: bool = True
    threads: Optional[int] = None  # torch intra-op threads per process (None: torch's default)
    eval_every_epochs: int = 1
    log_every: int = 1
    progress: bool = True  # one bar (a pipeline's is the supervisor's, from the records); off a terminal, a few lines
    # Whose output reaches the console, as torchrun's --local-ranks-filter: local ranks ([] none, null all).
    # Every rank's stdout/stderr is in <run dir>/logs/launch_<n>/; a failed rank's last lines are printed.
    local_ranks_filter: Optional[list[int]] = field(default_factory=lambda: [0])
    deterministic: bool = False
    # A step whose loss is NaN or infinite: stop (raise before the update, naming the step) or
    # skip (drop its update on every rank; the step still counts and the schedule advances).
    nonfinite: str = "stop"
    # When the trainer (one device, or a pipeline's last rank) reads the loss to check it: at_step
    # (before the update: a host sync in the middle of every step, which leaves the GPU idle while
    # the host issues the optimizer step and the next batch) or late (when the loss is read for the
    # record, a step later; under stop the run still ends before any checkpoint holds the bad step).
    # auto: late on CUDA under stop, at_step otherwise (skip must know before the update; on the
    # CPU a sync costs nothing).
    nonfinite_check: str = "auto"


@dataclass
class PipelineConfig:
    schedule: str = "1f1b"
    # Micro-batches per step (an integer), or "auto": the planner chooses the count with the cuts
    # (synapse.partitioning.microbatches; the GPU preset's default). With one device this is gradient
    # accumulation over the same micro-batches, the reference the pipelined runtime must reproduce.
    microbatches: Any = 1
    # On CUDA, capture each stage's teacher forward and student forward/backward as CUDA graphs
    # and replay them (synapse.pipeline.graphs): small micro-batches stop being launch bound.
    # Ignored on the CPU; a shape whose capture fails runs eagerly, with a logged reason.
    cuda_graphs: bool = True
    # When each rank reads its step timing (the records the failover controller reads): at_step
    # (a synchronize at every step's end on CUDA: the GPU idles while the host writes records and
    # issues the next step) or late (at the end of the next step; the last one when the loop ends).
    # auto: late on CUDA, at_step on the CPU (where it costs nothing; late there tests the path).
    timing_read: str = "auto"


@dataclass
class PartitionConfig:
    mode: str = "even"
    teacher: Optional[list[int]] = None  # blocks per stage, for mode=manual
    student: Optional[list[int]] = None
    # mode=auto: relative device speeds (1.0 = as profiled; e.g. [1, 1, 3] for a slowed device),
    # link bandwidth between neighbours (None: communication not modelled), profiling effort.
    alphas: Optional[list[float]] = None
    link_bandwidth_gbps: Optional[float] = None
    # trainer.nodes > 1: the link between nodes, priced on every stage boundary that crosses nodes
    # (None: as fast as link_bandwidth_gbps); e.g. 12.5 for 100 Gb/s Ethernet or InfiniBand EDR.
    node_link_bandwidth_gbps: Optional[float] = None
    profile_warmup: int = 3
    profile_repeats: int = 10


@dataclass
class CheckpointConfig:
    every: int = 0  # save every N optimizer steps (0: only at epoch ends and the end)
    keep: int = 2  # how many recent checkpoints to keep
    at_epoch_end: bool = True
    # Write in the background (torch.distributed.checkpoint.async_save): the loop is held only while
    # the state is copied to host memory; false: each save is committed before training goes on.
    async_save: bool = True


@dataclass
class FaultSettings:
    """One injected fault; which keys each kind takes is synapse.injection.spec's to say (unset:
    not given). E.g. {kind: slow_compute, rank: 2, start: 70, factor: 4}."""

    kind: Optional[str] = None
    rank: Optional[int] = None
    phase: Any = None  # one phase or a list of phases
    fault_id: Optional[int] = None
    step: Optional[int] = None
    start: Optional[int] = None
    end: Optional[int] = None
    seconds: Optional[float] = None
    factor: Optional[float] = None
    bytes_per_s: Optional[float] = None
    ramp_steps: Optional[int] = None
    on_steps: Optional[int] = None
    off_steps: Optional[int] = None
    workers: Optional[int] = None
    matrix_size: Optional[int] = None


@dataclass
class InjectionConfig:
    name: str = "none"
    faults: list[FaultSettings] = field(default_factory=list)


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


def policy_params_node() -> type:
    """Every policy's parameters in one node, each unset by default (the policy's own default):
    the fields and types of the policies' settings dataclasses, so a misspelt or mistyped
    parameter fails when the config is composed; which policy takes which is checked by validate()."""
    from synapse.decision import POLICY_SETTINGS

    fields_by_name: dict[str, Any] = {}
    for settings in POLICY_SETTINGS:
        for name, hint in typing.get_type_hints(settings).items():
            if typing.get_origin(hint) is tuple:  # OmegaConf holds sequences as lists
                hint = list[typing.get_args(hint)[0]]
            fields_by_name.setdefault(name, Optional[hint])
    return dataclasses.make_dataclass("PolicyParams", [(n, h, field(default=None)) for n, h in fields_by_name.items()])


PolicyParams = policy_params_node()


@dataclass
class PolicyConfig:
    name: str = "eta"
    params: PolicyParams = field(default_factory=PolicyParams)


@dataclass
class DrillConfig:
    """A fire drill: a forced action at a step (measures a restart's cost, proves a restart changes
    nothing that is learned)."""

    step: int = MISSING  # >= 1
    action: str = MISSING  # replan | degrade | replace
    device: Optional[int] = None  # the device degrade/replace drops (default: the last)


@dataclass
class FailoverConfig:
    """The supervisor's failover loop: watch step timings, decide by ETA, checkpoint and restart."""

    enabled: bool = True  # false: a plain pipeline run (a worker failure ends the run)
    max_restarts: int = 3  # planned (REPLAN/DEGRADE/REPLACE) and failure restarts together; live REPLANs are free
    decide_every: int = 1  # steps between two decisions while a slowdown is detected
    # live: the running workers swap blocks and carry on (no checkpoint, no new processes);
    # restart: checkpoint, tear down, relaunch with the new partition
    replan_mode: str = "live"
    restart_cost_file: Optional[str] = None  # JSON of experiments/bench_restart_cost.py (None: the repo's)
    # The slowdown detector's and the alpha/beta estimator's own settings types (failover.detector.window=5)
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    estimator: EstimatorSettings = field(default_factory=EstimatorSettings)
    # Fire drills: forced actions at given steps, e.g. [{step: 40, action: replan}]
    drills: list[DrillConfig] = field(default_factory=list)
    # trainer.nodes > 1: a node whose agent has not beaten for this long is lost (its devices dropped)
    node_timeout_s: float = 10.0


@dataclass
class LoggerConfig:
    """Where the run's scalars also go (synapse.trackers): tensorboard, csv or none."""

    name: str = "tensorboard"


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
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)


def register_configs() -> None:
    """Make the schema available to ``conf/config.yaml``'s defaults list as ``synapse_schema``."""
    ConfigStore.instance().store(name="synapse_schema", node=SynapseConfig)


register_configs()


def to_container(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def default_cache_dir() -> str:
    return os.environ.get("SYNAPSE_CACHE", str(Path.home() / ".cache" / "synapse"))
