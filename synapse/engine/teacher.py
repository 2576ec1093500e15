"""A teacher ready for distillation: loaded from a local file, or trained once and cached.

The default run on the embedded data has no teacher checkpoint, so it trains one with labels
first, stores it under ``<cache_dir>/teachers/<key>.pt`` (the key hashes everything that
determines the weights) and reuses it on later runs. It says which of the two it did.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from torch import nn

from synapse.config import (
    ConfigError,
    DataConfig,
    SynapseConfig,
    TeacherConfig,
    config_dict,
    decides_elsewhere,
    resolve_accelerator,
    resolve_devices,
    with_settings,
)
from synapse.data import data_kwargs, dataset_info
from synapse.engine.device import ComputeSetup
from synapse.engine.trainer import build_trainer, load_teacher
from synapse.rundir import MODEL, TEACHER_TRAINING, cache_full_error, is_disk_full


def teacher_cache_key(cfg: SynapseConfig) -> str:
    data = config_dict(cfg.data)
    data.pop("num_workers", None)
    recipe = {"model": cfg.teacher.name, "data": data,
              "epochs": cfg.teacher.auto_train_epochs, "lr": cfg.teacher.auto_train_lr, "seed": cfg.seed, "v": 1}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def teacher_training_config(cfg: SynapseConfig) -> SynapseConfig:
    """The config of the label-trained teacher: same data and devices, its own epochs and learning rate."""
    first_device = resolve_devices(cfg.trainer)[0]
    return with_settings(cfg, {
        "mode": "teacher", "resume": None, "trainer.epochs": cfg.teacher.auto_train_epochs, "trainer.max_steps": None,
        "trainer.stop_after": None, "trainer.nodes": 1, "trainer.node_rank": 0, "trainer.node_devices": None,
        "trainer.devices": [first_device] if resolve_accelerator(cfg.trainer) == "cuda" else 1,
        "optim.lr": cfg.teacher.auto_train_lr, "optim.warmup_steps": 0, "pipeline.microbatches": 1,
        # the run's faults are aimed at the distillation, not at this
        "injection.name": "none", "injection.faults": []})


def prepare_teacher(cfg: SynapseConfig, run_dir: Path, setup: ComputeSetup,
                    log: Callable[[str], None] = print) -> nn.Module:
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    return load_teacher(cfg.teacher, setup, info, str(teacher_weights(cfg, run_dir, log)))


def teacher_weights(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None] = print) -> Path:
    """The local file holding the teacher's weights: the configured one, or a cached label-trained one."""
    if cfg.teacher.checkpoint:
        log(f"teacher: {cfg.teacher.name} from {cfg.teacher.checkpoint}")
        return Path(cfg.teacher.checkpoint)
    if not cfg.teacher.auto_train:
        raise ConfigError("teacher.checkpoint: no teacher weights given and teacher.auto_train=false. Fix: set "
                          "teacher.checkpoint=/path/to/teacher.pt, or teacher.auto_train=true to train one first")
    cached = Path(cfg.cache_dir) / "teachers" / f"{cfg.teacher.name}-{teacher_cache_key(cfg)}.pt"
    if cached.is_file():
        check_cached_teacher(cfg.teacher, cfg.data, cfg.seed, cached)
        log(f"teacher: reusing the cached {cfg.teacher.name} trained on {cfg.data.name} ({cached})")
    elif decides_elsewhere(cfg.trainer):  # its host has none of the run's devices to train one on
        raise ConfigError(
            f"teacher.checkpoint: no teacher weights given and none cached ({cached}), and trainer.role=decider "
            f"trains no teacher on its own host, which has none of the run's devices. Fix: train it where the "
            f"devices are first (python train.py mode=teacher teacher={cfg.teacher.name} data={cfg.data.name} "
            f"on a node, then teacher.checkpoint=<its run dir>/{MODEL.shown}), or set teacher.checkpoint")
    else:
        log(f"teacher: no teacher.checkpoint given; training {cfg.teacher.name} on {cfg.data.name} with labels "
            f"for {cfg.teacher.auto_train_epochs} epochs first (cached at {cached})")
        weights = train_label_model(teacher_training_config(cfg), TEACHER_TRAINING.path(run_dir), cfg.teacher.name,
                                    lambda line: log(f"teacher {cfg.teacher.name} (training on labels): {line}"))
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp-{os.getpid()}")
        try:
            shutil.copyfile(weights, tmp)
            os.replace(tmp, cached)  # atomic: a concurrent run never reads half a file
        except OSError as exc:
            tmp.unlink(missing_ok=True)  # a full cache disk must not keep a partial (or 0-byte) copy
            if is_disk_full(exc):  # the cache's disk, named as such (not the run directory's)
                raise cache_full_error(Path(cfg.cache_dir), f"caching the trained teacher as {cached}") from exc
            raise
    return cached


def check_cached_teacher(teacher: TeacherConfig, data: DataConfig, seed: int, cached: Path) -> None:
    """A cache entry cut short (a full disk, a copy interrupted) is named as one, not blamed on
    teacher.checkpoint, which the user never set."""
    from synapse.models import ModelError, check_weights_file

    info = dataset_info(data.name, **data_kwargs(data, seed))
    try:
        check_weights_file(teacher.name, cached, info.num_classes, info.in_chans, info.image_size,
                           what="cached teacher")
    except ModelError as exc:
        raise ModelError(f"the cached teacher {cached} (trained earlier because teacher.checkpoint is unset) is "
                         f"unusable: {exc}. Fix: delete that cache entry (rm {cached}) and rerun: the teacher is "
                         f"trained again and cached anew") from exc


def train_label_model(cfg: SynapseConfig, run_dir: Path, model_name: str, log: Callable[[str], None] = print,
                      init: str | None = None) -> Path:
    """Train ``model_name`` with cross-entropy; write its weights to ``run_dir/model.pt`` and return that path."""
    import torch

    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(cfg, run_dir, model_name, teacher=None, init_weights=init, log=log)
    trainer.fit()
    out = MODEL.path(run_dir)
    tmp = MODEL.temp_path(out)
    torch.save({k: v.detach().cpu() for k, v in trainer.runner.student.state_dict().items()}, tmp)
    os.replace(tmp, out)
    return out
