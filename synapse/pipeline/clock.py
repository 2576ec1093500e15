"""Per-stage compute timing: how long this rank spent in each kind of work during one step.

On CPU an interval is perf_counter time. On CUDA, work is asynchronous, so intervals are
pairs of CUDA events read once per step after a synchronize (one sync per step, which the
step already pays to report its time). Whatever part of the step's wall time is not compute
on this rank is time spent on communication.

Communication is split in two: ``send`` is this rank's own transfer work, the host time from
the moment its stage is asked for its outgoing point-to-point ops until it hands them over
(preparing the ops, and anything that holds this rank's sends back: a slow link on this
rank's side; `TimedPipelineStage` times it). ``wait`` is the rest of the non-compute time:
blocked on receives and send completions, i.e. waiting for peers. A link slowed on one rank
then raises that rank's ``send`` only, while every rank's ``wait`` grows alike. Host time is
the right clock on CUDA too: handing sends over is host work (NCCL runs them on its own
stream, where events on the compute stream could only time the waiting).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch

COMPUTE_PARTS = ("teacher_fwd", "student_fwd", "loss", "student_bwd", "optimizer")
# Own send work, forward activations to the next rank and gradients back to the previous one:
# timed on the host on every device (see the module docstring).
SEND_PARTS = ("send_fwd", "send_bwd")


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
        if self.cuda and name not in SEND_PARTS:
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
        """Seconds per compute part, the compute total, the step's wall time, its non-compute time
        (comm), and comm split into this rank's own sends (send) and waiting on peers (wait)."""
        if self.cuda:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self._totals[name] += start.elapsed_time(end) / 1000.0
        wall = time.perf_counter() - self._step_start
        parts = {name: self._totals.get(name, 0.0) for name in COMPUTE_PARTS}
        compute = sum(parts.values())
        comm = max(0.0, wall - compute)
        sends = {name: self._totals.get(name, 0.0) for name in SEND_PARTS}
        send = min(sum(sends.values()), comm)
        return {**parts, "compute": compute, "comm": comm, **sends, "send": send, "wait": comm - send, "wall": wall}
