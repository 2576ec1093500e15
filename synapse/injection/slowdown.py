"""How a slowdown fault adds time to a task, and how long a task takes without it.

A ``slow_compute`` delay runs inside the stage clock's interval of the task it slows
(``teacher_fwd``/``student_fwd``/``loss`` for a forward, ``student_bwd`` for a backward),
so it is this rank's *compute* time in performance.jsonl, exactly as a slower device's
would be. On CPU the delay is a host sleep; on CUDA it is a GPU spin kernel
(``torch.cuda._sleep``) on the current stream: the device is busy for that long, stream
order is kept, and the clock's CUDA events time it like any kernel. A ``slow_comm`` delay
is a host sleep before the sends are posted, outside every interval, so it is comm time.

A ``factor`` slowdown needs the task's own time: ``TaskBaseline`` takes the per-part seconds of
the latest step the stage clock reported (``PipelineRuntime.last_timing``: the step before, or
on CUDA the one before that), removes what was injected in that step, and divides by the
number of tasks of that phase the step ran.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import torch

# Which stage-clock parts make up one task of each phase (see synapse/pipeline/clock.py).
PHASE_PARTS = {"forward": ("teacher_fwd", "student_fwd", "loss"), "backward": ("student_bwd",), "send": ("comm",)}
MAIN_PART = {"forward": "student_fwd", "backward": "student_bwd", "send": "comm"}


class StageClockLike(Protocol):
    def interval(self, name: str) -> AbstractContextManager[None]: ...


class TaskBaseline:
    """Per-task seconds of this rank in the step before, without the delays injected in it."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[int, str], int] = defaultdict(int)
        self._injected: dict[tuple[int, str], float] = defaultdict(float)

    def count_task(self, phase: str, step: int) -> None:
        self._tasks[(step, phase)] += 1
        self._forget_before(step - 2)  # a clock read late reports two steps back

    def add_injected(self, step: int, part: str, seconds: float) -> None:
        self._injected[(step, part)] += seconds

    def per_task(self, phase: str, step: int, last_timing: Mapping[str, float] | None) -> dict[str, float] | None:
        """Seconds per part of one ``phase`` task in the step ``last_timing`` is of (its ``step``,
        else ``step - 1``); None when not measured."""
        if not last_timing:
            return None
        measured = int(last_timing.get("step", step - 1))
        tasks = self._tasks.get((measured, phase), 0)
        parts = PHASE_PARTS[phase]
        if tasks == 0 or not all(part in last_timing for part in parts):
            return None
        return {part: max(0.0, last_timing[part] - self._injected.get((measured, part), 0.0)) / tasks
                for part in parts}

    def _forget_before(self, step: int) -> None:
        for table in (self._tasks, self._injected):
            for key in [k for k in table if k[0] < step]:
                del table[key]


def split_extra(phase: str, extra: float, base: Mapping[str, float] | None) -> dict[str, float]:
    """Spread ``extra`` seconds over the phase's parts in proportion to their measured time
    (a slower device is slower at the teacher and the student alike); unmeasured: the main part."""
    total = sum(base.values()) if base else 0.0
    if extra <= 0.0:
        return {}
    if total <= 0.0:
        return {MAIN_PART[phase]: extra}
    return {part: extra * seconds / total for part, seconds in base.items() if seconds > 0.0}


class DeviceDelay:
    """Keeps this rank's device busy for a number of seconds (host sleep on CPU, spin kernel on CUDA)."""

    def __init__(self, device: torch.device | str = "cpu", sleep: Callable[[float], None] = time.sleep):
        self.device = torch.device(device)
        self._sleep = sleep
        self._cycles_per_s: float | None = None

    def __call__(self, seconds: float, host_only: bool = False) -> None:
        """Busy the device for ``seconds``; ``host_only``: just hold this thread (delays a send)."""
        if seconds <= 0.0:
            return
        if host_only or self.device.type != "cuda":
            self._sleep(seconds)
            return
        torch.cuda._sleep(max(1, int(seconds * self.cycles_per_second())))

    def cycles_per_second(self) -> float:
        """GPU clock cycles per second of ``torch.cuda._sleep``, measured once (the clock boosts)."""
        if self._cycles_per_s is None:
            cycles = 20_000_000
            torch.cuda._sleep(cycles)  # warm-up: module load, clocks up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            self._cycles_per_s = cycles / (start.elapsed_time(end) / 1000.0)
        return self._cycles_per_s


def timed(clock: StageClockLike | None, part: str) -> AbstractContextManager[None]:
    """The stage clock's interval for ``part`` (comm and an absent clock: none)."""
    if clock is None or part == "comm":
        return nullcontext()
    return clock.interval(part)
