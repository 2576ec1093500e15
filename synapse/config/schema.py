"""The configuration schema: one frozen dataclass per component, and the Hydra nodes made from them.

The dataclasses here are the types the rest of Synapse receives: the composed config becomes a
``SynapseConfig`` once, at the root (``typed_config``), and each component is handed its own
slice (``cfg.trainer``, ``cfg.failover.detector``). They are frozen, with tuples for sequences:
nothing changes a setting after validation; what a run decides for itself (the micro-batch count
of ``pipeline.microbatches=auto``, the placement) lives in its plan.

Hydra needs mutable nodes to merge YAML and overrides into, so each dataclass has a twin made
from it (``hydra_node``: the same fields, types and defaults, lists for tuples), registered in
Hydra's ConfigStore. A misspelt key, a value of the wrong type or a choice outside its set (every
``Choice`` field) fails while Hydra composes the config; ``validate`` then checks what types
cannot express (a temperature <= 0, a model name we do not know, a GPU id that does not exist).
Each policy has its own parameter schema: the policy group's files extend ``<name>_schema``.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from synapse.calibration import EstimatorConfig
from synapse.decision import POLICY_NAMES, policy_settings_type
from synapse.detection import DetectorConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # any dataclass instance: exists for the type checker only


class Choice(str, enum.Enum):
    """A setting with a fixed set of values, compared as its string (``Precision.bf16 == "bf16"``).
    Hydra refuses any other value while it composes; it looks values up by member *name*, so every
    member is named after its value (an alias where the value is no Python name)."""

    def __str__(self) -> str:
        return str(self.value)


class Mode(Choice):
    kd = "kd"  # distil the student from the teacher
    teacher = "teacher"  # train the teacher with labels
    baseline = "baseline"  # train the student with labels
    profile = "profile"  # measure the block profiles
    simulate = "simulate"  # no workers: the real controller on step timings from the cost model (synapse.simulation)


class Accelerator(Choice):
    auto = "auto"  # cuda when a GPU is visible, else cpu
    cpu = "cpu"
    cuda = "cuda"


class Precision(Choice):
    auto = "auto"  # bf16 autocast on CUDA, fp32 on the CPU
    fp32 = "fp32"
    bf16 = "bf16"


class NonFinitePolicy(Choice):
    stop = "stop"  # raise before the update, naming the step
    skip = "skip"  # drop the step's update on every rank


class HostRead(Choice):
    """When the host reads what the device computed (a loss, a step's timing)."""

    auto = "auto"
    at_step = "at_step"
    late = "late"


class DataName(Choice):
    digits = "digits"
    imagenet100 = "imagenet100"
    synthetic = "synthetic"


class Decode(Choice):
    auto = "auto"  # from the host: the workers if it has cores enough for them, else nvJPEG (synapse.data.host_path)
    cpu = "cpu"  # in the loader workers
    gpu = "gpu"  # on the training device (nvJPEG)


class KDMode(Choice):
    st = "st"  # soft targets: KL at temperature T, times T^2
    logits = "logits"  # MSE on the logits


class OptimizerName(Choice):
    sgd = "sgd"
    adamw = "adamw"


class LRSchedule(Choice):
    cosine = "cosine"
    step = "step"
    constant = "constant"


class PipelineSchedule(Choice):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"


PipelineSchedule._member_map_["1f1b"] = PipelineSchedule.one_f_one_b  # the name users type is no Python name


class StageCompiler(Choice):
    """Which torch.compile backend compiles each stage's blocks (none: they run as written)."""

    none = "none"
    inductor = "inductor"  # fused kernels: what a GPU run wants
    aot_eager = "aot_eager"  # the same graphs run by eager kernels: proves the plumbing on a CPU


class PartitionMode(Choice):
    even = "even"
    manual = "manual"
    auto = "auto"  # planned from the block profiles


class ReplanMode(Choice):
    live = "live"  # the running workers swap blocks and carry on
    restart = "restart"  # checkpoint, tear down, relaunch


class ReplicaEngine(Choice):
    restart = "restart"  # a lost replica ends the launch; every rank relaunches from the newest checkpoint
    torchft = "torchft"  # replica groups with a quorum (torchft): the survivors go on, a returning replica heals


class DrillAction(Choice):
    replan = "replan"
    degrade = "degrade"
    replace_ = "replace"  # a member named replace would hide str.replace


DrillAction._member_map_["replace"] = DrillAction.replace_


class TrackerName(Choice):
    tensorboard = "tensorboard"
    csv = "csv"
    none = "none"


class PolicyName(Choice):
    """The policies of synapse.decision (``POLICY_NAMES``), by name."""

    eta = "eta"  # the lowest ETA, with hysteresis
    keep = "keep"
    replan = "replan"
    degrade = "degrade"
    rebalance = "rebalance"
    shrink = "shrink"
    ski_rental = "ski_rental"


@dataclass(frozen=True)
class TeacherConfig:
    name: str = MISSING
    checkpoint: str | None = None  # local weights file (the seed's --t_model); never downloaded
    # With no checkpoint, train one on the configured data first (cached by model/data/seed).
    auto_train: bool = True
    auto_train_epochs: int = 5
    auto_train_lr: float = 2e-3


@dataclass(frozen=True)
class StudentConfig:
    name: str = MISSING
    init: str | None = None  # local initial weights (the seed's --s_init)
    drop_rate: float = 0.0


@dataclass(frozen=True)
class DataConfig:
    name: DataName = DataName.digits
    root: str | None = None  # ImageNet100: folder holding train/ and val/
    image_size: int = 32
    batch_size: int = 64
    val_batch_size: int = 256
    # Loader processes per rank that reads images, or auto: from the host's cores and ranks, with
    # decode=auto choosing where JPEGs are decoded (synapse.data.host_path).
    num_workers: int | str = 0
    augment: bool = True
    decode: Decode = Decode.auto  # imagenet100 only
    gpu_decode_share: float = 1.0  # decode=gpu/auto on CUDA: fraction of JPEGs the GPU decodes (workers: the rest)
    synthetic_train_size: int = 4096
    synthetic_val_size: int = 512
    synthetic_num_classes: int = 100
    synthetic_in_chans: int = 3


@dataclass(frozen=True)
class KDConfig:
    mode: KDMode = KDMode.st
    T: float = 4.0
    lambda_kd: float = 0.9


@dataclass(frozen=True)
class OptimConfig:
    name: OptimizerName = OptimizerName.adamw
    lr: float = 2e-3
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: LRSchedule = LRSchedule.cosine
    warmup_steps: int = 0
    step_size: int = 1000  # for schedule=step
    gamma: float = 0.1


@dataclass(frozen=True)
class TrainerConfig:
    accelerator: Accelerator = Accelerator.auto
    spare_devices: tuple[int, ...] = ()  # idle devices a REPLACE may swap in (local ids, the same on every node)
    # Per node: CPU, the number of worker slots (or their ids); CUDA, a list of GPU ids (or a count).
    # A count or a list, which OmegaConf cannot type as one union: validate() checks it.
    devices: Any = 1
    # A dry run of a K-GPU config on one GPU: every device id (and spare) is a rank on this GPU,
    # stages exchange through host memory over gloo (NCCL refuses two ranks on one GPU). Everything
    # else (graphs, clocks, checkpoints, detection, failover) is the multi-GPU code; correctness
    # carries over, throughput does not. None: each device id is its own GPU.
    shared_gpu: int | None = None
    nodes: int = 1  # machines taking part; each runs train.py with the same config
    # Data-parallel replicas of the pipeline: the run's devices (all nodes, in order) hold replica after
    # replica (R x K when cut alike: replica r's stage s on device r*K + s; partition.replica_stages cuts
    # them apart); each replica trains on its share of the global batch and the student's gradients are
    # summed, weighted by share, over the owners of each block (synapse.pipeline.replicas). 1: one pipeline.
    # auto: partition=auto chooses R with the cuts and micro-batches (synapse.partitioning.layout).
    replicas: int | str = 1
    # Images of each step's global batch per replica (a multiple of the micro-batch count each, summing
    # to data.batch_size); None: equal shares. A REBALANCE or a dropped replica sets it for its segment.
    replica_shares: tuple[int, ...] | None = None
    node_rank: int = 0  # 0 hosts the rendezvous store; c10d rendezvous assigns the process ranks
    # Across nodes (failover.enabled): what this launcher runs. auto: node 0 serves the run's store, keeps the
    # decider running and runs node 0's agent; every other node runs its agent. decider: only the store and
    # the decider, on a host that needs no device (a Slurm batch host, a het-job component); the nodes then
    # all run role=agent, node 0 included. agent: only this node's agent (its workers).
    role: str = "auto"
    # The devices of each node when they differ (a failover segment after a device or node was dropped,
    # composed by the supervisor); None: trainer.devices on every node.
    node_devices: tuple[tuple[int, ...], ...] | None = None
    rdzv_endpoint: str | None = None  # host:port of the c10d store for nodes > 1 (default: a free local port)
    rdzv_id: str | None = None  # the same string on every node of one run (default: derived from run_dir)
    # Not a setting: across nodes the decider sets it on each segment's config, the epoch of the decider whose
    # workers these are (failover/epoch.py); their checkpoint commits carry it and are refused once a newer
    # decider exists. 0: no decider across nodes (no fence)
    decider_epoch: int = 0
    collective_timeout_s: float = 120.0  # a hung peer fails the launch after this, never a silent hang
    rdzv_timeout_s: int = 60
    epochs: int = 6
    max_steps: int | None = None  # length of the schedule in optimizer steps (overrides epochs)
    # Stop this launch after N steps with a checkpoint (the schedule is unchanged): splits a run
    # into pieces that resume=auto continues, e.g. to fit a job time limit.
    stop_after: int | None = None
    precision: Precision = Precision.auto
    channels_last: bool | None = None  # None: on CUDA, off on the CPU; true/false: on/off on both
    cudnn_benchmark: bool = True
    threads: int | None = None  # torch intra-op threads per process (None: torch's default)
    eval_every_epochs: int = 1
    log_every: int = 1
    progress: bool = True  # one bar (drawn by the supervisor from the records); off a terminal, a few lines
    # Before a launch's first step every rank times the same small fixed workload, in turn where ranks
    # share hardware (synapse/health/speed_probe.py, ~0.1-0.6 s in all on 3 CPU ranks): a device slow
    # from the start reads slow there, which step times cannot tell from a heavy stage
    # (failover.detector.probe_threshold). false: no probe.
    start_probe: bool = True
    # Whose output reaches the console, as torchrun's --local-ranks-filter: local ranks (() none, None all).
    # Every rank's stdout/stderr is in <run dir>/logs/launch_<n>/; a failed rank's last lines are printed.
    local_ranks_filter: tuple[int, ...] | None = (0,)
    deterministic: bool = False
    # A step whose loss is NaN or infinite: stop (raise before the update, naming the step) or
    # skip (drop its update on every rank; the step still counts and the schedule advances).
    nonfinite: NonFinitePolicy = NonFinitePolicy.stop
    # When a pipeline's last rank reads the loss to check it: at_step (before the update: a host sync
    # in the middle of every step, which leaves the GPU idle while the host issues the optimizer step
    # and the next batch) or late (when the loss is read for the record, a step later; under stop the
    # run still ends before any checkpoint holds the bad step). auto: late on CUDA under stop, at_step
    # otherwise (skip must know before the update; on the CPU a sync costs nothing).
    nonfinite_check: HostRead = HostRead.auto


@dataclass(frozen=True)
class PipelineConfig:
    schedule: PipelineSchedule = PipelineSchedule.one_f_one_b
    # Micro-batches per step (a count), or "auto": the planner chooses the count with the cuts
    # (synapse.partitioning.microbatches) and the run's plan holds it. With one device this is
    # gradient accumulation over the same micro-batches.
    microbatches: int | str = 1
    # On CUDA, capture each stage's teacher forward and student forward/backward as CUDA graphs
    # and replay them (synapse.pipeline.graphs): small micro-batches stop being launch bound.
    # Ignored on the CPU; a shape whose capture fails runs eagerly, with a logged reason.
    cuda_graphs: bool = True
    # torch.compile each block of each stage (teacher forward; student forward and backward) with
    # this backend. A compiled stage is not graph-captured: on one H200 inductor's fused kernels
    # beat graph replays of eager kernels (docs/gpu.md). The first steps compile (tens of seconds).
    compiler: StageCompiler = StageCompiler.none
    # When each rank reads its step timing (the records the failover controller reads): at_step
    # (a synchronize at every step's end on CUDA: the GPU idles while the host writes records and
    # issues the next step) or late (at the end of the next step; the last one when the loop ends).
    # auto: late on CUDA, at_step on the CPU (where it costs nothing; late there tests the path).
    timing_read: HostRead = HostRead.auto


@dataclass(frozen=True)
class PartitionConfig:
    mode: PartitionMode = PartitionMode.even
    teacher: tuple[int, ...] | None = None  # blocks per stage, for mode=manual
    student: tuple[int, ...] | None = None
    # Replicas cut differently (trainer.replicas > 1, mode even or manual): each replica's stage count, e.g.
    # [2, 1] on 3 devices (replica 0 a pipeline of 2, replica 1 one device); partition.teacher/student then
    # list every replica's stages, replica after replica. None: every replica cut alike (devices / replicas).
    replica_stages: tuple[int, ...] | None = None
    # mode=auto: relative device speeds (1.0 = as profiled; e.g. [1, 1, 3] for a slowed device),
    # link bandwidth between neighbours (None: communication not modelled), profiling effort.
    alphas: tuple[float, ...] | None = None
    link_bandwidth_gbps: float | None = None
    # trainer.nodes > 1: the link between nodes, priced on every stage boundary that crosses nodes
    # (None: as fast as link_bandwidth_gbps); e.g. 12.5 for 100 Gb/s Ethernet or InfiniBand EDR.
    node_link_bandwidth_gbps: float | None = None
    profile_warmup: int = 3
    profile_repeats: int = 10


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 0  # save every N optimizer steps (0: only at epoch ends and the end)
    keep: int = 2  # how many recent checkpoints to keep
    at_epoch_end: bool = True
    # Write in the background (torch.distributed.checkpoint.async_save): the loop is held only while
    # the state is copied to host memory; false: each save is committed before training goes on.
    async_save: bool = True


@dataclass(frozen=True)
class FaultSettings:
    """One injected fault; which keys each kind takes is synapse.injection.spec's to say (unset:
    not given). E.g. {kind: slow_compute, rank: 2, start: 70, factor: 4}."""

    kind: str | None = None
    rank: int | None = None
    phase: Any = None  # one phase or a list of phases (OmegaConf cannot type that union; the spec checks it)
    fault_id: int | None = None
    step: int | None = None
    start: int | None = None
    end: int | None = None
    seconds: float | None = None
    factor: float | None = None
    bytes_per_s: float | None = None
    ramp_steps: int | None = None
    on_steps: int | None = None
    off_steps: int | None = None
    workers: int | None = None
    matrix_size: int | None = None

    def given(self) -> dict[str, Any]:
        """The keys this fault sets (what synapse.injection.spec parses)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class InjectionConfig:
    name: str = "none"  # the scenario's label (conf/injection/<name>.yaml)
    faults: tuple[FaultSettings, ...] = ()

    def fault_dicts(self) -> list[dict[str, Any]]:
        return [fault.given() for fault in self.faults]


@dataclass(frozen=True)
class MonitorConfig:
    """The supervisor's health monitor: worker liveness and hangs, NVML, CUDA probes."""

    enabled: bool = True
    period_s: float = 5.0
    hang_timeout_s: float = 300.0  # covers evaluation and checkpoints, which write no heartbeat
    nvml: bool = True
    probe: bool = True
    probe_every_s: float = 60.0
    probe_timeout_s: float = 30.0


@dataclass(frozen=True)
class NoParams:
    """A policy that takes no parameters."""


@dataclass(frozen=True)
class PolicyConfig:
    """``policy=<name>``: the decision policy and its own parameters (``params`` is an instance of
    that policy's settings type, synapse.decision's ``EtaPolicyConfig``, ``SkiRentalConfig``, or
    ``NoParams``; the policy group's files carry each one's schema)."""

    name: PolicyName = PolicyName.eta
    params: Any = None


@dataclass(frozen=True)
class DrillConfig:
    """A fire drill: a forced action at a step (measures a restart's cost, proves a restart changes
    nothing that is learned)."""

    step: int = MISSING  # >= 1
    action: DrillAction = MISSING
    device: int | None = None  # the device degrade/replace drops (default: the last)


@dataclass(frozen=True)
class FailoverConfig:
    """The supervisor's failover loop: watch step timings, decide by ETA, checkpoint and restart."""

    enabled: bool = True  # false: a plain run under no supervisor (a worker failure ends the run)
    max_restarts: int = 3  # planned (REPLAN/DEGRADE/REPLACE) and failure restarts together; live REPLANs are free
    decide_every: int = 1  # steps between two decisions while a slowdown is detected
    replan_mode: ReplanMode = ReplanMode.live
    # What carries the replica level (trainer.replicas > 1, replicas cut alike): restart, or torchft (one elastic
    # launch per replica under a lighthouse; docs/layouts.md "torchft")
    replica_engine: ReplicaEngine = ReplicaEngine.restart
    replica_respawns: int = 3  # torchft: how often each replica's elastic agent respawns its dead workers
    replica_heartbeat_timeout_s: float = 1.0  # torchft: how long the survivors wait for a silent replica
    restart_cost_file: str | None = None  # JSON of experiments/bench_restart_cost.py (None: the repo's)
    # The slowdown detector's and the alpha/beta estimator's own settings (failover.detector.window=5)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    # Fire drills: forced actions at given steps, e.g. [{step: 40, action: replan}]
    drills: tuple[DrillConfig, ...] = ()
    # trainer.nodes > 1: a node whose agent has not beaten for this long is lost (its devices dropped)
    node_timeout_s: float = 10.0
    # trainer.nodes > 1: node 0's launcher restarts a decider that died this many times (each under a new
    # epoch, from the newest checkpoint); the agents wait this long for the new one before they give up
    decider_restarts: int = 3
    decider_grace_s: float = 120.0


@dataclass(frozen=True)
class SimulateConfig:
    """mode=simulate: what stands in for the hardware. trainer.devices is then a count of simulated
    devices (none need exist); the policy, detector, estimator and restart priors are the real ones."""

    # Block-profile CSVs (experiments/profile_models.py); null: the cached profiles of teacher.name and
    # student.name, measured on this machine's CPU if missing (trainer.accelerator=cpu only).
    teacher_profile: str | None = None
    student_profile: str | None = None
    # Step-to-step noise: auto (the one recorded on the accelerator's kind, shipped in synapse.simulation),
    # none, or the path of a fault-free performance.jsonl to draw it from.
    step_noise: str = "auto"
    # Faults besides injection.faults: a CSV trace (columns device, kind, start_s or start_step, and
    # duration_s or end_step, factor) and random ones from rates: mean hours between events per device.
    trace: str | None = None
    fail_slow_mtbf_h: float | None = None  # compute fail-slows
    fail_slow_duration_s: float = 600.0
    fail_slow_factor: float = 2.0
    comm_fail_slow_mtbf_h: float | None = None  # a device's link slows
    comm_fail_slow_duration_s: float = 1440.0
    comm_fail_slow_factor: float = 2.0
    fail_stop_mtbf_h: float | None = None  # a device dies
    node_loss_mtbf_h: float | None = None  # a node goes, every device on it at once (per node)
    failure_detect_s: float = 5.0  # from a death to the supervisor's decision (heartbeat and teardown)
    # Simulated GPUs (trainer.accelerator=cuda): memory each, and devices per node (links between nodes are
    # partition.node_link_bandwidth_gbps).
    gpu_memory_gb: float = 141.0
    gpus_per_node: int = 8


@dataclass(frozen=True)
class LoggerConfig:
    """Where the run's scalars also go (synapse.trackers)."""

    name: TrackerName = TrackerName.tensorboard


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "default"
    description: str = ""


@dataclass(frozen=True)
class SynapseConfig:
    mode: Mode = Mode.kd
    seed: int = 0
    resume: str | None = None  # a checkpoint path, or 'auto' for the newest one in the run dir
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
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)


# ---------------------------------------------------------------- Hydra's mutable twins
_NODES: dict[type, type] = {}  # frozen dataclass -> its Hydra node
_FROZEN: dict[type, type] = {}  # Hydra node -> its frozen dataclass
# The same by the node's name (None: two nodes of one name). A node class is made at import and cannot be
# imported by name, so a config pickled into another process (submitit's jobs: hydra/launcher=slurm,
# slurm_nodes, local_sequential) brings a copy of its class, which is not the key above.
_FROZEN_BY_NAME: dict[str, type | None] = {}


def _remember_frozen(node: type, frozen: type) -> None:
    _FROZEN[node] = frozen
    known = _FROZEN_BY_NAME.get(node.__name__, frozen)
    _FROZEN_BY_NAME[node.__name__] = frozen if known is frozen else None


def _node_hint(hint: Any) -> Any:
    """The Hydra node's type for a frozen field's: tuples become lists, dataclasses their nodes."""
    if isinstance(hint, types.UnionType):  # OmegaConf reads typing.Union/Optional, not X | None
        hint = typing.Union[hint.__args__]  # noqa: UP007
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        return Union[tuple(_node_hint(a) for a in args)]  # noqa: UP007
    if origin is tuple:
        return list[_node_hint(args[0])]  # type: ignore[misc]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hydra_node(hint)
    return hint


def _node_default(f: dataclasses.Field[Any]) -> Any:
    """The Hydra node field's default: nested settings and sequences as fresh node values."""
    if f.default_factory is not dataclasses.MISSING:  # a nested settings object
        made = f.default_factory()
        return field(default_factory=lambda: _to_node(made))
    default = f.default
    if isinstance(default, tuple):
        return field(default_factory=lambda: [_to_node(v) for v in default])
    return field(default=default)


def _to_node(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        node = hydra_node(type(value))
        return node(**{f.name: _to_node(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, tuple):
        return [_to_node(v) for v in value]
    return value


def hydra_node(settings: type, base: type | None = None) -> type:
    """``settings``' Hydra twin: the same fields, types and defaults, mutable, lists for tuples
    (one source for every number: the frozen dataclass). ``base``: the node class it extends."""
    if settings in _NODES and base is None:
        return _NODES[settings]
    hints = typing.get_type_hints(settings)
    node = dataclasses.make_dataclass(
        f"{settings.__name__}Node", [(f.name, _node_hint(hints[f.name]), _node_default(f))
                                     for f in dataclasses.fields(settings)], bases=(base,) if base else ())
    if base is None:
        _NODES[settings] = node
    _remember_frozen(node, settings)
    return node


def _policy_node(name: str) -> type:
    """``policy=<name>``'s schema: ``PolicyConfig`` with the policy's own settings type as ``params``."""
    settings = policy_settings_type(name) or NoParams
    params = hydra_node(settings)
    node = dataclasses.make_dataclass(
        f"{settings.__name__}PolicyNode", [("name", PolicyName, field(default=PolicyName(name))),
                                           ("params", params, field(default_factory=params))],
        bases=(hydra_node(PolicyConfig),))
    _remember_frozen(node, PolicyConfig)
    return node


def register_configs() -> None:
    """The schema for ``conf/config.yaml``'s defaults list (``synapse_schema``), and each policy's
    for its group file (``policy/<name>_schema``)."""
    store = ConfigStore.instance()
    store.store(name="synapse_schema", node=hydra_node(SynapseConfig))
    for name in POLICY_NAMES:
        store.store(group="policy", name=f"{name}_schema", node=_policy_node(name))


def _times(*values: Any) -> int:
    """``${synapse.times:256,${trainer.devices}}``: the product of counts, a list counting its entries (a
    global batch of 256 images per device, for a sweep over the device count: conf/experiment/simulate_h200)."""
    product = 1
    for value in values:
        product *= len(value) if isinstance(value, (list, tuple, ListConfig)) else int(value)
    return product


register_configs()
OmegaConf.register_new_resolver("synapse.times", _times, replace=True)


# ---------------------------------------------------------------- composed -> typed
def typed_config(cfg: DictConfig) -> SynapseConfig:
    """The composed config as the frozen ``SynapseConfig`` the rest of Synapse receives (once, at
    the root; interpolations resolved). A policy's parameters become its settings type."""
    typed = _freeze(OmegaConf.to_object(cfg), SynapseConfig)
    assert isinstance(typed, SynapseConfig)
    return typed


def _freeze(value: Any, hint: Any) -> Any:
    """A Hydra node's value as its frozen type (``hint``): nodes to their frozen dataclasses (whose
    checks then run), lists to tuples."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (Union, types.UnionType) and len(args) == 1:
        hint = args[0]  # Optional[X]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = _FROZEN.get(type(value)) or _FROZEN_BY_NAME.get(type(value).__name__) or type(value)
        hints = typing.get_type_hints(frozen)
        return frozen(**{f.name: _freeze(getattr(value, f.name), hints[f.name]) for f in dataclasses.fields(frozen)})
    if isinstance(value, (list, tuple)):
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else Any
        return tuple(_freeze(v, item) for v in value)
    return value


def config_dict(cfg: DataclassInstance | DictConfig) -> dict[str, Any]:
    """Plain data of a config or one of its groups (choices as their values, tuples as lists): what YAML
    files hold."""
    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    data = plain(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg)
    assert isinstance(data, dict)
    return data


def config_yaml(cfg: SynapseConfig | DictConfig) -> str:
    """A config as YAML, choices written as users type them (``schedule: 1f1b``)."""
    return str(yaml.safe_dump(config_dict(cfg), sort_keys=False, default_flow_style=None, width=120))


def as_node(cfg: SynapseConfig) -> DictConfig:
    """A typed config as the composed DictConfig it came from (what ``validate`` reads)."""
    node = OmegaConf.structured(_to_node(cfg))
    assert isinstance(node, DictConfig)
    return node


def with_settings(cfg: SynapseConfig, settings: dict[str, Any]) -> SynapseConfig:
    """``cfg`` with dotted keys set (``{"trainer.devices": [0, 2]}``): a new frozen config, checked
    and converted as Hydra would (choices by name, lists to tuples)."""
    node = as_node(cfg)
    for key, value in settings.items():
        # A list is merged (OmegaConf replaces a list whole on merge): assigned, a list of dicts would not
        # be converted to its typed elements (injection.faults' FaultSettings) and is refused.
        OmegaConf.update(node, key, value, merge=isinstance(value, (list, tuple)))
    return typed_config(node)


def config_from_yaml(text: str) -> SynapseConfig:
    """A config that ``config_yaml`` wrote, typed again (an agent reads its node's this way)."""
    data = yaml.safe_load(text)
    node = OmegaConf.structured(hydra_node(SynapseConfig))
    node.policy = OmegaConf.structured(_policy_node(str(data["policy"]["name"])))
    merged = OmegaConf.merge(node, data)
    assert isinstance(merged, DictConfig)
    return typed_config(merged)


def to_container(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def default_cache_dir() -> str:
    return os.environ.get("SYNAPSE_CACHE", str(Path.home() / ".cache" / "synapse"))


# Kept for messages that list the valid values.
MODES = tuple(m.value for m in Mode)
NONFINITE_POLICIES = tuple(p.value for p in NonFinitePolicy)
