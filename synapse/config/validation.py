"""``validate``: check what types cannot express, before any work starts.

A temperature <= 0, a model name we do not know, a GPU id that does not exist: each raises
``ConfigError`` naming the offending key and a fix. Here: the order of the checks and the range
checks of the models, data, KD, optimizer, trainer, pipeline and partition groups; the whole
tree's keys and numbers in `schema_checks`, the fault-tolerance groups in `failover_checks`,
checks against the models and files in `model_checks`.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from synapse.trackers import TRACKERS
from synapse.config.devices import num_stages, resolve_accelerator, resolve_devices
from synapse.config.errors import choice, fail, positive
from synapse.config.failover_checks import validate_failover, validate_injection, validate_monitor
from synapse.config.model_checks import (validate_block_counts, validate_resume, validate_single_sample_batch_norm,
                           validate_weight_files)
from synapse.config.schema import (ACCELERATORS, MODES, NONFINITE_CHECKS, NONFINITE_POLICIES, OPTIMIZERS, PARTITION_MODES,
                     PIPELINE_SCHEDULES, PRECISIONS, SCHEDULES, STRATEGIES, TIMING_READS)
from synapse.config.schema_checks import validate_finite, validate_known_keys
from synapse.config.torch_version import require_supported_torch


def validate(cfg: DictConfig) -> None:
    """Check every value that types cannot; raise ConfigError before any work starts."""
    require_supported_torch()
    validate_known_keys(cfg)
    validate_finite(OmegaConf.to_container(cfg, resolve=False))  # interpolations are strings here: skipped
    choice("mode", cfg.mode, MODES)
    _validate_models(cfg)
    _validate_data(cfg.data)
    _validate_kd(cfg.kd)
    _validate_optim(cfg.optim)
    _validate_trainer(cfg.trainer)
    _validate_pipeline(cfg)
    _validate_partition(cfg)
    validate_injection(cfg)
    validate_monitor(cfg)
    validate_failover(cfg)
    positive("checkpoint.every", cfg.checkpoint.every, allow_zero=True)
    positive("checkpoint.keep", cfg.checkpoint.keep)
    choice("logger.name", cfg.logger.name, TRACKERS)
    validate_block_counts(cfg)
    validate_single_sample_batch_norm(cfg)
    validate_weight_files(cfg)
    validate_resume(cfg)


def _validate_models(cfg: DictConfig) -> None:
    from synapse.models.factory import MODEL_REGISTRY

    for key in ("teacher.name", "student.name"):
        name = OmegaConf.select(cfg, key)
        if name not in MODEL_REGISTRY:
            fail(key, f"unknown model {name!r}", f"choose one of {', '.join(sorted(MODEL_REGISTRY))}")
    for key in ("teacher.checkpoint", "student.init"):
        path = OmegaConf.select(cfg, key)
        if path is not None and not Path(path).is_file():
            fail(key, f"file {path!r} does not exist", "give the path of a local weights file (weights are never downloaded)")
    positive("teacher.auto_train_epochs", cfg.teacher.auto_train_epochs, allow_zero=True)
    positive("teacher.auto_train_lr", cfg.teacher.auto_train_lr)
    if not 0 <= cfg.student.drop_rate < 1:
        fail("student.drop_rate", f"must be in [0, 1), got {cfg.student.drop_rate}", "use e.g. student.drop_rate=0.1")


def _validate_data(data: DictConfig) -> None:
    from synapse.data import check_imagenet100_root, dataset_names

    choice("data.name", data.name, tuple(dataset_names()))
    for key in ("batch_size", "val_batch_size", "image_size"):
        positive(f"data.{key}", data[key])
    positive("data.num_workers", data.num_workers, allow_zero=True)
    choice("data.decode", data.decode, ("cpu", "gpu", "auto"))
    if not 0 <= data.gpu_decode_share <= 1:
        fail("data.gpu_decode_share", f"must be in [0, 1], got {data.gpu_decode_share}",
             "use e.g. data.gpu_decode_share=0.5 (half the JPEGs on the GPU, half in the loader workers)")
    if data.name == "imagenet100":
        if data.root is None:
            fail("data.root", "ImageNet100 needs a data root", "set data.root=/path/to/imagenet (holding train/ and val/)")
        check_imagenet100_root(data.root)


def _validate_kd(kd: DictConfig) -> None:
    from synapse.kd import KD_MODES

    choice("kd.mode", kd.mode, KD_MODES)
    positive("kd.T", kd.T)
    if not 0.0 <= kd.lambda_kd <= 1.0:
        fail("kd.lambda_kd", f"must be in [0, 1], got {kd.lambda_kd}", "kd.lambda_kd=0.9 weighs KD 0.9 and cross-entropy 0.1")


MAX_LR = 1e3


def _validate_optim(optim: DictConfig) -> None:
    choice("optim.name", optim.name, OPTIMIZERS)
    choice("optim.schedule", optim.schedule, SCHEDULES)
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


def _validate_trainer(trainer: DictConfig) -> None:
    choice("trainer.accelerator", trainer.accelerator, ACCELERATORS)
    _validate_cpu_slot_ids(trainer)
    choice("trainer.precision", trainer.precision, PRECISIONS)
    choice("trainer.strategy", trainer.strategy, STRATEGIES)
    positive("trainer.nodes", trainer.nodes)
    if not 0 <= trainer.node_rank < trainer.nodes:
        fail("trainer.node_rank", f"must be in 0..{trainer.nodes - 1} for trainer.nodes={trainer.nodes}, got "
              f"{trainer.node_rank}", "number the nodes 0..nodes-1 (node 0 hosts the rendezvous), or raise trainer.nodes")
    if trainer.node_devices is not None and (len(trainer.node_devices) != trainer.nodes
                                             or not all(len(d) for d in trainer.node_devices)):
        fail("trainer.node_devices", f"{trainer.node_devices} must list the devices of each of trainer.nodes="
              f"{trainer.nodes} nodes, none empty", "leave it unset (null): the supervisor sets it for failover stages")
    positive("trainer.collective_timeout_s", trainer.collective_timeout_s)
    positive("trainer.rdzv_timeout_s", trainer.rdzv_timeout_s)
    if trainer.strategy == "single" and num_stages(trainer) > 1:
        fail("trainer.strategy", f"single runs on one device but {num_stages(trainer)} are configured",
              "use trainer.strategy=auto (pipeline over all devices) or trainer.devices=1")
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
    choice("trainer.nonfinite", trainer.nonfinite, NONFINITE_POLICIES)
    _check_nonfinite_check(trainer)
    local = resolve_devices(trainer)
    shown = trainer.local_ranks_filter
    if shown is not None and any(not 0 <= int(r) < len(local) for r in shown):
        fail("trainer.local_ranks_filter", f"{list(shown)} names a local rank outside 0..{len(local) - 1} (this node "
              f"runs {len(local)} worker(s))", "list local ranks in that range, [] for none, or null for all")


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
    """A CPU slot id beyond the 64 worker processes Synapse starts at most, named as such."""
    devices = trainer.devices
    if trainer.accelerator != "cuda" and isinstance(devices, ListConfig) and resolve_accelerator(trainer) == "cpu":
        too_high = [d for d in devices if isinstance(d, int) and d >= 64]
        if too_high:
            fail("trainer.devices", f"CPU slot ids {too_high} are out of range (slots are 0..63)",
                  f"number CPU slots from 0, e.g. trainer.devices={len(devices)}")


def _validate_pipeline(cfg: DictConfig) -> None:
    choice("pipeline.schedule", cfg.pipeline.schedule, PIPELINE_SCHEDULES)
    choice("pipeline.timing_read", cfg.pipeline.timing_read, TIMING_READS)
    if cfg.pipeline.microbatches == "auto":
        return  # the planner picks a divisor of the batch size
    if isinstance(cfg.pipeline.microbatches, str):
        fail("pipeline.microbatches", f"{cfg.pipeline.microbatches!r} is neither a count nor 'auto'",
             "give an integer that divides data.batch_size, or auto to let the planner choose")
    positive("pipeline.microbatches", cfg.pipeline.microbatches)
    if cfg.data.batch_size % cfg.pipeline.microbatches:
        fail("pipeline.microbatches", f"{cfg.pipeline.microbatches} micro-batches do not divide data.batch_size="
              f"{cfg.data.batch_size}", "choose a divisor of the batch size")


def _validate_partition(cfg: DictConfig) -> None:
    part = cfg.partition
    choice("partition.mode", part.mode, PARTITION_MODES)
    k = num_stages(cfg.trainer)
    positive("partition.profile_warmup", part.profile_warmup, allow_zero=True)
    positive("partition.profile_repeats", part.profile_repeats)
    if part.node_link_bandwidth_gbps is not None:
        positive("partition.node_link_bandwidth_gbps", part.node_link_bandwidth_gbps)
    if part.link_bandwidth_gbps is not None:
        positive("partition.link_bandwidth_gbps", part.link_bandwidth_gbps)
    if part.alphas is not None:
        if len(part.alphas) != k:
            fail("partition.alphas", f"{len(part.alphas)} speeds given for {k} devices", f"give exactly {k} values")
        if min(part.alphas) <= 0:
            fail("partition.alphas", f"slowdowns must be > 0, got {list(part.alphas)}", "use 1.0 for a nominal device")
    if part.mode != "manual":
        return
    for key in ("teacher", "student"):
        counts = part[key]
        if counts is None:
            fail(f"partition.{key}", "partition.mode=manual needs blocks per stage",
                  f"set partition.{key}=[n_0,...,n_{k - 1}] or use partition=even")
        if len(counts) != k:
            fail(f"partition.{key}", f"{len(counts)} stages given for {k} devices", f"give exactly {k} block counts")
        if min(counts) < 1:
            fail(f"partition.{key}", f"every stage needs at least one block, got {list(counts)}", "make each count >= 1")


def _check_nonfinite_check(trainer) -> None:
    choice("trainer.nonfinite_check", trainer.nonfinite_check, NONFINITE_CHECKS)
    if trainer.nonfinite_check != "late":
        return
    if trainer.nonfinite == "skip":
        fail("trainer.nonfinite_check", "late cannot skip a step: trainer.nonfinite=skip must see the loss before the "
             "update", "use trainer.nonfinite_check=auto (or at_step) with skip, or trainer.nonfinite=stop")
