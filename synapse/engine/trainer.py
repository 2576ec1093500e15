"""The training loop every path shares, and the single-device trainer (K = 1): the fast path,
and the reference the pipeline reproduces.

``Trainer.fit`` runs the loop: resumable batches, one step per batch through its ``runner``,
metrics per step, evaluation per epoch, atomic checkpoints through its ``checkpointer``, and a
final summary. ``build_trainer`` composes it for one device (validate early, create late);
``synapse.pipeline.trainer.build_pipeline_trainer`` composes the same loop for a pipeline rank.

The builders (``build_trainer``, ``build_run_parts``, ``loop_settings``) are the only code here that
reads the run's whole config: the loop gets a frozen ``LoopSettings``, the other parts the config
groups they use.
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from synapse import checkpoint as ckpt
from synapse.config import KDConfig, SynapseConfig, TeacherConfig, TrainerConfig
from synapse.data import ResumableSampler, build_datasets, data_kwargs, dataset_info
from synapse.engine.accuracy import evaluate
from synapse.engine.batches import Batch, loader_workers, train_batches, with_host_data_path
from synapse.engine.checkpointer import Checkpointer, HeldState, SingleShard
from synapse.engine.device import ComputeSetup, build_compute_setup, seed_everything
from synapse.engine.optim import build_optimizer, build_scheduler
from synapse.engine.progress import Progress
from synapse.engine.step import NonFiniteLossError, SingleDeviceStep, checks_loss_late
from synapse.injection import FaultInjector, instant_fault_steps, parse_faults
from synapse.kd import KDLossParams
from synapse.models import build_model, load_weights
from synapse.rundir import CHECKPOINTS, METRICS, RUN_SUMMARY, EventLog, JsonlWriter, NullWriter, events_path
from synapse.trackers import TrackedWriter, open_tracker


class StepRunner(Protocol):
    """How one optimizer step runs: on one device (``SingleDeviceRunner``) or as this rank's share of
    the pipeline (``synapse.pipeline.trainer.PipelineRunner``). The loop around it is the same."""

    stop_requested: bool  # the supervisor asked every rank to stop after this step

    # Read-only: a runner may derive them (the pipeline's from its rank).
    @property
    def writes_records(self) -> bool:
        """Whether this process writes metrics and summaries."""

    @property
    def needs_data(self) -> bool:
        """Whether this process reads samples (a middle pipeline rank reads none)."""

    @property
    def needs_images(self) -> bool:
        """Whether it needs images, not only labels (the last pipeline rank reads labels only)."""

    @property
    def device(self) -> torch.device:
        """Where this process's batches are finished (decoded, normalised)."""

    @property
    def batch_share(self) -> range | None:
        """Which images of each step's batch this process trains on (a replica's share; None: all)."""

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor | None: ...

    @property
    def skipped(self) -> bool:
        """Whether the last step's update was dropped (a non-finite loss under trainer.nonfinite=skip)."""

    @property
    def scheduler(self) -> Any: ...

    def after_step(self, step: int) -> dict[str, Any]:
        """Fields for the step's metrics record (the pipeline exchanges per-rank timings here)."""

    def check_loss(self, step: int, loss: float) -> None:
        """Step ``step``'s loss as read for its record: raises `NonFiniteLossError` where the step
        left the check to this reading (``trainer.nonfinite_check=late``)."""

    def apply_control(self, step: int) -> None:
        """Act on what the supervisor asked for at this step boundary (the pipeline: live re-partitions)."""

    def finish_steps(self) -> None:
        """The loop has ended: record what the step records still lack (the pipeline on CUDA reports
        each step's timing a step late, so the last one is still due)."""

    def held_state(self) -> HeldState:
        """What this process trains now, for checkpoints."""


@dataclass
class SingleDeviceRunner:
    """The whole student on one device: ``SingleDeviceStep`` with the fault hooks."""

    student: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    step_fn: SingleDeviceStep
    injector: FaultInjector
    student_name: str
    writes_records: bool = True
    needs_data: bool = True
    needs_images: bool = True
    stop_requested: bool = False
    batch_share: range | None = None

    @property
    def device(self) -> torch.device:
        return self.step_fn.setup.device

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        self.injector.on("forward", step)
        return self.step_fn(images, labels, step=step, corrupt=self.injector.corrupts_output(step))

    @property
    def skipped(self) -> bool:
        return self.step_fn.skipped

    def after_step(self, step: int) -> dict[str, Any]:
        return {}

    def check_loss(self, step: int, loss: float) -> None:
        self.step_fn.guard.check_read_loss(step, loss)

    def apply_control(self, step: int) -> None:
        pass

    def finish_steps(self) -> None:
        pass

    def held_state(self) -> HeldState:
        return HeldState(self.student.state_dict(keep_vars=True), self.optimizer, self.scheduler, {})


@dataclass(frozen=True)
class LoopSettings:
    """What the training loop reads of the run's config, picked out by its builder (``loop_settings``):
    the loop depends on these values, not on the config's layout."""

    mode: str  # the run's mode and student model, named in summary.json
    student: str
    images_per_step: int  # data.batch_size: one batch per optimizer step
    loader_workers: int  # data.num_workers
    stop_after: int | None  # trainer.stop_after: end this launch after N steps, with a checkpoint
    progress: bool  # trainer.progress: draw the bar (on the process that writes records)
    eval_every_epochs: int
    nonfinite: str  # trainer.nonfinite, named when a non-finite loss is reported
    checkpoint_every: int  # checkpoint.every (0: at epoch ends and the end only)
    checkpoint_at_epoch_end: bool
    async_save: bool  # checkpoint.async_save: the staging buffers are prepared after the first step
    tracker: str  # logger.name: where the scalars also go
    # Steps at which an instant fault fires on some rank: every rank lets the checkpoint in flight
    # commit before them (synapse.injection.instant_fault_steps).
    fault_steps: frozenset[int] = frozenset()


class RecordWriter(Protocol):
    """Where the loop writes its metrics records (``JsonlWriter``, or a ``TrackedWriter`` around one)."""

    def write(self, record: dict[str, Any]) -> None: ...


# The runner's own type, so that a builder's caller can reach what its runner has beyond StepRunner.
Runner = TypeVar("Runner", bound=StepRunner)


@dataclass
class Trainer(Generic[Runner]):
    """The training loop, the same for every path; its parts are composed, not overridden: how a
    step runs (``runner``), checkpoint I/O (``checkpointer``) and evaluation (``evaluate``)."""

    settings: LoopSettings
    run_dir: Path
    runner: Runner
    checkpointer: Checkpointer
    evaluate: Callable[[], dict[str, float] | None]  # None on a process without the logits
    train_ds: Any
    val_ds: Any
    sampler: ResumableSampler
    total_steps: int
    num_epochs: int
    injector: FaultInjector
    events: EventLog  # failover_events.jsonl (non-finite losses; the pipeline: more)
    log: Callable[[str], None] = print
    mark: Callable[[str], None] = lambda phase: None  # where this rank is (the hang watchdog's board)
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    _stopped_step: int | None = field(default=None, init=False)  # the non-finite step reported (report once)

    @property
    def writes_records(self) -> bool:
        return self.runner.writes_records

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, epoch: int, step_in_epoch: int) -> Path:
        return self.checkpointer.save(self.step, self.runner.held_state(),
                                      self.sampler.state_after(epoch, step_in_epoch))

    def load_checkpoint(self, path: Path) -> None:
        self.step, sampler_state = self.checkpointer.load(Path(path), self.runner.held_state())
        self.sampler.load_state_dict(sampler_state)
        if self.writes_records:
            self.log(f"resumed from {path} at step {self.step}")

    # ---------------------------------------------------------------- loop
    def fit(self) -> dict[str, Any]:
        """Train until ``total_steps`` (or ``trainer.stop_after`` steps in this launch); return the summary."""
        started, first_step = time.time(), self.step
        settings = self.settings
        stop_after = settings.stop_after
        images_per_step = settings.images_per_step
        progress = Progress(self.total_steps, self.step, enabled=settings.progress and self.writes_records,
                            log=self.log)
        runner = self.runner
        fault_steps = settings.fault_steps
        with self._metrics_writer() as metrics:
            pending: dict[str, Any] | None = None  # read one step late: no host sync on the hot path
            step_rates: list[float] = []  # images/s of each step, for the summary's steady rate
            tick = time.perf_counter()
            try:
                for batch in self._train_batches():
                    stopping = stop_after is not None and self.step - first_step >= stop_after
                    if self.step >= self.total_steps or stopping:
                        break
                    if self.step + 1 in fault_steps:  # injected faults land on a settled checkpoint
                        self.checkpointer.wait()
                        self.checkpointer.shards.barrier()
                    self.mark("step_start")  # its own work: a hang here must not read as the last step's wait
                    self.injector.on("step_start", self.step + 1)
                    loss = self._guarded_step(batch.images, batch.labels, self.step + 1)
                    self.step += 1
                    now = time.perf_counter()
                    record = {"kind": "train", "step": self.step, "epoch": batch.epoch, "loss": loss,
                              "lr": runner.scheduler.get_last_lr()[0], "step_time_s": now - tick,
                              "images_per_s": images_per_step / max(now - tick, 1e-9), **runner.after_step(self.step)}
                    step_rates.append(record["images_per_s"])
                    if runner.skipped:
                        record["skipped"] = "nonfinite_loss"
                    runner.apply_control(self.step)  # e.g. a live re-partition asked for at this step (not step time)
                    tick = time.perf_counter()
                    pending = self._flush(metrics, pending, progress, record)
                    if self.step == first_step + 1 and settings.async_save:
                        self.checkpointer.prepare(runner.held_state())  # staging buffers, before any save
                        tick = time.perf_counter()
                    if self._checkpoint_and_evaluate(batch, metrics, record):
                        tick = time.perf_counter()  # checkpoint and evaluation time is not step time
                    if runner.stop_requested:
                        break
                runner.finish_steps()
            except BaseException:
                with contextlib.suppress(Exception):  # the finished steps' records outlive the error
                    self._flush(metrics, pending, progress, None)
                self._finish_saving_after_error()
                progress.close()  # the console gets its streams back before the error is printed
                raise
            self._flush(metrics, pending, progress, None)
            if (stop_after is not None or runner.stop_requested) and self.step < self.total_steps:
                self.save_checkpoint(*self._position_of_last_batch())  # nothing finished is lost
            self.checkpointer.close()  # the save in flight is committed before the run (or launch) ends
        progress.close()
        return self._summary(time.time() - started, self.step - first_step, step_rates)

    def _train_batches(self) -> Iterator[Batch]:
        """The run's batches from the sampler's position, cut to the runner's share of each. When that share
        changes at a step boundary (a live REBALANCE), the loader is opened again after the batch last taken,
        on the new share: what it had read ahead was cut to the old one."""
        runner = self.runner
        load = "images" if runner.needs_images else "labels" if runner.needs_data else "nothing"
        while True:
            share = runner.batch_share
            batches = train_batches(self.train_ds, self.sampler, self.num_epochs, self.settings.loader_workers,
                                    load=load, device=runner.device, share=share)
            with contextlib.closing(batches):
                for batch in batches:
                    yield batch
                    if runner.batch_share != share:
                        break
                else:
                    return
            self.sampler.load_state_dict(self.sampler.state_after(batch.epoch, batch.step_in_epoch))

    def _finish_saving_after_error(self) -> None:
        """A save started before the error was of sound steps: let it commit, but say (not raise) its
        own failure, so the error that ended the run stays the one reported."""
        try:
            self.checkpointer.close()
        except BaseException as exc:  # noqa: BLE001 - the original error follows
            self.log(f"the checkpoint in flight was not committed: {type(exc).__name__}: {exc}")

    def _metrics_writer(self) -> JsonlWriter | TrackedWriter:
        """metrics.jsonl and the configured tracker (logger=...), on the process that keeps records."""
        if not self.writes_records:
            return NullWriter()
        return TrackedWriter(JsonlWriter(METRICS.path(self.run_dir)),
                             open_tracker(self.settings.tracker, self.run_dir, "train"))

    def _checkpoint_and_evaluate(self, batch, metrics: RecordWriter, record: dict[str, Any]) -> bool:
        """What is due after this step (a checkpoint, an evaluation); whether anything was.
        ``record``: the step's, whose loss (read late, if at all) is checked before either."""
        every = self.settings.checkpoint_every
        end_of_epoch = batch.step_in_epoch == self.sampler.steps_per_epoch - 1
        last = self.step == self.total_steps
        save = (every and self.step % every == 0) or (end_of_epoch and self.settings.checkpoint_at_epoch_end) or last
        evaluate = last or (end_of_epoch and (batch.epoch + 1) % self.settings.eval_every_epochs == 0)
        if (save or evaluate) and record["loss"] is not None:
            self._check_loss(record["step"], float(record["loss"]))  # a checkpoint holds finite steps only
        if save:
            self.save_checkpoint(batch.epoch, batch.step_in_epoch)
        if evaluate:
            self._evaluate(metrics, batch.epoch)
        return bool(save or evaluate)

    def _guarded_step(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        """``train_step``, reporting a non-finite loss (stopped or skipped) with its step."""
        try:
            loss = self.runner(images, labels, step)
        except NonFiniteLossError as exc:
            self._report_stopped(exc)
            raise
        if self.runner.skipped:
            self._report_nonfinite(step, None if loss is None else float(loss), "skipped")
        return loss

    def _check_loss(self, step: int, loss: float) -> None:
        """A step's loss as read for its record or before a checkpoint (the late check's raise point)."""
        try:
            self.runner.check_loss(step, loss)
        except NonFiniteLossError as exc:
            self._report_stopped(exc)
            raise

    def _report_stopped(self, exc: NonFiniteLossError) -> None:
        if self._stopped_step != exc.step:  # a late check may meet the same step again (the error path's flush)
            self._stopped_step = exc.step
            self._report_nonfinite(exc.step, exc.loss, "stopped")

    def _report_nonfinite(self, step: int, loss: float | None, action: str) -> None:
        if not self.writes_records:  # one report per run: the process that has the loss
            return
        self.log(f"step {step}: the loss is {loss}, not finite; step {action} "
                 f"(trainer.nonfinite={self.settings.nonfinite})")
        self.events.append("nonfinite_loss", step=step, loss=str(loss), action=action, policy=self.settings.nonfinite)

    def _position_of_last_batch(self) -> tuple[int, int]:
        per_epoch = self.sampler.steps_per_epoch
        return (self.step - 1) // per_epoch, (self.step - 1) % per_epoch

    def _flush(self, metrics: RecordWriter, pending, progress: Progress, new) -> dict[str, Any] | None:
        if pending is not None:
            pending["loss"] = None if pending["loss"] is None else float(pending["loss"])
            if pending["loss"] is not None:
                self._check_loss(pending["step"], pending["loss"])  # a stopped step leaves no record
            metrics.write(pending)
            progress.update(pending["step"], pending["loss"] or 0.0, pending["images_per_s"])
        return new

    def _evaluate(self, metrics: RecordWriter, epoch: int) -> None:
        result = self.evaluate()
        if result is None:  # a pipeline rank without the logits
            return
        record = {"kind": "eval", "step": self.step, "epoch": epoch,
                  **{k if k.startswith("teacher_") else f"student_{k}": v for k, v in result.items()}}
        metrics.write(record)
        self.history.append(record)
        self.log(f"epoch {epoch}: val top-1 {result['top1']:.2f}%  top-5 {result['top5']:.2f}%")

    def _summary(self, seconds: float, steps: int, step_rates: list[float]) -> dict[str, Any]:
        """``images_per_s`` is the launch's (warm-up, graph capture, evaluations and checkpoints
        included); ``median_step_images_per_s`` the steady rate of its steps."""
        final = self.history[-1] if self.history else {}
        summary = {"mode": self.settings.mode, "steps": self.step, "steps_this_launch": steps,
                   "total_steps": self.total_steps, "stopped_on_request": self.runner.stop_requested,
                   "wall_time_s": seconds, "images_per_s": steps * self.settings.images_per_step / max(seconds, 1e-9),
                   "median_step_images_per_s": statistics.median(step_rates) if step_rates else None,
                   "student": self.settings.student, "final_eval": final}
        if self.writes_records:
            RUN_SUMMARY.path(self.run_dir).write_text(json.dumps(summary, indent=1))
        return summary


# ---------------------------------------------------------------- composition (the whole config)
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


def loop_settings(cfg: SynapseConfig, world_size: int) -> LoopSettings:
    """The loop's settings from the run's config; ``world_size``: the processes that run the loop
    (the faults are checked against it)."""
    return LoopSettings(
        mode=cfg.mode, student=cfg.student.name, images_per_step=cfg.data.batch_size,
        loader_workers=loader_workers(cfg.data), stop_after=cfg.trainer.stop_after, progress=cfg.trainer.progress,
        eval_every_epochs=cfg.trainer.eval_every_epochs, nonfinite=cfg.trainer.nonfinite,
        checkpoint_every=cfg.checkpoint.every, checkpoint_at_epoch_end=cfg.checkpoint.at_epoch_end,
        async_save=cfg.checkpoint.async_save, tracker=cfg.logger.name,
        fault_steps=frozenset(instant_fault_steps(parse_faults(cfg.injection.faults, world_size))))


def build_run_parts(cfg: SynapseConfig, model_name: str, init_weights: str | None) -> RunParts:
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
    num_epochs, total_steps = _schedule_length(cfg.trainer, sampler.steps_per_epoch)
    return RunParts(info, train_ds, val_ds, student, sampler, num_epochs, total_steps)


def build_trainer(cfg: SynapseConfig, run_dir: Path, model_name: str, teacher: nn.Module | None,
                  init_weights: str | None = None,
                  log: Callable[[str], None] = print) -> Trainer[SingleDeviceRunner]:
    """Create the model, data, optimizer and schedule for training ``model_name`` (with KD if a teacher is given)."""
    setup = build_compute_setup(cfg.trainer)
    cfg, _ = with_host_data_path(cfg, setup.device, local_ranks=1, local_readers=1)
    parts = build_run_parts(cfg, model_name, init_weights)
    student = setup.prepare_model(parts.student)
    optimizer = build_optimizer(student.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, parts.total_steps)
    late = checks_loss_late(cfg.trainer.nonfinite_check, cfg.trainer.nonfinite, setup.device)
    # Label training (mode=teacher|baseline) has nothing pipelined to plan: auto is the whole batch at once.
    microbatches = 1 if cfg.pipeline.microbatches == "auto" else int(cfg.pipeline.microbatches)
    step_fn = SingleDeviceStep(student, teacher, optimizer, scheduler, microbatches,
                               kd_params(cfg.kd), setup, nonfinite=cfg.trainer.nonfinite, check_late=late)
    events = EventLog(events_path(run_dir), source="trainer")
    injector = FaultInjector(parse_faults(cfg.injection.faults, 1), rank=0, record=events.write)
    runner = SingleDeviceRunner(student, optimizer, scheduler, step_fn, injector, model_name)
    def saved(step: int, path: Path, seconds: float, stall: float, context: dict) -> None:
        events.append("checkpoint_saved", step=step, path=str(path), seconds=seconds, stall_s=stall, **context)

    checkpointer = Checkpointer(CHECKPOINTS.path(run_dir), cfg.checkpoint.keep, cfg.student.name, SingleShard(),
                                injector, on_saved=saved, asynchronous=cfg.checkpoint.async_save, device=setup.device,
                                save_context=lambda: {"for_stop": runner.stop_requested})

    def evaluate_student() -> dict[str, float]:
        return evaluate(student, parts.val_ds, setup, cfg.data.val_batch_size, loader_workers(cfg.data))

    return Trainer(loop_settings(cfg, world_size=1), run_dir, runner, checkpointer, evaluate_student, parts.train_ds,
                   parts.val_ds, parts.sampler, parts.total_steps, parts.num_epochs, injector, events, log=log)


def kd_params(kd: KDConfig) -> KDLossParams:
    return KDLossParams(kd.mode, kd.T, kd.lambda_kd)


def _schedule_length(trainer: TrainerConfig, steps_per_epoch: int) -> tuple[int, int]:
    """(epochs to iterate, optimizer steps in the whole schedule); max_steps wins over epochs."""
    if trainer.max_steps is not None:
        return math.ceil(trainer.max_steps / steps_per_epoch), trainer.max_steps
    return trainer.epochs, trainer.epochs * steps_per_epoch


def resolve_resume(resume: str | None, run_dir: Path, log: Callable[[str], None] = print) -> Path | None:
    """The checkpoint ``resume`` (the config's) names: an explicit path, the newest valid one for
    'auto', or None."""
    if resume is None:
        return None
    if resume != "auto":
        return Path(resume)
    events = EventLog(events_path(run_dir), source="resume")

    def skipped(ref: ckpt.CheckpointRef, error: Exception) -> None:  # damaged: said, recorded, passed over
        log(f"skipping checkpoint {ref.path}: {error}")
        events.append("checkpoint_skipped", path=str(ref.path), step=ref.step, error=str(error))

    ref = ckpt.resume_checkpoint(CHECKPOINTS.path(run_dir), on_skip=skipped)  # all damaged: refused, named
    if ref is None:
        log("resume=auto: no checkpoint yet, starting fresh")
        return None
    return ref.path


def load_teacher(teacher_cfg: TeacherConfig, setup: ComputeSetup, info, path: str) -> nn.Module:
    teacher = build_model(teacher_cfg.name, info.num_classes, info.in_chans, info.image_size)
    load_weights(teacher, path, what="teacher.checkpoint")
    teacher = setup.prepare_model(teacher).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher
