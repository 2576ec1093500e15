"""The supervisor's eyes during a launch: tail performance.jsonl and let the controller decide.

A thread reads the records the last rank appends (one per step, flushed per line), feeds
those of the running segment to the controller, and on the first non-KEEP decision sends the
stop request (``synapse.control``) every rank acts on after its next step. Reading a file keeps the
workers' hot path free of anything the controller does (planning takes milliseconds,
a worker must not wait for it).
"""
from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from synapse.control import ControlChannel, FileControlChannel, StopRequest
from synapse.decision import Decision
from synapse.failover.controller import FailoverController
from synapse.rundir import PERFORMANCE, EventLog, JsonlTail, events_path


class LaunchWatcher(threading.Thread):
    def __init__(self, run_dir: Path, segment: int, controller: FailoverController, *, period_s: float = 0.05,
                 log: Callable[[str], None] = print,
                 on_live_segment: Callable[[Decision, dict[str, Any], dict[str, Any]], None] | None = None,
                 control: ControlChannel | None = None):
        """What the running workers take in place, without a stop, the controller says (``takes_live``);
        ``on_live_segment`` is called with the decision, the first record of the segment it started and the
        last of the one before."""
        super().__init__(name=f"synapse-watch-{segment}", daemon=True)
        self.run_dir, self.segment, self.controller = Path(run_dir), segment, controller
        self.period_s, self.log = period_s, log
        self.decision: Decision | None = None
        self.decided_at: float | None = None
        self.first_record: dict[str, Any] | None = None
        self.last_record: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.error_step: int | None = None  # the step whose record the controller failed on
        self.on_live_segment = on_live_segment
        self.pending_live: Decision | None = None
        self._done = threading.Event()
        self.control = control or FileControlChannel(self.run_dir)  # the segment's (control.open_channel)
        # records already in the file belong to earlier launches (or an earlier run in this dir)
        self._records = JsonlTail(PERFORMANCE.path(self.run_dir))

    def stop(self) -> None:
        """Read what is left, then end the thread."""
        self._done.set()
        self.join()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                self._poll()
                self._keep_request()
                self._done.wait(self.period_s)
            self._poll()
        except BaseException as exc:  # the supervisor raises it once the workers have stopped
            self.error = exc
            if not self._done.is_set():
                self._fail_safe(exc)

    def _keep_request(self) -> None:
        """A request overwritten on the store by someone else goes back before rank 0 looks again
        (synapse.control); the store being gone is the launch's to report, not the watcher's."""
        with contextlib.suppress(RuntimeError, OSError):
            self.control.keep()

    def _fail_safe(self, exc: BaseException) -> None:
        """The controller broke mid-segment: without it no slowdown or failure would be acted on, so
        say so now (console and event log) and have every rank stop after its next step with a
        checkpoint, instead of training on unprotected until the launch ends."""
        step = self.error_step = (self.last_record or {}).get("step")
        self.log(f"failover: the controller failed at step {step} ({type(exc).__name__}: {exc}); failover cannot "
                 f"go on, so the workers stop after the next step with a checkpoint (continue with resume=auto)")
        with contextlib.suppress(Exception):  # the event is a record of the failure, never a second one
            EventLog(events_path(self.run_dir), source="supervisor").append(
                "controller_failed", segment=self.segment, step=step, error=f"{type(exc).__name__}: {exc}"[:2000])
        # The placement stays the running one: a stop, not a decision.
        self.control.send(StopRequest(uuid.uuid4().hex, "controller_failed", int(step or 0), self.segment, "restart",
                                      self.controller.running_placement))

    def _poll(self) -> None:
        for record in self._records.read_new():
            segment = record.get("segment", -1)
            if segment < self.segment:
                continue  # an earlier launch's lines
            if segment > self.segment:  # the workers changed their placement live: a new segment began
                if self.on_live_segment is None or self.pending_live is None or self.last_record is None:
                    raise RuntimeError(f"segment {segment} began live during segment {self.segment}, but no live "
                                       f"change was asked for (or nothing told of it)")
                self.on_live_segment(self.pending_live, record, self.last_record)
                self.segment, self.decision, self.pending_live = segment, None, None
            self.first_record = self.first_record or record
            self.last_record = record
            if self.decision is not None or self.error is not None:
                continue  # stop already requested: keep the timings, decide nothing more
            try:
                decision = self.controller.observe(record)
            except Exception as exc:  # noqa: BLE001  (any bug in the controller: stop safely, now)
                self.error = exc
                self._fail_safe(exc)
                continue
            if decision is not None:
                self._act(decision)

    def _act(self, decision: Decision) -> None:
        self.decision, self.decided_at = decision, time.time()
        chosen = decision.chosen
        live = self.controller.takes_live(decision.action, chosen.placement)
        self.control.send(StopRequest(uuid.uuid4().hex, decision.action.value, decision.step, self.segment,
                                      "live" if live else "restart", chosen.placement))
        if live:
            self.pending_live = decision
        how = "live, the workers keep running" if live else "stop, checkpoint and restart"
        self.log(f"failover: {decision.action.value.upper()} at step {decision.step} ({how}): {decision.reason}")
