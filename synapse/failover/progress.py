"""The run's one progress bar, drawn by the supervisor from the records the workers write.

Pipeline workers draw no bar of their own (each would be another process writing to the same
terminal); the last rank appends a record per step to ``metrics.jsonl`` (loss, images/s, and
each evaluation) and ``performance.jsonl`` (the schedule's length). ``RunProgress`` tails both
and shows steps, loss, images/s, the last validation top-1, the time left and the running
segment with its partition.

On a terminal it is one line at the bottom that redraws in place: every other line written
meanwhile (the supervisor's log, the workers' lines torch's agent copies to the console, warnings)
goes through ``ConsoleBar`` so that it lands above the bar, never inside it. Anywhere else (a
pipe, a submitit or Slurm ``.err`` file) a redrawn line would be a new line per refresh, so the
progress is a few plain log lines instead, one per quarter of the run.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from synapse.engine import ConsoleBar, Milestones, StepRate, is_terminal, lines_above, progress_text
from synapse.partitioning import Placement
from synapse.rundir import METRICS, PERFORMANCE, JsonlTail, RecordFileError


class RunProgress(threading.Thread):
    """Tails the run's records and draws the bar (terminal) or logs a plain line per quarter (elsewhere).

    ``segment``: the running segment's index and placement (the supervisor's newest segment), or None
    where no supervisor knows it (the segment number then comes from the records)."""

    def __init__(self, run_dir: Path, log: Callable[[str], None], bar: ConsoleBar | None,
                 segment: Callable[[], tuple[int, Placement] | None] = lambda: None, period_s: float = 0.2):
        super().__init__(name="synapse-progress", daemon=True)
        self.bar, self.log, self.segment, self.period_s = bar, log, segment, period_s
        self._metrics = JsonlTail(METRICS.path(run_dir))
        self._performance = JsonlTail(PERFORMANCE.path(run_dir))
        self._rate = StepRate()
        self.step, self.total, self.record_segment = 0, 0, None
        self.loss: float | None = None
        self.images_per_s: float | None = None
        self.val_top1: float | None = None
        self._milestones: Milestones | None = None
        self._first_step: int | None = None  # of this supervisor (a resumed run starts past 0)
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._poll()  # the records of the last steps

    def run(self) -> None:
        while not self._done.wait(self.period_s):
            try:
                self._poll()
            except RecordFileError:  # a torn record the workers will rewrite; the bar waits a refresh
                continue

    def _poll(self) -> None:
        for record in self._performance.read_new():
            self.total = int(record.get("total_steps") or self.total)
            self.record_segment = record.get("segment", self.record_segment)
        moved = False
        for record in self._metrics.read_new():
            moved |= self._take(record)
        if moved:
            self._report()

    def _take(self, record: dict[str, Any]) -> bool:
        if record.get("kind") == "eval":
            self.val_top1 = record.get("student_top1", self.val_top1)
            return True
        if record.get("kind") != "train":
            return False
        self.step, self.loss = int(record["step"]), record.get("loss")
        self._first_step = self.step if self._first_step is None else self._first_step
        self.images_per_s = record.get("images_per_s")
        self._rate.add(self.step, float(record.get("time", time.time())))
        return True

    def eta_s(self) -> float | None:
        """Steps left times the recent wall time per step (what the records show, evaluations included)."""
        return self._rate.eta_s(self.step, self.total)

    def text(self) -> str:
        return progress_text(self.step, self.total, loss=self.loss, images_per_s=self.images_per_s,
                             eta_s=self.eta_s(), val_top1=self.val_top1, prefix=self._segment_text())

    def _segment_text(self) -> str:
        known = self.segment()
        if known is None:
            return "" if self.record_segment is None else f"segment {self.record_segment}"
        index, placement = known
        return (f"segment {index} on {list(placement.devices)}: teacher {list(placement.teacher_counts)} / "
                f"student {list(placement.student_counts)}")

    def _report(self) -> None:
        if self.bar is not None:
            self.bar.show(self.text())
            return
        if self._milestones is None and self.total:
            self._milestones = Milestones(self.total, start_step=max(0, (self._first_step or 1) - 1))
        if self._milestones is not None and self._milestones.reached(self.step):
            self.log(self.text())


AGENT_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")


@contextlib.contextmanager
def agent_logs_to_run_log() -> Iterator[None]:
    """torch's elastic agent logs each worker it terminates and the traceback of the one that died,
    ~10 lines a failure, to stderr. The supervisor says what failed and prints that rank's last lines,
    so while it runs those records go to the run's log file (train.log) only."""
    files: list[logging.Handler] = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    saved = []
    for name in AGENT_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate, list(logger.handlers)))
        logger.propagate = False
        logger.handlers = files or [logging.NullHandler()]
    try:
        yield
    finally:
        for logger, propagate, handlers in saved:
            logger.propagate, logger.handlers = propagate, handlers


@contextlib.contextmanager
def supervised_console(run_dir: Path, log: Callable[[str], None], enabled: bool = True,
                       segment: Callable[[], tuple[int, Placement] | None] = lambda: None,
                       stream: TextIO | None = None) -> Iterator[RunProgress | None]:
    """The console while workers run: torch's agent logs to the run's log file only
    (``agent_logs_to_run_log``), and the run's progress: a bar when both stdout and stderr are a
    terminal (``stream``: where it is drawn, sys.stderr by default), else a plain line per quarter
    through ``log``; no progress when ``enabled`` is false (``trainer.progress=false``)."""
    if not enabled:
        with agent_logs_to_run_log():
            yield None
        return
    stream = stream or sys.stderr
    terminal = is_terminal(stream) and is_terminal(sys.stdout) and os.environ.get("TERM") != "dumb"
    bar = ConsoleBar(stream) if terminal else None
    progress = RunProgress(run_dir, log, bar, segment)
    progress.start()
    try:
        with agent_logs_to_run_log(), lines_above(bar) if bar is not None else contextlib.nullcontext():
            try:
                yield progress
            finally:
                progress.stop()
    finally:
        if bar is not None:
            bar.close()
