"""Per-stage compute timing: how long this rank spent in each kind of work during one step.

On CPU an interval is perf_counter time. On CUDA, work is asynchronous, so intervals are
pairs of CUDA events read once per step after a synchronize (one sync per step, which the
step already pays to report its time). Whatever part of the step's wall time is not compute
on this rank is time spent waiting on communication (including waiting for a slow peer).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch

COMPUTE_PARTS = ("teacher_fwd", "student_fwd", "loss", "student_bwd", "optimizer")


class StageClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._totals: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._step_start = 0.0

    def begin_step(self) -> None:
        self._totals.clear()
        self._events.clear()
        self._step_start = time.perf_counter()

    @contextmanager
    def interval(self, name: str) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._totals[name] += time.perf_counter() - t0

    def end_step(self) -> dict[str, float]:
        """Seconds per compute part, the step's wall time, the compute total and the waiting time."""
        if self.cuda:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self._totals[name] += start.elapsed_time(end) / 1000.0
        wall = time.perf_counter() - self._step_start
        parts = {name: self._totals.get(name, 0.0) for name in COMPUTE_PARTS}
        compute = sum(parts.values())
        return {**parts, "compute": compute, "comm": max(0.0, wall - compute), "wall": wall}
