"""The supervisor: run the pipeline segment by segment until the schedule is done.

One segment = one launch of the workers on one device set with one partition. During a launch
a ``LaunchWatcher`` feeds the step timings to the ``FailoverController``; a non-KEEP decision
makes every rank stop after the same step, checkpoint and exit. A device failure (rank
killed, hung, CUDA error) ends the launch through the elastic agent and the health monitor;
the controller then picks a survivor option. Either way the next segment's config is composed
with Hydra from the user's overrides plus the new devices, partition, resume checkpoint and
the faults still to come, saved under ``segments/<n>/``, and launched.

What each restart cost (checkpoint save, teardown, launch, checkpoint load, warm-up) is
measured from the event log (`restarts.py`) and fed back to the restart-cost model, so later
decisions use this run's own restarts. What goes into a segment's config is `segments.py`'s to say.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synapse import checkpoint as ckpt
from synapse.config import FailoverConfig, TrainerConfig
from synapse.control import ControlChannel, FileControlChannel, StopRequest, control_endpoint, open_channel
from synapse.decision import Decision, NoViableOptionError, Option, OptionKind
from synapse.failover.controller import FailoverController
from synapse.failover.live import LIVE_OUTCOMES
from synapse.failover.progress import supervised_console
from synapse.failover.restarts import Restart
from synapse.failover.segments import ComposedSegment, Segment, SegmentComposer, pin_checkpoint, write_segment
from synapse.failover.summary import write_experiment_summary
from synapse.failover.watch import LaunchWatcher
from synapse.launch import InterruptToStop, RunInterrupted, WorkerFailure, failed_rank_tail, launch_pipeline
from synapse.partitioning import Placement
from synapse.pipeline import LaunchTask
from synapse.rundir import (
    CHECKPOINTS,
    CONTROLLER_STATE,
    LAUNCH_LOGS,
    SEGMENT_RESUME,
    EventLog,
    EventLogError,
    JsonlTail,
    Refusals,
    events_path,
)
from synapse.trackers import NullTracker, Tracker

RETRY = "retry"  # a restart on the same devices: a failure no device can be blamed for (WorkerFailure)


class FailoverError(RuntimeError):
    """The run cannot continue (no device left, restart budget spent); everything finished is saved."""


@dataclass
class Supervisor:
    failover: FailoverConfig  # the restart budget and the re-plan mode
    trainer: TrainerConfig  # the console: the progress bar, the ranks whose lines are shown
    composer: SegmentComposer  # each segment's config (it alone holds the run's whole config)
    run_dir: Path
    controller: FailoverController
    teacher_weights: str
    policy: str  # the policy's and the injection scenario's names, for experiment_summary.json
    injection: str
    log: Callable[[str], None] = print
    segments: list[Segment] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    interrupt: InterruptToStop | None = field(default=None, repr=False)  # set while run() runs
    earlier_restarts: list[dict[str, Any]] = field(default_factory=list)  # by an earlier supervisor of the run

    tracker: Tracker = field(default_factory=NullTracker)  # failover markers for logger=tensorboard|csv
    launch: Callable[..., dict] = launch_pipeline  # across nodes: a failover.multinode.NodeDecider
    control: ControlChannel | None = None  # the running segment's (files, or across nodes the decider's store)
    _event_tail: JsonlTail | None = None
    _events_seen: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events(self) -> EventLog:
        return EventLog(events_path(self.run_dir), source="supervisor")

    def worker_events(self) -> list[dict[str, Any]]:
        """Every event of the run's log so far, read incrementally (workers and the health monitor
        report there: faults fired, checkpoints saved, segments ready, live re-partitions, dead ranks)."""
        if self._event_tail is None:
            self._event_tail = JsonlTail(events_path(self.run_dir), from_start=True, error=EventLogError)
        self._events_seen.extend(self._event_tail.read_new())
        return self._events_seen

    # ---------------------------------------------------------------- the loop
    def run(self, first: Segment, compose: bool = False, adopted: bool = False) -> dict[str, Any]:
        """Run from ``first`` to the end; ``compose``: build even the first segment's config from overrides;
        ``adopted``: ``first`` already runs (a restarted decider across nodes adopts it; its record stands).
        A first Ctrl-C/SIGTERM/SIGHUP stops it at the next step with a checkpoint (``RunInterrupted``)."""
        with InterruptToStop(self._stop_on_interrupt) as self.interrupt, \
                supervised_console(self.run_dir, self.log, self.trainer.progress, self._running_segment):
            return self._run_segments(first, compose, adopted)

    def _running_segment(self) -> tuple[int, Placement] | None:
        """What the progress bar shows as the segment (read from its thread: the newest segment started)."""
        return (self.segments[-1].index, self.segments[-1].placement) if self.segments else None

    def _stop_on_interrupt(self, signal_name: str) -> None:
        """First SIGINT/SIGTERM/SIGHUP (signal handler, main thread): every rank stops after its step in flight."""
        self.log(f"\nsupervisor: {signal_name}: stopping after the current step with a checkpoint (Ctrl-C again to "
                 f"abort now)")
        spec = self.segments[-1]  # a stop, not a decision: the placement stays the running one
        control = self.control or FileControlChannel(self.run_dir)
        control.send(StopRequest(uuid.uuid4().hex, f"interrupt ({signal_name})", spec.start_step, spec.index, "restart",
                                 spec.placement))

    def _run_segments(self, first: Segment, compose: bool, adopted: bool = False) -> dict[str, Any]:
        spec, restart = first, None
        composed = (self.composer.compose(spec, self.worker_events) if compose
                    else self.composer.as_launched(spec, self.worker_events))
        while True:
            self.segments.append(spec)
            if not (adopted and spec is first):
                write_segment(self.run_dir, spec, composed.config, composed.overrides)
            self._mark_segment(spec)
            summary, watcher, failure = self._launch(spec, composed, restart)
            current = self.segments[-1]  # a live re-partition may have started later segments in this launch
            self._finish_segment(current, watcher, failure, summary, restart)
            if failure is None and not (summary or {}).get("stopped_on_request"):
                break
            if summary and summary["steps"] >= summary["total_steps"]:
                break  # a stop requested at the very last step: nothing left to run
            if (signal_name := self._interrupted_by()) is not None:
                return self._end_interrupted(current, summary, signal_name)
            restart = self._plan_restart(current, watcher, failure)
            spec = self._next_segment(current, restart)
            composed = self.composer.compose(spec, self.worker_events)
        self.tracker.close()
        return self._write_summary(summary)

    def _mark_segment(self, spec: Segment) -> None:
        placement = spec.placement
        self.tracker.marker(spec.start_step, "failover/segment",
                            f"segment {spec.index} ({spec.reason}) from step {spec.start_step}: devices "
                            f"{list(placement.devices)}, teacher {list(placement.teacher_counts)} / student "
                            f"{list(placement.student_counts)} blocks")

    def _mark_decision(self, decision: Decision) -> None:
        etas = ", ".join(f"{o.kind.value} {o.eta_s(decision.remaining_steps):.1f} s" for o in decision.options)
        self.tracker.marker(decision.step, "failover/decision",
                            f"{decision.action.value.upper()} at step {decision.step}: {decision.reason} "
                            f"(predicted time to finish: {etas})")

    def _write_summary(self, summary: dict | None) -> dict[str, Any]:
        return write_experiment_summary(self.run_dir, self.policy, self.injection, self.controller, self.segments,
                                        self.restarts, self.started_at, summary or {},
                                        earlier_restarts=self.earlier_restarts)

    def _interrupted_by(self) -> str | None:
        """The signal that asked the run to stop (None: none did, or no handler is set: outside run())."""
        return None if self.interrupt is None else self.interrupt.signal_name

    def _end_interrupted(self, spec: Segment, summary: dict | None, signal_name: str) -> dict[str, Any]:
        self._write_summary(summary)
        saved = ckpt.latest_valid_checkpoint(CHECKPOINTS.path(self.run_dir))
        at = f"a checkpoint of step {saved.step} is in {saved.path}" if saved else "no checkpoint was written"
        raise RunInterrupted(f"interrupted by {signal_name}: segment {spec.index} stopped after step "
                             f"{spec.end_step}; {at}. Continue with the same command and resume=auto")

    def _launch(self, spec: Segment, composed: ComposedSegment, restart: Restart | None):
        segment_cfg = composed.config  # the segment's whole config: carried to the workers
        self.control = open_channel(self.run_dir, control_endpoint(segment_cfg.trainer, segment_cfg.failover),
                                    segment_cfg.trainer.rdzv_timeout_s, launch=spec.index,
                                    refused=Refusals(self.run_dir, source="supervisor", log=self.log))
        self.control.clear()
        if (signal_name := self._interrupted_by()) is not None:  # it came while the segment was being set up
            self._stop_on_interrupt(signal_name)
        self.controller.begin_segment(spec.placement, start_step=spec.start_step,
                                      engine=str(segment_cfg.failover.replica_engine))
        watcher = LaunchWatcher(self.run_dir, spec.index, self.controller, log=self.controller.say,
                               on_live_segment=self._on_live_segment, control=self.control)
        if restart is not None:
            restart.relaunch_time = time.time()
            self.events.append("relaunch", segment=spec.index, devices=spec.devices, partition=spec.partition,
                               resume=spec.resume)
        watcher.start()
        summary, failure = None, None
        try:
            task = LaunchTask(segment_cfg, spec.placement, spec.microbatches, spec.index, self.teacher_weights,
                              spec.resume)
            summary = self.launch(task, self.run_dir, attempt=str(spec.index), log=self.log)
        except WorkerFailure as exc:
            self._show_failed_rank(spec, exc)
            if not (exc.device_failure or exc.retry_same_devices):  # an error in the code: a restart would fail
                # the same way
                watcher.stop()
                self._end_segment_in_error(watcher, exc)
                raise
            failure = exc
        finally:
            watcher.stop()
        if watcher.error is not None:
            error = FailoverError(
                f"the failover controller failed during segment {self.segments[-1].index} at step "
                f"{watcher.error_step}: {type(watcher.error).__name__}: {watcher.error}; the "
                f"workers stopped with a checkpoint at the next step. Fix: continue with resume=auto (report the "
                f"error if it recurs; failover.enabled=false runs without the controller)")
            self._end_segment_in_error(watcher, error)
            raise error from watcher.error
        return summary, watcher, failure

    def _show_failed_rank(self, spec: Segment, failure: WorkerFailure) -> None:
        """The failed rank's last lines, unless they were on the console already (trainer.local_ranks_filter)."""
        shown = self.trainer.local_ranks_filter
        if failure.rank is not None and shown is not None and failure.rank not in shown:
            tail = failed_rank_tail(LAUNCH_LOGS.path(self.run_dir, attempt=str(spec.index)), failure.rank)
            self.log(tail or f"rank {failure.rank} wrote nothing before it failed")

    def _on_live_segment(self, decision: Decision, first_record: dict[str, Any], last_old: dict[str, Any]) -> None:
        """The workers changed their placement without stopping (watcher thread): a live REPLAN moved blocks,
        a live REBALANCE changed the replicas' shares; either way the next segment is recorded here."""
        action = decision.action.value
        old = self.segments[-1]
        old.ended_at, old.end_step, old.outcome = time.time(), int(first_record["step"]) - 1, LIVE_OUTCOMES[action]
        write_segment(self.run_dir, old)
        chosen = decision.chosen
        spec = Segment(old.index + 1, chosen.placement, old.microbatches, reason=f"{action} (live)",
                       start_step=old.end_step)
        self.segments.append(spec)
        composed = self.composer.compose(spec, self.worker_events)
        write_segment(self.run_dir, spec, composed.config, composed.overrides)
        self._mark_decision(decision)
        self._mark_segment(spec)
        self.controller.begin_segment(spec.placement)
        # the workers' own record of the change (pipeline.trainer: live_replan, live_rebalance)
        live = [e for e in self.worker_events() if e["event"] == f"live_{action}" and e.get("segment") == spec.index]
        moved_s = live[-1]["seconds"] if live else 0.0
        restart = Restart(segment=spec.index, action=action,
                          trigger_time=self.controller.decided_at(decision) or time.time(),
                          trigger_step=decision.step, resume_step=old.end_step, cause=decision.reason,
                          decision=decision, trigger="decision", mode="live", last_step_time=last_old["time"])
        warm = float(first_record["step_seconds"]) - self.controller.baseline_step_s
        restart.components = {"launch_s": moved_s, "warmup_s": max(0.0, warm)}
        restart.first_step = int(first_record["step"])
        restart.recovery_s = float(first_record["time"]) - restart.trigger_time
        restart.downtime_s = restart.downtime(first_record, self.controller.baseline_step_s)
        self.restarts.append(restart)
        self.controller.restart_costs.observe("live", restart.components)
        changed = ({"moved_blocks": live[-1]["moved_blocks"] if live else None} if decision.action is OptionKind.REPLAN
                   else {"shares": list(chosen.placement.shares)})
        self.events.append("first_step_after_restart", segment=spec.index, step=restart.first_step, action=action,
                           mode="live", recovery_s=restart.recovery_s, downtime_s=restart.downtime_s,
                           components=restart.components, redo_steps=0, **changed)

    def _finish_segment(self, spec: Segment, watcher: LaunchWatcher, failure: WorkerFailure | None,
                      summary: dict | None, restart: Restart | None) -> None:
        spec.ended_at = time.time()
        spec.end_step = (watcher.last_record or {}).get("step", spec.start_step)
        stopped = (summary or {}).get("stopped_on_request")
        interrupted = self.interrupt is not None and self.interrupt.requested
        spec.outcome = "failed" if failure else (("interrupted" if interrupted else "stopped") if stopped
                                                 else "finished")
        write_segment(self.run_dir, spec)
        self.events.append("segment_ended", segment=spec.index, outcome=spec.outcome, step=spec.end_step,
                           **({"cause": failure.cause, "rank": failure.rank} if failure else {}))
        if restart is not None and watcher.first_record is not None:
            self._measure_restart(restart, watcher.first_record)
        self._save_state()

    def _end_segment_in_error(self, watcher: LaunchWatcher, error: Exception) -> None:
        """The segment's record says how it ended even when the run cannot go on."""
        spec = self.segments[-1]
        spec.ended_at = time.time()
        spec.end_step = (watcher.last_record or {}).get("step", spec.start_step)
        spec.outcome = "error"
        write_segment(self.run_dir, spec)
        self.events.append("segment_ended", segment=spec.index, outcome="error", step=spec.end_step,
                           cause=str(error)[:2000], rank=getattr(error, "rank", None))
        self._save_state()

    # ---------------------------------------------------------------- deciding the restart
    def _plan_restart(self, spec: Segment, watcher: LaunchWatcher, failure: WorkerFailure | None) -> Restart:
        # A live REPLAN moves blocks between running workers: it restarts nothing, so it does not count.
        if sum(r.mode != "live" for r in self.restarts) >= self.failover.max_restarts:
            raise FailoverError(f"segment {spec.index} ended ({failure or 'stop requested'}) but failover.max_restarts="
                                f"{self.failover.max_restarts} restarts are spent; checkpoints are in "
                                f"{CHECKPOINTS.path(self.run_dir)}. Fix: raise failover.max_restarts and rerun with "
                                f"resume=auto")
        end_step, _ = self._end_of(spec)
        total = (watcher.last_record or {}).get("total_steps") or self._total_steps_hint()
        if failure is not None:
            decision, trigger = self._decide_on_failure(spec, watcher, failure, total)
        elif watcher.decision is not None and watcher.decided_at is not None:
            decision, trigger = watcher.decision, watcher.decided_at
        else:  # every other stop ends the run before this (an interrupt returns, a controller failure raises)
            raise FailoverError(f"segment {spec.index} stopped on request but the controller decided nothing; "
                                f"there is no restart to plan")
        cause = failure.cause if failure else decision.reason
        action = decision.action.value
        if failure is not None and failure.rank is None:  # _decide_on_failure kept the devices
            action, cause = RETRY, f"{cause}: {failure}"
        if failure is None and watcher.pending_live is not None:  # the workers refused the live path
            change = "re-partition" if decision.action is OptionKind.REPLAN else decision.action.value
            cause += f"; the live {change} failed, so the workers checkpointed for a restart instead"
        resume = self._resume_checkpoint()
        restart = Restart(segment=spec.index + 1, action=action, trigger_time=trigger,
                          trigger_step=end_step, resume_step=resume.step if resume else 0,
                          cause=cause, decision=decision,
                          resume_path=resume.path if resume else None, trigger="failure" if failure else "decision",
                          last_step_time=(watcher.last_record or {}).get("time"))
        self.restarts.append(restart)
        self._mark_decision(decision)
        if action == RETRY:
            self.events.append("retry_same_devices", segment=restart.segment, devices=list(spec.devices),
                               step=end_step, resume_step=restart.resume_step, why=str(cause)[:2000])
            said = str(failure).splitlines()[0][:300]  # the first line: a failure's message may hold a traceback
            self.log(f"failover: no device can be blamed ({said}); retrying on the same devices "
                     f"{list(spec.devices)} from step {restart.resume_step} (restart "
                     f"{sum(r.mode != 'live' for r in self.restarts)} of failover.max_restarts="
                     f"{self.failover.max_restarts})")
        return restart

    @staticmethod
    def _end_of(spec: Segment) -> tuple[int, float]:
        """The step and the time ``spec`` ended at (``_finish_segment`` sets both before a restart is planned)."""
        if spec.end_step is None or spec.ended_at is None:
            raise FailoverError(f"segment {spec.index} has not ended: a restart is planned only after its end")
        return spec.end_step, spec.ended_at

    def _decide_on_failure(self, spec: Segment, watcher: LaunchWatcher, failure: WorkerFailure,
                           total: int) -> tuple[Decision, float]:
        end_step, ended_at = self._end_of(spec)
        if failure.rank is None and failure.retry_same_devices:
            return self._same_devices(spec, end_step, total, failure), ended_at
        if failure.rank is None or not 0 <= failure.rank < len(spec.devices):
            raise FailoverError(f"a worker failed but its rank is unknown, so no device can be dropped: {failure}. "
                                f"Everything finished is saved in {CHECKPOINTS.path(self.run_dir)}. Fix: rerun "
                                f"with resume=auto (on other devices with trainer.devices if one of these is "
                                f"faulty)") from failure
        device, lost = spec.devices[failure.rank], [spec.devices[r] for r in failure.lost_ranks if r != failure.rank]
        self.log(f"failover: device {device} (rank {failure.rank}) failed: {failure.cause}")
        try:
            decision = self.controller.on_hard_failure(device, end_step, total, failure.cause, lost_with_it=lost)
        except NoViableOptionError as exc:
            raise FailoverError(f"device {device} failed and no device is left to continue on ({exc}); "
                                f"everything finished is saved in {CHECKPOINTS.path(self.run_dir)}. Fix: add "
                                f"devices (trainer.devices / trainer.spare_devices) and rerun with resume=auto"
                                ) from failure
        failed_at = min((e["time"] for e in self.worker_events() if e.get("hard") and e["time"] >= spec.started_at),
                        default=ended_at)
        return decision, failed_at

    def _same_devices(self, spec: Segment, end_step: int, total: int, failure: WorkerFailure) -> Decision:
        """The decision to run on as before: the same placement relaunched (KEEP: no device is to blame)."""
        keep = Option(OptionKind.KEEP, spec.placement, predicted_step_s=self.controller.baseline_step_s or 1.0,
                      restart_cost_s=0.0)
        return Decision(OptionKind.KEEP, keep, (keep,), f"retry on the same devices: {failure.cause}, no device to "
                        f"blame", end_step, max(0, total - end_step))

    def _resume_checkpoint(self) -> ckpt.CheckpointRef | None:
        def skipped(ref, error) -> None:
            self.events.append("checkpoint_skipped", path=str(ref.path), step=ref.step, error=str(error))
            self.log(f"failover: skipping checkpoint {ref.path}: {error}")

        ref = ckpt.latest_valid_checkpoint(CHECKPOINTS.path(self.run_dir), on_skip=skipped)
        if ref is None:  # nothing was saved, so nothing is lost by starting over on the survivors
            self.log("failover: no checkpoint yet; the next segment starts from step 0 (set checkpoint.every=N to "
                     "lose at most N steps to a failure)")
        return ref

    def _next_segment(self, spec: Segment, restart: Restart) -> Segment:
        if restart.decision is None:  # _plan_restart records the decision of every restart it plans
            raise FailoverError(f"restart to segment {restart.segment} has no decision to take its placement from")
        chosen = restart.decision.chosen
        pinned = None if restart.resume_path is None else pin_checkpoint(
            restart.resume_path, SEGMENT_RESUME.path(self.run_dir, segment=restart.segment))
        self.log(f"failover: segment {restart.segment} on devices {list(chosen.devices)}, teacher blocks "
                 f"{list(chosen.teacher_counts)}, student blocks {list(chosen.student_counts)}, from step "
                 f"{restart.resume_step}")
        return Segment(restart.segment, chosen.placement, spec.microbatches, reason=restart.action,
                       resume=None if pinned is None else str(pinned), start_step=restart.resume_step)

    # ---------------------------------------------------------------- measurements
    def _measure_restart(self, restart: Restart, first_record: dict[str, Any]) -> None:
        """Measure the restart's parts from the events the workers wrote, and learn its cost from them."""
        events = self.worker_events()  # what the workers reported; the segment's end is the supervisor's own fact
        ended_at = next((s.ended_at for s in self.segments if s.index == restart.segment - 1), None)
        restart.measure(first_record, events, ended_at, self.controller.baseline_step_s)
        self.controller.restart_costs.observe("restart", restart.components)
        self.events.append("first_step_after_restart", segment=restart.segment, step=restart.first_step,
                           action=restart.action, recovery_s=restart.recovery_s, downtime_s=restart.downtime_s,
                           components=restart.components,
                           redo_steps=max(0, restart.trigger_step - restart.resume_step))

    def _total_steps_hint(self) -> int:
        return max((s.end_step or 0) for s in self.segments)

    def _save_state(self) -> None:
        path = CONTROLLER_STATE.path(self.run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = CONTROLLER_STATE.temp_path(path)
        tmp.write_text(json.dumps(self.controller.state_dict(), default=float))
        os.replace(tmp, path)


def first_segment(placement: Placement, microbatches: int, resume: str | None) -> Segment:
    return Segment(0, placement, microbatches, reason="start", resume=resume)
