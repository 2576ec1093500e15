"""The single-device KD run: the reference every pipelined run must reproduce bit for bit.

Not a user's run path: ``python train.py`` distils through the supervised pipeline runtime, K = 1
included (``synapse.app``). This is the shared loop (``Trainer``) with a ``SingleDeviceRunner``,
which accumulates gradients over the same M micro-batches the pipeline runs; the exactness tests
compare the pipeline's weights with what it learns, and the loop's own tests (resume, records)
run it in one process.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from synapse.config import typed_config, validate
from synapse.engine.accuracy import evaluate
from synapse.engine.batches import loader_workers, with_host_data_path
from synapse.engine.device import build_compute_setup
from synapse.engine.teacher import prepare_teacher
from synapse.engine.trainer import build_trainer, resolve_resume
from synapse.rundir import RUN_SUMMARY


def distil_on_one_device(composed: DictConfig, run_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Distil the ``composed`` config's student on its first device in this process (validated and
    typed here, as the root does); ``summary.json`` in ``run_dir``."""
    validate(composed)
    cfg = typed_config(composed)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    setup = build_compute_setup(cfg.trainer)
    cfg, _ = with_host_data_path(cfg, setup.device, local_ranks=1, local_readers=1)
    teacher = prepare_teacher(cfg, run_dir, setup, log)
    trainer = build_trainer(cfg, run_dir, cfg.student.name, teacher, cfg.student.init, log)
    teacher_eval = evaluate(teacher, trainer.val_ds, setup, cfg.data.val_batch_size, loader_workers(cfg.data))
    resume = resolve_resume(cfg.resume, run_dir, log)
    if resume is not None:
        trainer.load_checkpoint(resume)
    summary = trainer.fit()
    summary["teacher_eval"] = teacher_eval
    RUN_SUMMARY.path(run_dir).write_text(json.dumps(summary, indent=1))
    return summary
