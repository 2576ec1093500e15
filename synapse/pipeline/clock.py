"""Per-stage compute timing: how long this rank spent in each kind of work during one step.

On CPU an interval is perf_counter time. On CUDA, work is asynchronous, so intervals are
pairs of CUDA events, and a step's events are read at the end of the *next* step
(``read_late``, the default on CUDA): waiting for them then waits for the step before, while
this step's work is queued and the GPU stays busy. Reading them at the step's own end would
need a synchronize there, and the host's work between steps (records, the next batch, the
next launches) would then run while the GPU idles: 8-12 ms of a 120 ms K = 1 step on an H200.
A late step's wall time is then the GPU's, from the event recorded as the step began to the
one recorded as it ended: the GPU reaches the first when it has finished what came before, so
consecutive steps tile its timeline, waits on peers included, while time it spent idle between
steps (an evaluation, a checkpoint) belongs to neither, as on the host clock.

Whatever part of the step's wall time is not compute on this rank is time spent on
communication. Communication is split in two: ``send`` is this rank's own transfer work, the
host time from the moment its stage is asked for its outgoing point-to-point ops until it
hands them over (preparing the ops, and anything that holds this rank's sends back: a slow
link on this rank's side; `TimedPipelineStage` times it). ``wait`` is the rest of the
non-compute time: blocked on receives and send completions, i.e. waiting for peers. A link
slowed on one rank then raises that rank's ``send`` only, while every rank's ``wait`` grows
alike. Host time is the right clock on CUDA too: handing sends over is host work (NCCL runs
them on its own stream, where events on the compute stream could only time the waiting).
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

COMPUTE_PARTS = ("teacher_fwd", "student_fwd", "loss", "student_bwd", "optimizer")
# Own send work, forward activations to the next rank and gradients back to the previous one:
# timed on the host on every device (see the module docstring).
SEND_PARTS = ("send_fwd", "send_bwd")


@dataclass
class _StepMarks:
    """What one step recorded: host-timed totals, and CUDA event pairs not read yet."""

    step: int
    host_start: float
    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    events: list[tuple[str, Any, Any]] = field(default_factory=list)
    start_event: Any = None  # CUDA: recorded at the step's start, and at its end
    end_event: Any = None
    host_end: float = 0.0


def reads_timing_late(choice: str, device: torch.device) -> bool:
    """``pipeline.timing_read`` (auto, at_step, late): whether steps are reported a step late."""
    return device.type == "cuda" if choice == "auto" else choice == "late"


class StageClock:
    def __init__(self, device: torch.device, read_late: bool | None = None):
        """``read_late``: report each step at the end of the next one (default: on CUDA; the CPU
        tests force it to prove the bookkeeping, with host times standing in for events)."""
        self.cuda = device.type == "cuda"
        self.read_late = self.cuda if read_late is None else read_late
        self._current: _StepMarks | None = None
        self._unread: _StepMarks | None = None  # read_late: the finished step not reported yet

    def begin_step(self, step: int = 0) -> None:
        self._current = _StepMarks(step, time.perf_counter())
        if self.cuda:
            self._current.start_event = self._event()

    @contextmanager
    def interval(self, name: str) -> Iterator[None]:
        """Time ``name``. (With replicas the gradients are summed after the step's last backward, outside
        every interval: waiting for the other replicas is waiting, not this rank's compute.)"""
        marks = self._current
        if marks is None:  # outside a step (e.g. a forward for evaluation): nothing to time
            yield
            return
        if self.cuda and name not in SEND_PARTS:
            start = self._event()
            yield
            marks.events.append((name, start, self._event()))
        else:
            t0 = time.perf_counter()
            yield
            marks.totals[name] += time.perf_counter() - t0

    def end_step(self) -> dict[str, Any] | None:
        """The timing of the step this clock reports now: this step's, or with ``read_late`` the
        step before's (None after the first step of a clock)."""
        marks, self._current = self._current, None
        if marks is None:
            return None
        if self.cuda:
            marks.end_event = self._event()
        marks.host_end = time.perf_counter()
        if not self.read_late:
            return self._read(marks)
        previous, self._unread = self._unread, marks
        return None if previous is None else self._read(previous)

    def flush(self) -> dict[str, Any] | None:
        """The finished step not reported yet (``read_late``), e.g. at the end of a launch."""
        marks, self._unread = self._unread, None
        return None if marks is None else self._read(marks)

    def _read(self, marks: _StepMarks) -> dict[str, Any]:
        """Seconds per compute part, the compute total, the step's wall time, its non-compute time
        (comm), comm split into this rank's own sends (send) and waiting on peers (wait), and the
        step they belong to."""
        totals = dict(marks.totals)
        if self.cuda:
            if self.read_late:  # this step's work only, not the next step's queued behind it
                marks.end_event.synchronize()
            else:  # at its end, its sends on NCCL's streams included, as the step's wall time counts them
                torch.cuda.synchronize()
            for name, start, end in marks.events:
                end.synchronize()  # recorded on the stream current then, which may not be the step's
                totals[name] = totals.get(name, 0.0) + start.elapsed_time(end) / 1000.0
        wall = self._wall(marks)
        parts = {name: totals.get(name, 0.0) for name in COMPUTE_PARTS}
        compute = sum(parts.values())
        comm = max(0.0, wall - compute)
        sends = {name: totals.get(name, 0.0) for name in SEND_PARTS}
        send = min(sum(sends.values()), comm)
        return {**parts, "compute": compute, "comm": comm, **sends, "send": send, "wait": comm - send,
                "wall": wall, "step": marks.step}

    def _wall(self, marks: _StepMarks) -> float:
        if not self.read_late:  # read at once: the host waited for the step's end just now
            return time.perf_counter() - marks.host_start
        if self.cuda:
            return marks.start_event.elapsed_time(marks.end_event) / 1000.0
        return marks.host_end - marks.host_start

    @staticmethod
    def _event() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
