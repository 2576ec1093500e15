"""Checks of a config against the models, data and files it names: block counts per stage,
micro-batches BatchNorm cannot train on, weight files and the checkpoint to resume from.

Apart from the range checks of `synapse.config.validation` because these build the models on
the meta device (shapes only: no memory, no compute) or open files: the one part of validation
that needs torch, the model registry and the checkpoint format. Each still fails before any
worker starts, naming the key and a fix.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from synapse.config.devices import num_stages, uses_pipeline
from synapse.config.errors import fail


def validate_block_counts(cfg: DictConfig) -> None:
    """Pipeline runs: at most one stage per block, and manual counts that sum to the models' blocks.

    The models are built on the meta device to count their blocks: no memory, a few ms even for ViT-L.
    """
    if cfg.mode != "kd" or not uses_pipeline(cfg.trainer):
        return
    from synapse.data import dataset_info
    from synapse.data import data_kwargs
    from synapse.models import count_blocks
    from synapse.planner.placement import even_counts

    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    k = num_stages(cfg.trainer)
    for role in ("teacher", "student"):
        name = cfg[role].name
        blocks = count_blocks(name, info.num_classes, info.in_chans, info.image_size)
        if k > blocks:
            fail("trainer.devices", f"{k} pipeline stages but the {role} {name} has only {blocks} blocks "
                  f"(every stage holds at least one)", f"use at most {blocks} devices, or a deeper {role}")
        counts = cfg.partition[role]
        if cfg.partition.mode == "manual" and sum(counts) != blocks:
            fail(f"partition.{role}", f"{list(counts)} covers {sum(counts)} blocks but the {role} {name} has "
                  f"{blocks}", f"make the counts sum to {blocks}, e.g. partition.{role}={list(even_counts(blocks, k))}")


def validate_single_sample_batch_norm(cfg: DictConfig) -> None:
    """A micro-batch of one sample cannot train a model whose BatchNorm sees one value per channel
    (after global pooling): torch refuses it mid-profile or mid-step. Found here by one forward on
    the meta device (shapes only: no memory, no compute)."""
    if cfg.pipeline.microbatches == "auto":
        return  # the planner only considers micro-batches of two samples or more
    micro = cfg.data.batch_size // (cfg.pipeline.microbatches if uses_pipeline(cfg.trainer) else 1)
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
                         if uses_pipeline(cfg.trainer) else f"data.batch_size={cfg.data.batch_size}")
                fail("data.batch_size", f"{where} gives micro-batches of one sample, but the {role} "
                     f"{cfg[role].name} has BatchNorm layers that see one value per channel then ({exc})",
                     "use at least 2 samples per micro-batch (a larger data.batch_size or fewer micro-batches)")


def validate_weight_files(cfg: DictConfig) -> None:
    """teacher.checkpoint and student.init must fit the configured models and data (names and shapes),
    checked here so that a wrong file fails once, not in every pipeline worker."""
    from synapse.data import dataset_info
    from synapse.data import data_kwargs
    from synapse.models.factory import check_weights_file

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
    from synapse.data import dataset_info
    from synapse.data import data_kwargs
    from synapse.models import build_model

    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    with torch.device("meta"):
        student = build_model(cfg.student.name, info.num_classes, info.in_chans, info.image_size)
    shapes = {key: tuple(t.shape) for key, t in student.state_dict().items()}
    if cfg.resume == "auto":
        ckpt.check_run_checkpoints(Path(cfg.run_dir) / "checkpoints", cfg.student.name, shapes)
    else:
        ckpt.check_resumable(Path(cfg.resume), cfg.student.name, shapes)
