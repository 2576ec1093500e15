"""The composition root: what ``python train.py`` (or the ``synapse`` command) does, by mode.

It is the only module that sees the whole config tree and wires the layers together: the composed
config is validated and typed once (``SynapseConfig``, frozen) -> data and models -> the first plan
(placement and micro-batch count) -> the supervisor with its controller. Nothing in synapse imports
it. Modes: distil (kd), profile the blocks, train a teacher/baseline with labels, or simulate a kd run
(the real failover controller on simulated step timings, no workers).
"""
from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from synapse.checkpoint import (
    CheckpointWriteError,
    ForeignCheckpointError,
    IncompatibleCheckpointError,
    NoIntactCheckpointError,
    check_run_dir_checkpoints,
)
from synapse.config import (
    ConfigError,
    SynapseConfig,
    check_resume_settings,
    config_yaml,
    resolve_accelerator,
    run_topology,
    typed_config,
    validate,
    with_settings,
)
from synapse.data import data_kwargs, dataset_info
from synapse.engine import resolve_resume, teacher_weights, train_label_model
from synapse.failover import (
    NodeDecider,
    keeps_the_decider,
    print_failover_story,
    run_across_nodes,
    run_with_failover,
    supervised_console,
    user_overrides,
)
from synapse.launch import DISK_FULL, RunInterrupted, launch_pipeline, newest_checkpoint
from synapse.partitioning import StagePlanner
from synapse.pipeline import LaunchTask
from synapse.planning import compare_plan_with_run, plan_run, profile_models
from synapse.rundir import (
    CHECKPOINTS,
    CONFIG,
    EVENTS,
    PARTITION,
    PERFORMANCE,
    PLAN,
    RUN_SUMMARY,
    DiskFullError,
    EventLog,
    RecordFileError,
    RunDirInUseError,
    RunDirUnusableError,
    cut_torn_tail,
    disk_full_error,
    hold_run_dir,
    is_disk_full,
)
from synapse.simulation import run_simulation


def run(composed: DictConfig, log: Callable[[str], None] = print, overrides: list[str] | None = None
        ) -> dict[str, Any]:
    """Run the config Hydra ``composed``. ``overrides`` are the command-line overrides that composed it
    (inside ``@hydra.main`` they are read from Hydra); later segments' configs are composed from them."""
    validate(composed)
    # A resume that would change what the run learns is refused here, before any work (synapse/config/resume.py)
    resumed = check_resume_settings(composed)
    cfg = typed_config(composed)  # from here on, every part receives its typed, frozen slice
    run_dir = Path(cfg.run_dir)
    with hold_run_dir(run_dir, lock_slot(composed)):  # one run per directory (synapse/rundir/lock.py)
        if resumed:
            log(resumed)
        # node 0's rank 0 writes and prunes the checkpoints (a simulation writes none)
        if cfg.mode not in ("profile", "simulate") and _owns_the_run(cfg):
            check_run_dir_checkpoints(CHECKPOINTS.path(run_dir), cfg.resume)  # never two runs' in one directory
            # A killed run's torn last event would merge with this run's first appended one into a line
            # no reader can parse; under the lock no other writer is alive to be cut short
            cut_torn_tail(EVENTS.path(run_dir))
        try:
            return _run_holding(cfg, run_dir, log, overrides)
        except Exception as exc:
            if isinstance(exc, (DiskFullError, CheckpointWriteError)) or not (
                    is_disk_full(exc) or getattr(exc, "cause", None) == DISK_FULL):
                raise
            # Whatever write hit the full disk last (a record, a segment file), the user hears ENOSPC.
            # (A full cache disk is named where the cache is written, as a DiskFullError of its own.)
            raise disk_full_error(run_dir, newest_checkpoint(run_dir), f"{type(exc).__name__}: {exc}"[:300]) from exc


def _owns_the_run(cfg: SynapseConfig) -> bool:
    """Whether this launcher checks the run directory and writes the run's report: the one process of the
    run that serves node 0 or, across nodes, keeps the decider (``trainer.role``)."""
    if cfg.trainer.nodes > 1 and cfg.failover.enabled:
        return keeps_the_decider(cfg.trainer)
    return cfg.trainer.node_rank == 0


def lock_slot(config: DictConfig) -> int:
    """Which lock of the run directory this launcher holds: its node's; a decider on a host of its own
    (``trainer.role=decider``) holds the one after the last node's, beside node 0's agent. Read from the
    composed config (also before it is validated: a value that is not a number reads as node 0)."""
    def number(key: str) -> int:
        value = OmegaConf.select(config, key, default=0, throw_on_resolution_failure=False)
        return value if isinstance(value, int) else 0
    role = OmegaConf.select(config, "trainer.role", default="auto", throw_on_resolution_failure=False)
    return number("trainer.nodes") if role == "decider" else number("trainer.node_rank")


def _run_holding(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None], overrides: list[str] | None
                 ) -> dict[str, Any]:
    CONFIG.path(run_dir).write_text(config_yaml(cfg))
    if cfg.mode == "profile":
        return run_profile_mode(cfg, log)
    if cfg.mode == "simulate":
        summary = run_simulation(cfg, run_dir, log)
        write_run_report(cfg, run_dir, log)
        return summary
    if cfg.mode in ("teacher", "baseline"):
        name = cfg.teacher.name if cfg.mode == "teacher" else cfg.student.name
        init = cfg.student.init if cfg.mode == "baseline" else None
        path = train_label_model(cfg, run_dir, name, log, init=init)
        log(f"{cfg.mode}: weights of {name} written to {path}")
        return json.loads(RUN_SUMMARY.path(run_dir).read_text())
    return run_kd(cfg, run_dir, log, overrides)


def run_kd(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None],
           overrides: list[str] | None = None) -> dict[str, Any]:
    """Distil over the configured devices, K = 1 included: one run path, under the supervisor (health,
    detection, failover) unless failover.enabled=false."""
    summary = run_pipeline(cfg, run_dir, log, overrides)
    if _owns_the_run(cfg):  # one report per run, by the launcher that keeps the decider
        write_run_report(cfg, run_dir, log)
    return summary


def run_pipeline(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None],
                 overrides: list[str] | None = None) -> dict[str, Any]:
    """Pipelined KD over K devices: plan the partition here, then launch the K workers. Across nodes
    with failover, node 0 does this as the decider and every other node runs an agent."""
    if cfg.failover.enabled and cfg.trainer.nodes > 1:
        # node 0's decider runs in a process of its own (failover/keeper.py), so the overrides are read here
        return run_across_nodes(cfg.trainer, cfg.failover, run_dir, log,
                                DeciderJob(cfg, run_dir, user_overrides(overrides)))
    return _plan_and_run(cfg, run_dir, log, overrides)


@dataclass(frozen=True)
class DeciderJob:
    """What node 0's decider runs, in its own process: plan and run the segments. A decider restarted
    after the one before it died continues the run from the run directory, as ``resume=auto`` does
    (segment history, controller state, newest checkpoint)."""

    cfg: SynapseConfig
    run_dir: Path
    overrides: list[str] | None

    def __call__(self, nodes: NodeDecider, restarted: bool) -> dict[str, Any]:
        cfg = with_settings(self.cfg, {"resume": "auto"}) if restarted else self.cfg
        return _plan_and_run(cfg, self.run_dir, logging.getLogger("synapse").info, self.overrides, nodes)


def _plan_and_run(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None], overrides: list[str] | None = None,
                  nodes: NodeDecider | None = None) -> dict[str, Any]:
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    plan, planner = plan_run(cfg, info, stage_devices(cfg), run_dir, log)  # fails before any process starts
    partition, microbatches = plan.placement, plan.microbatches
    k, failover = partition.stages_in(0), cfg.failover.enabled
    weights = teacher_weights(cfg, run_dir, log)
    resume_checkpoint = resolve_resume(cfg.resume, run_dir, log)
    PARTITION.path(run_dir).write_text(json.dumps(partition.to_dict(), indent=1))
    replicated = f"{partition.replicas} replicas x " if partition.replicas > 1 else ""
    if partition.replica_stages:  # replicas cut differently: the counts list every replica's stages
        replicated = f"{partition.replicas} replicas of {list(partition.replica_stages)} stages; replica 0: "
    if partition.replicas > 1 and cfg.pipeline.cuda_graphs and resolve_accelerator(cfg.trainer) == "cuda":
        log("pipeline.cuda_graphs: the replicas' stages are graphed, but planned on eager profiles (graphed "
            "replicas are not measured for speed yet)")
    log(f"pipeline: {replicated}{k} stage{'' if k == 1 else 's'}, teacher blocks per stage "
        f"{list(partition.teacher_counts)}, "
        f"student blocks per stage {list(partition.student_counts)}, {cfg.pipeline.schedule} with "
        f"{microbatches} micro-batches")
    resume = str(resume_checkpoint) if resume_checkpoint else None
    if failover:  # the planner was built above (cast)
        summary = run_with_failover(cfg, run_dir, cast(StagePlanner, planner), plan, str(weights), resume,
                                    overrides, log, launch=nodes or launch_pipeline)
        print_failover_story(summary.get("experiment", {}), run_dir, log)
    else:  # failover.enabled=false: a worker failure ends the run
        with supervised_console(run_dir, log, cfg.trainer.progress):
            summary = launch_pipeline(LaunchTask(cfg, partition, microbatches, 0, str(weights), resume), run_dir,
                                      log=log)
    try:
        comparison = compare_plan_with_run(run_dir)
    except (RecordFileError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        # an informational line: records it cannot read must not fail a run that trained to its end
        comparison = None
        log(f"planner: comparison of the plan with the run skipped: {PERFORMANCE.path(run_dir)} or "
            f"{PLAN.path(run_dir)} holds a record it cannot read ({type(exc).__name__}: {exc})"[:600])
    if comparison:
        log(f"planner: predicted step {comparison['predicted_step_s'] * 1e3:.1f} ms, measured "
            f"{comparison['measured_step_s'] * 1e3:.1f} ms ({comparison['step_error']:+.0%}, uncalibrated)")
    final = summary.get("final_eval") or {}
    if final:
        log(f"distilled student {cfg.student.name}: val top-1 {final['student_top1']:.2f}% "
            f"(teacher {final.get('teacher_top1', float('nan')):.2f}%), {throughput_text(summary)} "
            f"on {k} stage{'' if k == 1 else 's'}; outputs in {run_dir}")
    return summary


def throughput_text(summary: dict[str, Any]) -> str:
    """The steady rate (median step) and the launch's, which counts warm-up, graph capture,
    evaluations and checkpoints: in a short GPU run the two differ 2-3x."""
    launch = f"{summary['images_per_s']:,.0f} images/s over the launch"
    steady = summary.get("median_step_images_per_s")
    return launch if steady is None else f"{steady:,.0f} images/s a step (median), {launch}"


def stage_devices(cfg: SynapseConfig) -> list[int]:
    """The device of each pipeline stage: every node runs its configured devices in order."""
    return run_topology(cfg.trainer).devices  # run-wide ids across nodes (synapse/partitioning/topology.py)


def write_run_report(cfg: SynapseConfig, run_dir: Path, log: Callable[[str], None]) -> None:
    """Figures and report.md of a finished run (report=false skips it). A report that cannot be
    drawn is said, never a failed run: the training and its records are already complete."""
    if not cfg.report:
        return
    from synapse.analysis import write_report

    try:
        log(f"report: {write_report(run_dir)}")
    except Exception as exc:  # noqa: BLE001  (any plotting error; the records are what matter)
        log(f"report: not written ({type(exc).__name__}: {exc}); the run finished and its records are in "
            f"{run_dir}. Retry with: python -m synapse.analysis report {run_dir}")


def run_profile_mode(cfg: SynapseConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """mode=profile: measure (or find cached) block profiles of the teacher and student and say where
    (at the configured micro-batch size; with pipeline.microbatches=auto, the whole batch)."""
    info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
    paths = profile_models(cfg, info, log, microbatches=1 if cfg.pipeline.microbatches == "auto" else None)
    log(f"profiles: teacher {paths.teacher}\n          student {paths.student}")
    return {"teacher_profile": str(paths.teacher), "student_profile": str(paths.student)}


class HoldRunDir(Callback):
    """Hydra callback (``hydra.callbacks.run_dir_lock``): take the run directory's lock before Hydra
    writes into it. Hydra writes ``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml`` and opens
    ``train.log`` before the job starts, so a second run refused by the lock in ``run`` had already
    overwritten the running run's records and appended to its log; and a directory that cannot be
    written failed in Hydra with a raw ``OSError``. ``run`` takes the same lock again (re-entrant
    within the process). A multirun's job folders are Hydra's own fresh ones: ``run`` holds those."""

    def __init__(self) -> None:
        self._held = contextlib.ExitStack()

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # A config that will be refused leaves nothing behind, not even the lock's files: refuse it first.
        # The job's ${hydra:...} values resolve only once Hydra's config is set (run_job sets it again).
        HydraConfig.instance().set_config(config)
        job = OmegaConf.masked_copy(config, [str(key) for key in config if key != "hydra"])
        try:
            validate(job)
        except ConfigError as exc:
            print(f"synapse: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        except Exception:  # anything else: run() validates again under the lock and reports it there;
            pass  # raised here, Hydra would only warn and go on without the lock
        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        try:
            self._held.enter_context(hold_run_dir(run_dir, lock_slot(config)))
        except (RunDirInUseError, RunDirUnusableError) as exc:
            # Hydra turns a callback's exception into a warning and goes on; a SystemExit it lets through
            print(f"synapse: {type(exc).__name__}: {exc}", file=sys.stderr)
            raise SystemExit(2 if isinstance(exc, RunDirUnusableError) else 1) from None

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._held.close()


def _hydra_entry(cfg: DictConfig) -> None:
    from hydra.types import RunMode

    log = logging.getLogger("synapse")  # the console and <run dir>/train.log
    # In a sweep one job's failure must not end the others: Hydra's basic sweeper raises the first
    # failed job's error once the batch is done, before the sweep report's end-of-sweep hook, and a
    # SystemExit ends the sweep at once. So a failed job is said, recorded in its folder (the sweep
    # report marks it with its error) and returns; the sweep's exit status says that jobs failed.
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        run(cfg, log=log.info)
    except (ConfigError, *REFUSED_BEFORE_WORK) as exc:  # one clear line (it names the problem and the fix), no stack
        print(f"synapse: {f'job {HydraConfig.get().job.num}: ' if in_sweep else ''}{exc}", file=sys.stderr)
        if not in_sweep:
            raise SystemExit(2) from None
        _record_failed_job(cfg, exc)
    except RunInterrupted:
        raise  # Ctrl-C or SIGTERM stops the sweep, not only this job
    except Exception as exc:
        if not in_sweep:
            raise
        log.exception(f"synapse: job {HydraConfig.get().job.num} failed; the sweep goes on with the next job")
        _record_failed_job(cfg, exc)


def _record_failed_job(cfg: DictConfig, error: Exception) -> None:
    """A ``run_failed`` event in the job's folder, for the sweep report. Only under the folder's
    lock: a job refused because another run holds the folder must not write into that run's log."""
    from hydra.core.hydra_config import HydraConfig

    job_dir = Path(HydraConfig.get().runtime.output_dir)
    with contextlib.suppress(RunDirInUseError, RunDirUnusableError, OSError):
        with hold_run_dir(job_dir, lock_slot(cfg)):
            EventLog(EVENTS.path(job_dir), source="supervisor").append(
                "run_failed", error=f"{type(error).__name__}: {error}"[:2000])


# A run directory or checkpoint this run cannot use, refused before any work starts: like a bad
# setting, the message says what to change.
REFUSED_BEFORE_WORK = (ForeignCheckpointError, IncompatibleCheckpointError, NoIntactCheckpointError)


def main() -> None:
    """``python train.py ...`` and the ``synapse`` console command: Hydra composes the config from the
    package's own groups (``pkg://synapse.conf``), so an installed Synapse needs no checkout."""
    import hydra

    from synapse import config  # noqa: F401  (registers the structured-config schema)

    hydra.main(version_base="1.3", config_path="pkg://synapse.conf", config_name="config")(_hydra_entry)()
