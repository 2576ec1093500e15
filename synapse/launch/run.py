"""What ``python train.py`` does, by mode: distil (kd), or train a teacher/baseline with labels."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from ..config import validate
from ..data import dataset_info
from ..engine.device import build_compute_setup
from ..engine.evaluate import evaluate
from ..engine.teacher import prepare_teacher, train_label_model
from ..engine.trainer import build_trainer, data_kwargs, resolve_resume


def run(cfg: DictConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    validate(cfg)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.mode in ("teacher", "baseline"):
        name = cfg.teacher.name if cfg.mode == "teacher" else cfg.student.name
        init = cfg.student.init if cfg.mode == "baseline" else None
        path = train_label_model(cfg, run_dir, name, log, init=init)
        log(f"{cfg.mode}: weights of {name} written to {path}")
        return json.loads((run_dir / "summary.json").read_text())
    return run_kd(cfg, run_dir, log)


def run_kd(cfg: DictConfig, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    setup = build_compute_setup(cfg.trainer)
    teacher = prepare_teacher(cfg, run_dir, setup, log)
    trainer = build_trainer(cfg, run_dir, cfg.student.name, teacher, cfg.student.init, log)
    teacher_eval = evaluate(teacher, trainer.val_ds, setup, cfg.data.val_batch_size, cfg.data.num_workers)
    log(f"teacher {cfg.teacher.name}: val top-1 {teacher_eval['top1']:.2f}%")
    resume = resolve_resume(cfg, run_dir, log)
    if resume is not None:
        trainer.load_checkpoint(resume)
    summary = trainer.fit()
    summary["teacher_eval"] = teacher_eval
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    final = summary["final_eval"]
    if final:
        log(f"distilled student {cfg.student.name}: val top-1 {final['student_top1']:.2f}% "
            f"(teacher {teacher_eval['top1']:.2f}%), {summary['images_per_s']:.0f} images/s; outputs in {run_dir}")
    return summary
