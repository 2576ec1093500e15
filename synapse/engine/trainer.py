"""The single-device trainer (K = 1): the fast path, and the reference for the pipeline.

``build_trainer`` creates every resource from the config (validate early, create late);
``Trainer.fit`` runs the loop: resumable batches, one ``SingleDeviceStep`` per batch, metrics
per step, evaluation per epoch, atomic checkpoints, and a final summary.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig
from torch import nn

from .. import checkpoint as ckpt
from ..data import ResumableSampler, build_datasets, data_kwargs, dataset_info
from ..kd import KDLossParams
from ..models import build_model, load_weights
from ..monitor.events import EventLog, events_path
from ..monitor.injection import FaultInjector, parse_faults
from .batches import train_batches
from .device import ComputeSetup, build_compute_setup, rng_state, seed_everything, set_rng_state
from .evaluate import evaluate
from ..records import JsonlWriter, NullWriter
from .optim import build_optimizer, build_scheduler, load_optimizer_state_by_name, optimizer_state_by_name
from .progress import Progress
from .step import NonFiniteLossError, SingleDeviceStep


@dataclass
class Trainer:
    """Everything one single-device training run needs, built by ``build_trainer``."""

    cfg: DictConfig
    run_dir: Path
    setup: ComputeSetup
    student: nn.Module
    teacher: nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_ds: Any
    val_ds: Any
    sampler: ResumableSampler
    total_steps: int
    num_epochs: int
    step_fn: SingleDeviceStep
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    log: Callable[[str], None] = print
    injector: FaultInjector = field(default_factory=lambda: FaultInjector([], 0))
    stop_requested: bool = False  # the supervisor asked every rank to stop after this step
    events: EventLog | None = None  # failover_events.jsonl (non-finite losses; the pipeline: more)

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, epoch: int, step_in_epoch: int) -> Path:
        tmp = ckpt.begin_checkpoint(self.checkpoint_root, self.step)
        ckpt.remove_stray_temporaries(self.checkpoint_root, keep=tmp)  # a failed save's space, first
        named = dict(self.student.named_parameters())
        ckpt.save_tensor_file({"model": self.student.state_dict(),
                               "optim": optimizer_state_by_name(self.optimizer, named)}, tmp / ckpt.shard_name(0))
        state = {"step": self.step, "sampler": self.sampler.state_after(epoch, step_in_epoch),
                 "scheduler": self.scheduler.state_dict(), "rng": rng_state()}
        ckpt.save_tensor_file(state, tmp / ckpt.STATE_FILE)
        self.injector.on("checkpoint_write", self.step)  # files written, not yet committed
        path = ckpt.commit_checkpoint(tmp, self.step, meta={"student": self.cfg.student.name, "world_size": 1})
        ckpt.prune_checkpoints(self.checkpoint_root, self.cfg.checkpoint.keep)
        return path

    def load_checkpoint(self, path: Path) -> None:
        model_state, optim_state = ckpt.load_student_state(path)
        self.student.load_state_dict(model_state, strict=True)
        load_optimizer_state_by_name(self.optimizer, dict(self.student.named_parameters()), optim_state)
        state = ckpt.load_run_state(path)
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.log(f"resumed from {path} at step {self.step}")

    # ---------------------------------------------------------------- hooks the pipeline overrides
    @property
    def writes_records(self) -> bool:
        """Whether this process writes metrics and summaries (the single device does)."""
        return True

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        self.injector.on("forward", step)
        return self.step_fn(images, labels, step=step, corrupt=self.injector.corrupts_output(step))

    @property
    def step_skipped(self) -> bool:
        """Whether the last step's update was dropped (a non-finite loss under trainer.nonfinite=skip)."""
        return self.step_fn.skipped

    @property
    def needs_data(self) -> bool:
        """Whether this process reads samples (a middle pipeline rank reads none)."""
        return True

    def step_record_extras(self) -> dict[str, Any]:
        """Fields added to each step's metrics record (the pipeline adds per-rank timings)."""
        return {}

    def apply_control(self) -> None:
        """Act on what the supervisor asked for at this step boundary (the pipeline: live re-partitions)."""

    def evaluate_student(self) -> dict[str, float] | None:
        return evaluate(self.student, self.val_ds, self.setup, self.cfg.data.val_batch_size, self.cfg.data.num_workers)

    # ---------------------------------------------------------------- loop
    def fit(self) -> dict[str, Any]:
        """Train until ``total_steps`` (or ``trainer.stop_after`` steps in this launch); return the summary."""
        started, first_step = time.time(), self.step
        stop_after = self.cfg.trainer.stop_after
        images_per_step = self.cfg.data.batch_size
        progress = Progress(self.total_steps, self.step, enabled=self.cfg.trainer.progress and self.writes_records)
        with (JsonlWriter(self.run_dir / "metrics.jsonl") if self.writes_records else NullWriter()) as metrics:
            pending: dict[str, Any] | None = None  # read one step late: no host sync on the hot path
            tick = time.perf_counter()
            try:
                for batch in train_batches(self.train_ds, self.sampler, self.num_epochs, self.cfg.data.num_workers,
                                           load=self.needs_data):
                    stopping = stop_after is not None and self.step - first_step >= stop_after
                    if self.step >= self.total_steps or stopping:
                        break
                    self.injector.on("step_start", self.step + 1)
                    loss = self._guarded_step(batch.images, batch.labels, self.step + 1)
                    self.step += 1
                    now = time.perf_counter()
                    record = {"kind": "train", "step": self.step, "epoch": batch.epoch, "loss": loss,
                              "lr": self.scheduler.get_last_lr()[0], "step_time_s": now - tick,
                              "images_per_s": images_per_step / max(now - tick, 1e-9), **self.step_record_extras()}
                    if self.step_skipped:
                        record["skipped"] = "nonfinite_loss"
                    self.apply_control()  # e.g. a live re-partition asked for at this step (not step time)
                    tick = time.perf_counter()
                    pending = self._flush(metrics, pending, progress, record)
                    if self._checkpoint_and_evaluate(batch, metrics):
                        tick = time.perf_counter()  # checkpoint and evaluation time is not step time
                    if self.stop_requested:
                        break
            except BaseException:
                with contextlib.suppress(Exception):  # the finished steps' records outlive the error
                    self._flush(metrics, pending, progress, None)
                raise
            self._flush(metrics, pending, progress, None)
            if (stop_after is not None or self.stop_requested) and self.step < self.total_steps:
                self.save_checkpoint(*self._position_of_last_batch())  # nothing finished is lost
        progress.close()
        return self._summary(time.time() - started, self.step - first_step)

    def _checkpoint_and_evaluate(self, batch, metrics: JsonlWriter) -> bool:
        """What is due after this step (a checkpoint, an evaluation); whether anything was."""
        every = self.cfg.checkpoint.every
        end_of_epoch = batch.step_in_epoch == self.sampler.steps_per_epoch - 1
        last = self.step == self.total_steps
        did_io = False
        if (every and self.step % every == 0) or (end_of_epoch and self.cfg.checkpoint.at_epoch_end) or last:
            self.save_checkpoint(batch.epoch, batch.step_in_epoch)
            did_io = True
        if last or (end_of_epoch and (batch.epoch + 1) % self.cfg.trainer.eval_every_epochs == 0):
            self._evaluate(metrics, batch.epoch)
            did_io = True
        return did_io

    def _guarded_step(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        """``train_step``, reporting a non-finite loss (stopped or skipped) with its step."""
        try:
            loss = self.train_step(images, labels, step)
        except NonFiniteLossError as exc:
            self._report_nonfinite(step, exc.loss, "stopped")
            raise
        if self.step_skipped:
            self._report_nonfinite(step, None if loss is None else float(loss), "skipped")
        return loss

    def _report_nonfinite(self, step: int, loss: float | None, action: str) -> None:
        if not self.writes_records:  # one report per run: the process that has the loss
            return
        self.log(f"step {step}: the loss is {loss}, not finite; step {action} "
                 f"(trainer.nonfinite={self.cfg.trainer.nonfinite})")
        if self.events is not None:
            self.events.append("nonfinite_loss", step=step, loss=str(loss), action=action,
                               policy=self.cfg.trainer.nonfinite)

    def _position_of_last_batch(self) -> tuple[int, int]:
        per_epoch = self.sampler.steps_per_epoch
        return (self.step - 1) // per_epoch, (self.step - 1) % per_epoch

    def _flush(self, metrics: JsonlWriter, pending, progress: Progress, new) -> dict[str, Any] | None:
        if pending is not None:
            pending["loss"] = None if pending["loss"] is None else float(pending["loss"])
            metrics.write(pending)
            progress.update(pending["step"], pending["loss"] or 0.0, pending["images_per_s"])
        return new

    def _evaluate(self, metrics: JsonlWriter, epoch: int) -> None:
        result = self.evaluate_student()
        if result is None:  # a pipeline rank without the logits
            return
        record = {"kind": "eval", "step": self.step, "epoch": epoch, **{k if k.startswith("teacher_") else f"student_{k}": v for k, v in result.items()}}
        metrics.write(record)
        self.history.append(record)
        self.log(f"epoch {epoch}: val top-1 {result['top1']:.2f}%  top-5 {result['top5']:.2f}%")

    def _summary(self, seconds: float, steps: int) -> dict[str, Any]:
        final = self.history[-1] if self.history else {}
        summary = {"mode": self.cfg.mode, "steps": self.step, "steps_this_launch": steps,
                   "total_steps": self.total_steps, "stopped_on_request": self.stop_requested,
                   "wall_time_s": seconds, "images_per_s": steps * self.cfg.data.batch_size / max(seconds, 1e-9),
                   "student": self.cfg.student.name, "final_eval": final}
        if self.writes_records:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary


@dataclass
class RunParts:
    """What every training path builds the same way: data, the full student, sampler, schedule length."""

    info: Any
    train_ds: Any
    val_ds: Any
    student: nn.Module
    sampler: ResumableSampler
    num_epochs: int
    total_steps: int


def build_run_parts(cfg: DictConfig, model_name: str, init_weights: str | None) -> RunParts:
    """Seeded construction shared by the single-device trainer and every pipeline rank.

    Every rank builds the *whole* student from the same seed and keeps its own blocks, so the
    pipeline starts from exactly the weights the single-device trainer starts from.
    """
    seed_everything(cfg.seed)
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    train_ds, val_ds = build_datasets(cfg.data, cfg.seed)
    student = build_model(model_name, info.num_classes, info.in_chans, info.image_size, cfg.student.drop_rate)
    if init_weights:
        load_weights(student, init_weights, what="student.init")
    sampler = ResumableSampler(len(train_ds), cfg.seed, shuffle=True, drop_last=True, batch_size=cfg.data.batch_size)
    num_epochs, total_steps = _schedule_length(cfg, sampler.steps_per_epoch)
    return RunParts(info, train_ds, val_ds, student, sampler, num_epochs, total_steps)


def build_trainer(cfg: DictConfig, run_dir: Path, model_name: str, teacher: nn.Module | None,
                  init_weights: str | None = None, log: Callable[[str], None] = print) -> Trainer:
    """Create the model, data, optimizer and schedule for training ``model_name`` (with KD if a teacher is given)."""
    setup = build_compute_setup(cfg.trainer)
    parts = build_run_parts(cfg, model_name, init_weights)
    student = setup.prepare_model(parts.student)
    optimizer = build_optimizer(student.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, parts.total_steps)
    step_fn = SingleDeviceStep(student, teacher, optimizer, scheduler, cfg.pipeline.microbatches,
                               kd_params(cfg), setup, nonfinite=cfg.trainer.nonfinite)
    events = EventLog(events_path(run_dir), source="trainer")
    injector = FaultInjector(parse_faults(cfg.injection.faults, 1), rank=0, record=events.write)
    return Trainer(cfg, run_dir, setup, student, teacher, optimizer, scheduler, parts.train_ds, parts.val_ds,
                   parts.sampler, parts.total_steps, parts.num_epochs, step_fn, log=log, injector=injector,
                   events=events)


def kd_params(cfg: DictConfig) -> KDLossParams:
    return KDLossParams(cfg.kd.mode, cfg.kd.T, cfg.kd.lambda_kd)


def _schedule_length(cfg: DictConfig, steps_per_epoch: int) -> tuple[int, int]:
    """(epochs to iterate, optimizer steps in the whole schedule); max_steps wins over epochs."""
    if cfg.trainer.max_steps is not None:
        return math.ceil(cfg.trainer.max_steps / steps_per_epoch), cfg.trainer.max_steps
    return cfg.trainer.epochs, cfg.trainer.epochs * steps_per_epoch


def resolve_resume(cfg: DictConfig, run_dir: Path, log: Callable[[str], None] = print) -> Path | None:
    """The checkpoint to resume from: an explicit path, the newest valid one for 'auto', or None."""
    if cfg.resume is None:
        return None
    if cfg.resume != "auto":
        return Path(cfg.resume)
    events = EventLog(events_path(run_dir), source="resume")

    def skipped(ref: ckpt.CheckpointRef, error: Exception) -> None:  # damaged: said, recorded, passed over
        log(f"skipping checkpoint {ref.path}: {error}")
        events.append("checkpoint_skipped", path=str(ref.path), step=ref.step, error=str(error))

    ref = ckpt.latest_valid_checkpoint(run_dir / "checkpoints", on_skip=skipped)
    if ref is None:
        log("resume=auto: no checkpoint yet, starting fresh")
        return None
    return ref.path


def load_teacher(cfg: DictConfig, setup: ComputeSetup, info, path: str) -> nn.Module:
    teacher = build_model(cfg.teacher.name, info.num_classes, info.in_chans, info.image_size)
    load_weights(teacher, path, what="teacher.checkpoint")
    teacher = setup.prepare_model(teacher).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher
