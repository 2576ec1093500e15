"""``validate``: check what types cannot express, before any work starts.

A temperature <= 0, a model name we do not know, a GPU id that does not exist: each raises
``ConfigError`` naming the offending key and a fix. In order:

1. the whole tree: no key outside the schema, no NaN or inf anywhere (free-form dicts
   included; NaN passes every range check, so this comes first);
2. the range checks of the models, data, KD, optimizer, trainer, pipeline and partition groups
   (and every float's sane range, ``synapse/config/ranges.py``, after step 3's own checks);
3. the fault-tolerance groups (injection, the health monitor, failover: detector, estimator,
   policy, drills, restart costs; spare devices), each checked by the component that owns it
   (fault specs, `HealthSettings`, `DetectorConfig`, `EstimatorConfig`, the policies), built
   once here with its errors turned into ``ConfigError``;
4. the config against the schedule, models, data and files it names: faults and drills inside
   the run's steps, a writable cache, block counts per stage,
   micro-batches BatchNorm cannot train on, weight files and the checkpoint to resume from.
   The models are built on the meta device (shapes only: no memory, no compute).
"""
from __future__ import annotations

import bisect
import dataclasses
import difflib
import itertools
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from synapse.config.devices import (
    MAX_CPU_SLOTS,
    check_gpu_ids,
    decides_elsewhere,
    fixed_replicas,
    num_ranks,
    num_stages,
    resolve_accelerator,
    resolve_devices,
)
from synapse.config.errors import fail, finite, positive
from synapse.config.ranges import check_float_ranges
from synapse.config.supported_torch import require_supported_torch
from synapse.rundir import CHECKPOINTS, PERFORMANCE


def _plain(node: Any) -> Any:
    """A composed node as plain containers (what the components' own checks take)."""
    return OmegaConf.to_container(node, resolve=True)


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
    for key in map(str, node.keys()):
        if key not in allowed:
            unknown.append((f"{prefix}{key}", difflib.get_close_matches(key, allowed, n=1)))
        elif dataclasses.is_dataclass(OmegaConf.get_type(node, key)):
            unknown += _unknown_keys(node[key], f"{prefix}{key}.")
    return unknown


def validate_finite(node: Any, prefix: str = "") -> None:
    """Every float of the config, however deep (lists, free-form dicts such as policy.params and
    failover.detector): finite. Before any range check, since NaN passes them all."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        path = f"{prefix}[{key}]" if isinstance(node, list) else f"{prefix}{'.' if prefix else ''}{key}"
        if isinstance(value, (dict, list)):
            validate_finite(value, path)
        else:
            finite(path, value)


def validate_known_keys(cfg: DictConfig) -> None:
    for key, close in _unknown_keys(cfg):
        parent = key.rpartition(".")[0]
        suggestion = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
        fail(key, "is not a Synapse setting (added with a '+' override?)",
              f"remove the override{suggestion or '.'} Valid keys are the fields in synapse/config/schema.py")


def validate_block_counts(cfg: DictConfig) -> None:
    """Pipeline runs: at most one stage per block, and manual counts that sum to the models' blocks.

    The models are built on the meta device to count their blocks: no memory, a few ms even for ViT-L.
    """
    if cfg.mode != "kd":
        return
    from synapse.data import data_kwargs, dataset_info
    from synapse.models import count_blocks
    from synapse.partitioning import even_counts

    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    stages = replica_stage_counts(cfg)
    if stages is None:
        return  # trainer.replicas=auto: the planner considers only stage counts the models allow
    for role in ("teacher", "student"):
        name = cfg[role].name
        blocks = count_blocks(name, info.num_classes, info.in_chans, info.image_size)
        k = max(stages)
        if k > blocks:
            fail("trainer.devices", f"{k} pipeline stages but the {role} {name} has only {blocks} blocks "
                  f"(every stage holds at least one)", f"use at most {blocks} devices, or a deeper {role}")
        if cfg.partition.mode != "manual":
            continue
        counts = list(cfg.partition[role])
        start = 0
        for k in stages if cfg.partition.replica_stages else stages[:1]:  # alike: one replica's counts
            cut = counts[start:start + k]
            start += k
            if sum(cut) != blocks:
                whose = "each replica's counts" if cfg.partition.replica_stages else "the counts"
                fail(f"partition.{role}", f"{cut} covers {sum(cut)} blocks but the {role} {name} has {blocks}",
                     f"make {whose} sum to {blocks}, e.g. partition.{role}={list(even_counts(blocks, k))}")


def replica_stage_counts(cfg: DictConfig) -> list[int] | None:
    """Each replica's stage count (partition.replica_stages, or devices / replicas for all); None while
    trainer.replicas=auto."""
    if cfg.partition.replica_stages:
        return [int(k) for k in cfg.partition.replica_stages]
    k = num_stages(cfg.trainer)
    return None if k is None else [k] * int(cfg.trainer.replicas)


def validate_single_sample_batch_norm(cfg: DictConfig) -> None:
    """A micro-batch of one sample cannot train a model whose BatchNorm sees one value per channel
    (after global pooling): torch refuses it mid-profile or mid-step. Found here by one forward on
    the meta device (shapes only: no memory, no compute)."""
    if cfg.pipeline.microbatches == "auto":
        return  # the planner only considers micro-batches of two samples or more
    micro = cfg.data.batch_size // (cfg.pipeline.microbatches if cfg.mode == "kd" else 1)
    if micro != 1 or cfg.mode == "profile":
        return
    import torch

    from synapse.data import data_kwargs, dataset_info
    from synapse.models import build_model

    trained = {"teacher": ["teacher"], "baseline": ["student"]}.get(cfg.mode, ["student"])
    if cfg.mode == "kd" and not cfg.teacher.checkpoint and cfg.teacher.auto_train:
        trained.append("teacher")  # trained with labels first
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    for role in trained:
        with torch.device("meta"):
            model = build_model(cfg[role].name, info.num_classes, info.in_chans, info.image_size).train()
            try:
                model(torch.empty(1, info.in_chans, info.image_size, info.image_size))
            except Exception as exc:  # noqa: BLE001  (a model the meta device cannot run: the step will tell)
                if "Expected more than 1 value per channel" not in str(exc):
                    continue
                where = (f"data.batch_size={cfg.data.batch_size} / pipeline.microbatches={cfg.pipeline.microbatches}"
                         if cfg.mode == "kd" else f"data.batch_size={cfg.data.batch_size}")
                fail("data.batch_size", f"{where} gives micro-batches of one sample, but the {role} "
                     f"{cfg[role].name} has BatchNorm layers that see one value per channel then ({exc})",
                     "use at least 2 samples per micro-batch (a larger data.batch_size or fewer micro-batches)")


def validate_weight_files(cfg: DictConfig) -> None:
    """teacher.checkpoint and student.init must fit the configured models and data (names and shapes),
    checked here so that a wrong file fails once, not in every pipeline worker."""
    from synapse.data import data_kwargs, dataset_info
    from synapse.models import check_weights_file

    used = {"kd": ("teacher.checkpoint", "student.init"), "baseline": ("student.init",)}.get(cfg.mode, ())
    files = [(key, OmegaConf.select(cfg, key)) for key in used if OmegaConf.select(cfg, key)]
    if not files:
        return
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    for key, path in files:
        model_name = cfg[key.split(".")[0]].name
        check_weights_file(model_name, path, info.num_classes, info.in_chans, info.image_size, what=key)


def validate_resume(cfg: DictConfig) -> None:
    """The checkpoint a KD run resumes from must be finished, of a format version this Synapse reads,
    and hold the configured student (names and shapes): refused here, before any worker starts."""
    if cfg.resume is None:
        return
    if cfg.resume != "auto" and not Path(cfg.resume).exists():
        fail("resume", f"checkpoint {cfg.resume!r} does not exist",
              "give the path of a checkpoint directory, or resume=auto to take the newest in the run dir")
    if cfg.mode != "kd":
        return  # only distillation resumes
    import torch

    from synapse import checkpoint as ckpt
    from synapse.data import data_kwargs, dataset_info
    from synapse.models import build_model

    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    with torch.device("meta"):
        student = build_model(cfg.student.name, info.num_classes, info.in_chans, info.image_size)
    shapes = {key: tuple(t.shape) for key, t in student.state_dict().items()}
    if cfg.resume == "auto":
        ckpt.check_run_checkpoints(CHECKPOINTS.path(cfg.run_dir), cfg.student.name, shapes)
    else:
        ckpt.check_resumable(Path(cfg.resume), cfg.student.name, shapes)


def validate_injection(cfg: DictConfig, ranks: int | None = None) -> None:
    """``ranks``: the run's worker count when no real device is resolved (mode=simulate)."""
    from synapse.injection import InjectionError, parse_faults

    try:
        parse_faults(_plain(cfg.injection.faults), num_ranks(cfg.trainer) if ranks is None else ranks)
    except (InjectionError, KeyError, TypeError, ValueError) as exc:
        hint = ""
        if cfg.injection.name == "demo":  # the default: a user who changed the devices did not ask for it
            hint = " (the default demo slows rank 2 of 3: add injection=none for a run on fewer devices)"
        fail("injection.faults", str(exc), "see conf/injection/ for examples" + hint)


def validate_monitor(cfg: DictConfig) -> None:
    from synapse.health import HealthConfigError, HealthSettings

    try:
        HealthSettings.from_config(cfg.monitor)
    except HealthConfigError as exc:
        fail("monitor", str(exc), "see MonitorConfig in synapse/config/schema.py")


def validate_failover(cfg: DictConfig) -> None:
    from synapse.calibration import EstimatorConfig, EstimatorConfigError
    from synapse.decision import PolicyConfigError, make_policy
    from synapse.detection import DetectorConfig, DetectorConfigError

    failover = cfg.failover
    positive("failover.max_restarts", failover.max_restarts, allow_zero=True)
    positive("failover.decide_every", failover.decide_every)
    positive("failover.node_timeout_s", failover.node_timeout_s)
    positive("failover.decider_restarts", failover.decider_restarts, allow_zero=True)
    positive("failover.decider_grace_s", failover.decider_grace_s)
    positive("trainer.decider_epoch", cfg.trainer.decider_epoch, allow_zero=True)
    for key, settings, error in (("failover.detector", DetectorConfig, DetectorConfigError),
                                 ("failover.estimator", EstimatorConfig, EstimatorConfigError)):
        try:
            settings(**_plain(failover[key.split(".")[1]]))
        except TypeError as exc:
            valid = ", ".join(f.name for f in dataclasses.fields(settings))
            fail(key, str(exc), f"use only these keys: {valid}")
        except error as exc:
            fail(key, str(exc), f"see {settings.__name__} for the ranges")
    try:
        make_policy(str(cfg.policy.name), **_plain(cfg.policy.params))
    except PolicyConfigError as exc:
        fail("policy", str(exc),
             "choose policy=eta|keep|replan|degrade|rebalance|shrink|ski_rental with its documented params")
    for i, drill in enumerate(failover.drills):
        for key in ("step", "action"):
            if OmegaConf.is_missing(drill, key):
                fail(f"failover.drills[{i}].{key}", "is missing",
                     "write {step: N (>= 1), action: replan|degrade|replace, device: D (optional)}")
        if drill.step < 1:
            fail(f"failover.drills[{i}].step", f"must be >= 1, got {drill.step}",
                  "write {step: N (>= 1), action: replan|degrade|replace, device: D (optional)}")
    if failover.restart_cost_file is not None and not Path(failover.restart_cost_file).is_file():
        fail("failover.restart_cost_file", f"{failover.restart_cost_file!r} is not a file",
              "give the JSON written by experiments/bench_restart_cost.py, or null for the repository's default")
    if cfg.mode != "simulate":  # simulated spares are ids after the simulated devices (validate_simulation)
        _validate_spare_devices(cfg)
    if failover.replica_engine == "torchft":
        _validate_torchft(cfg)


def _validate_torchft(cfg: DictConfig) -> None:
    """failover.replica_engine=torchft: R > 1 replicas cut alike (of one stage or pipelines of K), each on one
    node, under the supervisor, with torchft installed (each replica is a launch of its own under torchft's
    lighthouse)."""
    import importlib.util

    failover, trainer = cfg.failover, cfg.trainer
    positive("failover.replica_respawns", failover.replica_respawns, allow_zero=True)
    positive("failover.replica_heartbeat_timeout_s", failover.replica_heartbeat_timeout_s)
    if importlib.util.find_spec("torchft") is None:
        fail("failover.replica_engine", "torchft is not installed in this environment",
             "pip install torchft (the checkout's extra: pip install -e '.[replicas]'; 0.2.0 is the version tested), "
             "or use failover.replica_engine=restart")
    if not cfg.failover.enabled or cfg.mode != "kd":
        fail("failover.replica_engine", f"torchft carries the replicas of a supervised KD run, not mode={cfg.mode} "
             f"with failover.enabled={cfg.failover.enabled}",
             "use mode=kd with failover.enabled=true, or failover.replica_engine=restart")
    if trainer.replicas == "auto" or not isinstance(trainer.replicas, int) or trainer.replicas < 2:
        fail("failover.replica_engine", f"torchft carries a run of several replicas, but trainer.replicas="
             f"{trainer.replicas}", "give trainer.replicas a count of at least 2, or use failover.replica_engine="
             "restart")
    if cfg.partition.get("replica_stages"):
        fail("failover.replica_engine", f"torchft needs replicas cut alike (one stage per rank of each replica "
             f"group), but partition.replica_stages={list(cfg.partition.replica_stages)}",
             "leave partition.replica_stages unset, or use failover.replica_engine=restart")
    shares = trainer.replica_shares
    if shares is not None and len(set(shares)) > 1:  # a restarted segment's config names the equal ones
        fail("failover.replica_engine", "torchft shares each step's batch equally among the replicas in its quorum, "
             f"so trainer.replica_shares={list(shares)} cannot be kept",
             "leave trainer.replica_shares unset, or use failover.replica_engine=restart")
    if trainer.nodes > 1:
        _validate_torchft_nodes(trainer)


def _validate_torchft_nodes(trainer: DictConfig) -> None:
    """Across nodes each replica is a launch on the node that holds its devices (its stages' pipeline group,
    the agent that respawns it): a layout with a replica on two nodes is refused."""
    per_node = ([len(devices) for devices in trainer.node_devices] if trainer.node_devices
                else [len(resolve_devices(trainer))] * int(trainer.nodes))
    total, replicas = sum(per_node), int(trainer.replicas)
    if total % replicas:
        return  # not a whole number of stages per replica: the layout's own check says so
    stages = total // replicas
    ends = list(itertools.accumulate(per_node))  # the run-wide rank after each node's last
    for replica in range(replicas):
        first, last = replica * stages, (replica + 1) * stages - 1
        nodes = sorted({bisect.bisect_right(ends, first), bisect.bisect_right(ends, last)})
        if len(nodes) > 1:
            fits = " or ".join(str(total // k) for k in range(min(per_node), 0, -1)
                               if all(n % k == 0 for n in per_node))
            fail("failover.replica_engine",
                 f"torchft runs each replica on one node, but trainer.replicas={replicas} over trainer.nodes="
                 f"{trainer.nodes} nodes of {per_node[0]} device(s) makes replicas of {stages} stages, and replica "
                 f"{replica} (run-wide devices {first}-{last}) would lie on nodes {nodes}",
                 f"choose trainer.replicas so that each node's devices are a whole number of replicas ({fits}: "
                 f"trainer.replicas={int(trainer.nodes)} is one pipeline per node), or use "
                 f"failover.replica_engine=restart, whose replicas may span nodes")


def _validate_spare_devices(cfg: DictConfig) -> None:
    """Spares are local ids, like trainer.devices: across nodes the same list on every node (each node's own
    idle devices), so the checks are one node's. A decider on a host of its own checks no GPU here: each
    node's agent checks its host (this check on its own config) and says what it has (``NodeDevices``)."""
    trainer = cfg.trainer
    spares = [int(d) for d in trainer.spare_devices]
    if not spares:
        return
    across = f" (on every node: trainer.nodes={trainer.nodes})" if trainer.nodes > 1 else ""
    if min(spares) < 0:
        fail("trainer.spare_devices", f"negative device id in {spares}", "device ids start at 0")
    if resolve_accelerator(trainer) == "cpu" and max(spares) >= 64:
        fail("trainer.spare_devices", f"CPU slot ids {[d for d in spares if d >= 64]} are out of range (slots are "
              f"0..63)", "number CPU slots from 0")
    devices = resolve_devices(trainer)
    clash = sorted(set(spares) & set(devices))
    if clash or len(set(spares)) != len(spares):
        what = f"{clash} are also in trainer.devices={devices}" if clash else "repeat a device"
        fail("trainer.spare_devices", f"spares {spares} {what}{across}",
             "list each idle device once, none of trainer.devices (across nodes both list each node's local ids: "
             "trainer.devices=[0,1] trainer.spare_devices=[2])")
    if resolve_accelerator(trainer) == "cuda" and trainer.shared_gpu is None and not decides_elsewhere(trainer):
        check_gpu_ids(spares, "trainer.spare_devices")


def schedule_steps(cfg: DictConfig) -> tuple[int, str] | None:
    """The run's length in optimizer steps and how it follows from the config (for messages), or
    None where only reading the data set's files would tell (imagenet100 without trainer.max_steps)."""
    trainer = cfg.trainer
    if trainer.max_steps is not None:
        return int(trainer.max_steps), f"trainer.max_steps={trainer.max_steps}"
    from synapse.data import train_samples

    samples = train_samples(cfg.data)
    if samples is None:
        return None
    per_epoch = samples // cfg.data.batch_size  # the sampler drops the last partial batch
    return trainer.epochs * per_epoch, (f"trainer.epochs={trainer.epochs} x {per_epoch} steps of data.batch_size="
                                        f"{cfg.data.batch_size} over {samples} training samples")


def validate_steps_within_run(cfg: DictConfig) -> None:
    """Injected faults and fire drills at steps the run never reaches were accepted and never fired:
    a test or a drill that silently did nothing. Each must fall inside the schedule."""
    faults, drills = list(cfg.injection.faults), list(cfg.failover.drills) if cfg.mode == "kd" else []
    if cfg.mode == "profile" or not (faults or drills):
        return
    length = schedule_steps(cfg)
    if length is None or length[0] < 1:
        return  # an empty schedule is refused where it is run; imagenet100's length needs its files
    total, why = length
    for i, fault in enumerate(faults):
        key = "start" if fault.get("start") is not None else "step"
        step = fault.get(key)
        if isinstance(step, int) and step > total:
            fail(f"injection.faults[{i}].{key}", f"{step} is beyond the run's last step {total} ({why}): the "
                 f"{fault.get('kind')} fault would never fire",
                 f"choose a step in 1..{total}, or lengthen the run; or run without injected faults "
                 f"(injection=none: a shortened demo run keeps the demo's fault)")
    for i, drill in enumerate(drills):
        if drill.step >= total:
            fail(f"failover.drills[{i}].step", f"{drill.step} is not before the run's last step {total} ({why}): a "
                 f"drill acts after its step, and after the last one nothing is left to run",
                 f"choose a step in 1..{total - 1}, or lengthen the run")


def validate_cache_dir(cfg: DictConfig) -> None:
    """The cache (trained teachers, block profiles) must be writable: found here, not as a raw
    OSError from the first process that writes there after minutes of work."""
    import tempfile

    path = Path(cfg.cache_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".synapse-write-check-"):
            pass
    except OSError as exc:
        fail("cache_dir", f"{path} cannot be written ({exc.strerror or exc}: {exc.filename or path}); trained "
             f"teachers and block profiles are cached there", "point SYNAPSE_CACHE (or cache_dir=...) at a writable "
             "directory")


def validate(cfg: DictConfig) -> None:
    """Check every value that types cannot; raise ConfigError before any work starts."""
    if cfg.mode == "simulate":
        validate_simulation(cfg)
        return
    require_supported_torch()
    validate_known_keys(cfg)
    validate_finite(OmegaConf.to_container(cfg, resolve=False))  # interpolations are strings here: skipped
    _validate_models(cfg)
    _validate_data(cfg.data)
    _validate_kd(cfg.kd)
    _validate_optim(cfg.optim)
    _validate_trainer(cfg.trainer)
    _validate_pipeline(cfg)
    _validate_replicas(cfg)
    _validate_partition(cfg)
    validate_injection(cfg)
    validate_monitor(cfg)
    validate_failover(cfg)
    # after the components' own checks (their messages for a value below its bound stay theirs)
    check_float_ranges(_plain(cfg))
    positive("checkpoint.every", cfg.checkpoint.every, allow_zero=True)
    positive("checkpoint.keep", cfg.checkpoint.keep)
    validate_steps_within_run(cfg)
    validate_cache_dir(cfg)
    validate_block_counts(cfg)
    validate_single_sample_batch_norm(cfg)
    validate_microbatches_fill_the_pipeline(cfg)
    validate_weight_files(cfg)
    validate_resume(cfg)


def _validate_models(cfg: DictConfig) -> None:
    from synapse.models import MODEL_REGISTRY

    for key in ("teacher.name", "student.name"):
        name = OmegaConf.select(cfg, key)
        if name not in MODEL_REGISTRY:
            fail(key, f"unknown model {name!r}", f"choose one of {', '.join(sorted(MODEL_REGISTRY))}")
    for key in ("teacher.checkpoint", "student.init"):
        path = OmegaConf.select(cfg, key)
        if path is not None and not Path(path).is_file():
            fail(key, f"file {path!r} does not exist",
                 "give the path of a local weights file (weights are never downloaded)")
    positive("teacher.auto_train_epochs", cfg.teacher.auto_train_epochs, allow_zero=True)
    positive("teacher.auto_train_lr", cfg.teacher.auto_train_lr)
    if not 0 <= cfg.student.drop_rate < 1:
        fail("student.drop_rate", f"must be in [0, 1), got {cfg.student.drop_rate}", "use e.g. student.drop_rate=0.1")


def _validate_data(data: DictConfig) -> None:
    from synapse.data import check_imagenet100_root

    for key in ("batch_size", "val_batch_size", "image_size"):
        positive(f"data.{key}", data[key])
    if isinstance(data.num_workers, str):
        if data.num_workers != "auto":
            fail("data.num_workers", f"{data.num_workers!r} is neither a count nor 'auto'",
                 "give a number of loader processes (0: load in the training process), or auto to size them "
                 "from the host's cores")
    else:
        positive("data.num_workers", data.num_workers, allow_zero=True)
    if not 0 <= data.gpu_decode_share <= 1:
        fail("data.gpu_decode_share", f"must be in [0, 1], got {data.gpu_decode_share}",
             "use e.g. data.gpu_decode_share=0.5 (half the JPEGs on the GPU, half in the loader workers)")
    if data.name == "imagenet100":
        if data.root is None:
            fail("data.root", "ImageNet100 needs a data root",
                 "set data.root=/path/to/imagenet (holding train/ and val/)")
        check_imagenet100_root(data.root)


def _validate_kd(kd: DictConfig) -> None:
    positive("kd.T", kd.T)
    if not 0.0 <= kd.lambda_kd <= 1.0:
        fail("kd.lambda_kd", f"must be in [0, 1], got {kd.lambda_kd}",
             "kd.lambda_kd=0.9 weighs KD 0.9 and cross-entropy 0.1")


MAX_LR = 1e3


def _validate_optim(optim: DictConfig) -> None:
    positive("optim.lr", optim.lr)
    if optim.lr > MAX_LR:  # torch cannot even cast 1e300 to float32; any lr this large diverges at step 1
        fail("optim.lr", f"{optim.lr} is implausibly large (above {MAX_LR:g})", "use a learning rate such as 2e-3")
    positive("optim.weight_decay", optim.weight_decay, allow_zero=True)
    positive("optim.warmup_steps", optim.warmup_steps, allow_zero=True)
    positive("optim.step_size", optim.step_size)
    if not 0 <= optim.momentum < 1:
        fail("optim.momentum", f"must be in [0, 1), got {optim.momentum}", "use e.g. optim.momentum=0.9")
    if not 0 < optim.gamma <= 1:
        fail("optim.gamma", f"must be in (0, 1] (the factor the LR is multiplied by every optim.step_size steps), got "
              f"{optim.gamma}", "use e.g. optim.gamma=0.1")


ROLES = ("auto", "decider", "agent")  # trainer.role


def _validate_trainer(trainer: DictConfig) -> None:
    _validate_cpu_slot_ids(trainer)
    positive("trainer.nodes", trainer.nodes)
    if not 0 <= trainer.node_rank < trainer.nodes:
        fail("trainer.node_rank", f"must be in 0..{trainer.nodes - 1} for trainer.nodes={trainer.nodes}, got "
              f"{trainer.node_rank}",
             "number the nodes 0..nodes-1 (node 0 hosts the rendezvous), or raise trainer.nodes")
    if trainer.node_devices is not None and (len(trainer.node_devices) != trainer.nodes
                                             or not all(len(d) for d in trainer.node_devices)):
        fail("trainer.node_devices", f"{trainer.node_devices} must list the devices of each of trainer.nodes="
              f"{trainer.nodes} nodes, none empty",
             "leave it unset (null): the supervisor sets it for failover segments")
    if trainer.role not in ROLES:
        fail("trainer.role", f"{trainer.role!r} is not one of {', '.join(ROLES)}",
             "use auto (node 0 keeps the decider), decider (a host of its own keeps it) or agent (a node's "
             "workers only, every node when a decider runs apart)")
    if trainer.role != "auto" and trainer.nodes == 1:
        fail("trainer.role", f"{trainer.role} splits a run across nodes, but trainer.nodes=1",
             "set trainer.nodes to the number of nodes with devices, or leave trainer.role=auto")
    positive("trainer.collective_timeout_s", trainer.collective_timeout_s)
    positive("trainer.rdzv_timeout_s", trainer.rdzv_timeout_s)
    if trainer.nodes == 1 and trainer.rdzv_endpoint and not _is_loopback_endpoint(trainer.rdzv_endpoint):
        fail("trainer.rdzv_endpoint", f"{trainer.rdzv_endpoint}: a one-node run listens on 127.0.0.1 only (its "
              f"rendezvous must not be reachable from other hosts), so workers could not reach this address",
              f"use 127.0.0.1:{trainer.rdzv_endpoint.rpartition(':')[2]} or leave trainer.rdzv_endpoint unset; "
              f"set trainer.nodes for a run across machines")
    if trainer.nodes > 1 and not trainer.rdzv_endpoint:
        fail("trainer.rdzv_endpoint", f"trainer.nodes={trainer.nodes} needs a rendezvous endpoint every node can reach",
              "set trainer.rdzv_endpoint=host:port (the same on every node)")
    positive("trainer.epochs", trainer.epochs, allow_zero=True)
    if trainer.max_steps is not None:
        positive("trainer.max_steps", trainer.max_steps, allow_zero=True)
    if trainer.stop_after is not None:
        positive("trainer.stop_after", trainer.stop_after)
    if trainer.threads is not None:
        positive("trainer.threads", trainer.threads)
    positive("trainer.eval_every_epochs", trainer.eval_every_epochs)
    positive("trainer.log_every", trainer.log_every)
    _check_nonfinite_check(trainer)
    _check_shared_gpu(trainer)
    local = resolve_devices(trainer)
    shown = trainer.local_ranks_filter
    if shown is not None and any(not 0 <= int(r) < len(local) for r in shown):
        fail("trainer.local_ranks_filter", f"{list(shown)} names a local rank outside 0..{len(local) - 1} (this node "
              f"runs {len(local)} worker(s))", "list local ranks in that range, [] for none, or null for all")


def _check_shared_gpu(trainer: DictConfig) -> None:
    if trainer.shared_gpu is None:
        return
    if resolve_accelerator(trainer) != "cuda":
        fail("trainer.shared_gpu", f"{trainer.shared_gpu} names a GPU for every rank, but the run is on the CPU",
              "set trainer.accelerator=cuda on a machine with a GPU, or trainer.shared_gpu=null")
    positive("trainer.shared_gpu", trainer.shared_gpu, allow_zero=True)
    check_gpu_ids([int(trainer.shared_gpu)])


def _is_loopback_endpoint(endpoint: str) -> bool:
    import ipaddress

    host = endpoint.rpartition(":")[0].strip("[]") if ":" in endpoint else endpoint
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_cpu_slot_ids(trainer: DictConfig) -> None:
    """A CPU slot id beyond the ``MAX_CPU_SLOTS`` worker processes Synapse starts at most, named as such."""
    devices = trainer.devices
    if trainer.accelerator != "cuda" and isinstance(devices, ListConfig) and resolve_accelerator(trainer) == "cpu":
        too_high = [d for d in devices if isinstance(d, int) and d >= MAX_CPU_SLOTS]
        if too_high:
            fail("trainer.devices", f"CPU slot ids {too_high} are out of range (slots are 0..{MAX_CPU_SLOTS - 1})",
                  f"number CPU slots from 0, e.g. trainer.devices={len(devices)}")


def _validate_pipeline(cfg: DictConfig) -> None:
    if cfg.pipeline.microbatches == "auto":
        return  # the planner picks a divisor of the batch size
    if isinstance(cfg.pipeline.microbatches, str):
        fail("pipeline.microbatches", f"{cfg.pipeline.microbatches!r} is neither a count nor 'auto'",
             "give an integer that divides data.batch_size, or auto to let the planner choose")
    positive("pipeline.microbatches", cfg.pipeline.microbatches)
    if cfg.data.batch_size % cfg.pipeline.microbatches:
        fail("pipeline.microbatches", f"{cfg.pipeline.microbatches} micro-batches do not divide data.batch_size="
              f"{cfg.data.batch_size}", "choose a divisor of the batch size")


def _validate_replicas(cfg: DictConfig, ranks: int | None = None) -> None:
    """An R x K mesh that matches the run's devices, and a batch every replica can have its share of.
    ``ranks``: the run's worker count when no real device is resolved (mode=simulate)."""
    replicas, trainer = cfg.trainer.replicas, cfg.trainer
    ranks = num_ranks(trainer) if ranks is None else ranks
    shares = trainer.replica_shares
    if replicas == "auto":
        if cfg.partition.mode != "auto":
            fail("trainer.replicas", f"auto is chosen by the planner, but partition.mode={cfg.partition.mode}",
                 "use partition=auto, or give a count (trainer.replicas=2)")
        if shares is not None:
            fail("trainer.replica_shares", "shares need a fixed number of replicas, but trainer.replicas=auto",
                 "give trainer.replicas a count, or leave trainer.replica_shares unset")
        return
    if isinstance(replicas, str) or isinstance(replicas, bool) or not isinstance(replicas, int):
        fail("trainer.replicas", f"{replicas!r} is neither a count nor 'auto'",
             "give a count of replicas (1: one pipeline) or auto with partition=auto")
    positive("trainer.replicas", replicas)
    stages = cfg.partition.replica_stages
    if stages is not None:
        if cfg.partition.mode == "auto":
            fail("partition.replica_stages", "replicas cut differently are given, not planned",
                 "use partition=even or partition=manual with partition.replica_stages, or leave it unset")
        if len(stages) != replicas or min(stages) < 1 or sum(stages) != ranks:
            fail("partition.replica_stages", f"{list(stages)} must give each of {replicas} replicas at least one "
                 f"stage, the run's {ranks} devices in all", f"list {replicas} stage counts summing to {ranks}")
    elif ranks % replicas:
        divisors = [r for r in range(1, ranks + 1) if ranks % r == 0]
        fail("trainer.replicas", f"{replicas} replicas do not divide the run's {ranks} devices into equal pipelines "
              f"(a mesh of replicas x stages)", f"use one of {divisors}, or {replicas * -(-ranks // replicas)} devices")
    if replicas == 1:
        if shares is not None and len(shares) != 1:
            fail("trainer.replica_shares", f"{list(shares)} for one replica", "leave trainer.replica_shares unset")
        return
    if shares is not None and (len(shares) != replicas or min(shares) < 1 or sum(shares) != cfg.data.batch_size):
        fail("trainer.replica_shares", f"{list(shares)} must give each of {replicas} replicas a positive number of "
              f"images, {cfg.data.batch_size} (data.batch_size) in all",
             "leave it unset for equal shares, or list one count per replica")
    if cfg.pipeline.microbatches != "auto":
        from synapse.partitioning import PartitionError, equal_shares

        m = cfg.pipeline.microbatches
        uneven = [n for n in shares or () if n % m]
        if uneven:
            fail("trainer.replica_shares", f"{uneven[0]} images do not split into {m} equal micro-batches",
                 f"give every replica a multiple of {m} images (pipeline.microbatches)")
        try:
            equal_shares(cfg.data.batch_size, replicas, m)
        except PartitionError as exc:
            fail("data.batch_size", f"{exc} (trainer.replicas={replicas})",
                 f"use a batch of at least {replicas * m} images, fewer replicas or fewer micro-batches")


def _validate_partition(cfg: DictConfig, ranks: int | None = None) -> None:
    """``ranks``: the run's worker count when no real device is resolved (mode=simulate)."""
    part = cfg.partition
    ranks = num_ranks(cfg.trainer) if ranks is None else ranks
    replicas = fixed_replicas(cfg.trainer)
    k = ranks // replicas if replicas else ranks
    positive("partition.profile_warmup", part.profile_warmup, allow_zero=True)
    positive("partition.profile_repeats", part.profile_repeats)
    if part.node_link_bandwidth_gbps is not None:
        positive("partition.node_link_bandwidth_gbps", part.node_link_bandwidth_gbps)
    if part.link_bandwidth_gbps is not None:
        positive("partition.link_bandwidth_gbps", part.link_bandwidth_gbps)
    if part.alphas is not None:
        if len(part.alphas) != ranks:
            fail("partition.alphas", f"{len(part.alphas)} speeds given for {ranks} devices",
                 f"give exactly {ranks} values")
        if min(part.alphas) <= 0:
            fail("partition.alphas", f"slowdowns must be > 0, got {list(part.alphas)}", "use 1.0 for a nominal device")
    if part.mode != "manual":
        return
    for key in ("teacher", "student"):
        counts = part[key]
        if counts is None:
            fail(f"partition.{key}", "partition.mode=manual needs blocks per stage",
                  f"set partition.{key}=[n_0,...,n_{k - 1}] or use partition=even")
        if part.replica_stages:
            k = ranks  # every replica's stages, replica after replica
        if len(counts) != k:
            per = "" if fixed_replicas(cfg.trainer) == 1 or part.replica_stages else \
                f" per replica ({cfg.trainer.replicas} replicas)"
            fail(f"partition.{key}", f"{len(counts)} stages given for {k} devices{per}",
                 f"give exactly {k} block counts")
        if min(counts) < 1:
            fail(f"partition.{key}", f"every stage needs at least one block, got {list(counts)}",
                 "make each count >= 1")


def validate_microbatches_fill_the_pipeline(cfg: DictConfig) -> None:
    """torch's 1F1B schedule refuses fewer micro-batches than stages, in every worker once they have started
    ("Number of microbatches (2) must be >= the number of stages (3)"): said here instead, before any work.
    After the checks of blocks per stage and of one-sample micro-batches, whose fixes come first. Not for
    trainer.replicas=auto (the planner chooses K with the micro-batches), a node other than node 0 (its
    layout is the decider's), or mode=simulate (a what-if prices the schedule as given: no worker runs it)."""
    m = cfg.pipeline.microbatches
    if cfg.mode != "kd" or m == "auto" or str(cfg.pipeline.schedule) != "1f1b" or int(cfg.trainer.node_rank) != 0:
        return
    stages = replica_stage_counts(cfg)
    if stages is None or m >= max(stages):
        return
    k = max(stages)
    fail("pipeline.microbatches", f"{m} micro-batches for pipelines of {k} stages: the 1F1B schedule needs at "
         "least one micro-batch per stage", f"use pipeline.microbatches={k} or more (a divisor of "
         f"data.batch_size={cfg.data.batch_size}), pipeline.microbatches=auto, or pipeline.schedule=gpipe")


def _check_nonfinite_check(trainer: DictConfig) -> None:
    if trainer.nonfinite_check != "late":
        return
    if trainer.nonfinite == "skip":
        fail("trainer.nonfinite_check", "late cannot skip a step: trainer.nonfinite=skip must see the loss before the "
             "update", "use trainer.nonfinite_check=auto (or at_step) with skip, or trainer.nonfinite=stop")


# ---------------------------------------------------------------- mode=simulate
SIMULATED_DEVICES_LIMIT = 100_000  # far beyond any study; a typo of a million devices is refused, not simulated


def simulated_devices(trainer: DictConfig) -> int:
    """mode=simulate: trainer.devices is a count of simulated devices per node (no real device is
    looked up, so 256 GPUs simulate on a laptop); a list counts its ids."""
    devices = trainer.devices
    if isinstance(devices, (list, tuple, ListConfig)):
        ids = [int(d) for d in devices]
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
            fail("trainer.devices", f"{ids} must be distinct ids >= 0, at least one",
                 "give a count of simulated devices, e.g. trainer.devices=64")
        count = len(ids)
    elif isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        fail("trainer.devices", f"{devices!r} is not a count of simulated devices",
             "give a positive count, e.g. trainer.devices=64 (mode=simulate needs no real device)")
    else:
        count = devices
    total = count * int(trainer.nodes)
    if total > SIMULATED_DEVICES_LIMIT:
        fail("trainer.devices", f"{total} simulated devices (trainer.devices x trainer.nodes) is over the limit "
             f"{SIMULATED_DEVICES_LIMIT}", "simulate fewer devices")
    return total


def validate_simulation(cfg: DictConfig) -> None:
    """mode=simulate: the checks of a real run that need no real device, with trainer.devices a
    count of simulated ones, and the simulate group's own (rates, files)."""
    validate_known_keys(cfg)
    validate_finite(OmegaConf.to_container(cfg, resolve=False))
    _validate_models(cfg)
    _validate_data(cfg.data)
    _validate_kd(cfg.kd)
    _validate_optim(cfg.optim)
    positive("trainer.nodes", cfg.trainer.nodes)
    ranks = simulated_devices(cfg.trainer)
    positive("trainer.epochs", cfg.trainer.epochs, allow_zero=True)
    if cfg.trainer.max_steps is not None:
        positive("trainer.max_steps", cfg.trainer.max_steps)
    _validate_simulated_cpu_slots(cfg.trainer)
    _validate_pipeline(cfg)
    _validate_replicas(cfg, ranks)
    _validate_partition(cfg, ranks)
    validate_injection(cfg, ranks)
    validate_failover(cfg)
    spares = [int(d) for d in cfg.trainer.spare_devices]
    if spares and (min(spares) < ranks or len(set(spares)) != len(spares)):
        fail("trainer.spare_devices", f"{spares} must be distinct ids after the {ranks} simulated devices "
             f"(0..{ranks - 1})", f"number simulated spares from {ranks}, e.g. trainer.spare_devices=[{ranks}]")
    _validate_simulate_group(cfg.simulate, str(cfg.trainer.accelerator))
    check_float_ranges(_plain(cfg))
    positive("checkpoint.every", cfg.checkpoint.every, allow_zero=True)
    validate_steps_within_run(cfg)
    validate_cache_dir(cfg)


def _validate_simulated_cpu_slots(trainer: DictConfig) -> None:
    """mode=simulate without trainer.accelerator=cuda prices this machine's CPU worker processes as a real run
    would start them, at most ``MAX_CPU_SLOTS`` a node: a larger count is refused here, naming the GPU form,
    rather than deep in the planner as a real run's "CPU slots requested"."""
    if str(trainer.accelerator) == "cuda":
        return
    devices = trainer.devices
    ids = [int(d) for d in devices] if isinstance(devices, (list, tuple, ListConfig)) else list(range(int(devices)))
    if max(ids) >= MAX_CPU_SLOTS:
        fail("trainer.devices", f"mode=simulate with trainer.accelerator={trainer.accelerator} simulates this "
             f"machine's CPU worker processes, at most {MAX_CPU_SLOTS} a node (slot ids 0..{MAX_CPU_SLOTS - 1}); "
             f"{len(ids)} a node asked", "simulate GPUs with trainer.accelerator=cuda (docs/simulate.md: the H200 "
             "profiles), or spread the CPU ranks over nodes with trainer.nodes")


def _validate_simulate_group(sim: DictConfig, accelerator: str) -> None:
    for key in ("fail_slow_mtbf_h", "comm_fail_slow_mtbf_h", "fail_stop_mtbf_h", "node_loss_mtbf_h"):
        value = sim[key]
        if value is not None and not value > 0:
            fail(f"simulate.{key}", f"a mean time between events must be > 0 hours, got {value}",
                 f"give hours (e.g. simulate.{key}=1000), or null for no such events")
    for key in ("fail_slow_duration_s", "comm_fail_slow_duration_s", "gpu_memory_gb"):
        if not sim[key] > 0:
            fail(f"simulate.{key}", f"must be > 0, got {sim[key]}", "give a positive number")
    positive("simulate.gpus_per_node", sim.gpus_per_node)
    if not sim.failure_detect_s >= 0:
        fail("simulate.failure_detect_s", f"must be >= 0 seconds, got {sim.failure_detect_s}", "give seconds, e.g. 5")
    for key in ("fail_slow_factor", "comm_fail_slow_factor"):
        if not sim[key] > 1:
            fail(f"simulate.{key}", f"a slowdown factor must be > 1, got {sim[key]}", "e.g. 2.0 (half speed)")
    for key in ("teacher_profile", "student_profile", "trace"):
        if sim[key] is not None and not Path(sim[key]).is_file():
            fail(f"simulate.{key}", f"{sim[key]!r} is not a file", "give the path of an existing file, or null")
    if (sim.teacher_profile is None) != (sim.student_profile is None):
        fail("simulate.teacher_profile", "give both simulate.teacher_profile and simulate.student_profile, or neither",
             "set the other one too (null for both: the cached profiles of teacher.name and student.name)")
    if sim.teacher_profile is None and accelerator == "cuda":
        fail("simulate.teacher_profile", "simulated GPUs need GPU block profiles (this machine cannot measure them)",
             "set simulate.teacher_profile and simulate.student_profile to CSVs of experiments/profile_models.py, "
             "e.g. experiments/results/profiles_h200/profiles/")
    if sim.step_noise not in ("auto", "none") and not Path(sim.step_noise).is_file():
        fail("simulate.step_noise", f"{sim.step_noise!r} is neither auto, none nor a file",
             f"use auto, none, or the path of a fault-free run's {PERFORMANCE.shown}")
