"""Deterministic fault injection: "fail at rank r, step s", "slow down rank r from step s".

Faults come from the ``injection`` config group (see ``fault_spec`` for kinds and keys).
Each rank builds a ``FaultInjector`` holding the faults aimed at it
(``build_fault_injector``); the training code calls ``on(phase, step)`` at fixed points of
every step: ``step_start`` (before each step), ``forward`` and ``backward`` (once per
micro-batch), ``send`` (each time the stage posts sends), ``optimizer``, and
``checkpoint_write`` (a checkpoint's files written, not yet committed); and before a launch's first
step each round of the start probe (``slow_probe``: ``slow_compute`` faults slow it as they slow a
task, so a device injected slow from the start reads slow there too). The injector fires
each instant fault exactly when and where it was configured, once per process, and runs each
span fault over its steps; every fault records ``fault_injected`` when it starts acting and
span faults ``fault_cleared`` when they stop (after their end step, or when the worker exits).

Steps are numbered like the metrics records: step s is the s-th optimizer step of the run
(1-based). Hooks called with a step below 1 (evaluation) never fire anything.

A ``nan_loss`` fault does nothing to the process: once fired, ``corrupts_output(step)`` is true
for the rest of that step, and the training code makes the rank's output NaN (the pipeline
runtime, the single-device step), as a device computing garbage would.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from synapse.injection.background_load import BackgroundLoad, prepare_load_target
from synapse.injection.slowdown import DeviceDelay, StageClockLike, TaskBaseline, split_extra, timed
from synapse.injection.spec import (  # noqa: F401
    EVENT_PHASES,
    FAULT_KINDS,
    INSTANT_KINDS,
    PHASES,
    PROBE_PHASE,
    SLOWDOWN_KINDS,
    SPAN_KINDS,
    FaultEntry,
    FaultSpec,
    InjectionError,
    parse_faults,
)
from synapse.rundir import EventLog, events_path

# What a real device failure says (torch >= 2.8 raises torch.AcceleratorError for it).
CUDA_ERROR_MESSAGE = ("CUDA error: an illegal memory access was encountered\n"
                      "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                      "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")


class InjectedFault(RuntimeError):
    """The error an injected ``raise`` fault throws (so tests can tell it from real bugs)."""


class _LoadLike(Protocol):  # the part of BackgroundLoad the injector uses (tests pass fakes)
    @property
    def pids(self) -> list[int]: ...

    def start(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def stop(self) -> None: ...


@dataclass
class _Span:
    spec: FaultSpec
    load: _LoadLike | None = None
    state: str = "waiting"  # waiting -> active -> cleared


class FaultInjector:
    """The faults aimed at one rank, fired at their (phase, step)."""

    def __init__(self, faults: Sequence[FaultSpec], rank: int, record: Callable[[dict], Any] | None = None, *,
                 delay: Callable[..., None] | None = None,
                 load_factory: Callable[[FaultSpec], _LoadLike] | None = None):
        """``record`` receives each event dict; ``delay(seconds, host_only=False)`` slows the device
        (default: ``DeviceDelay`` on CPU); ``load_factory`` spawns the processes of a background_load
        fault (a background_load fault without one is an error)."""
        mine = [f for f in faults if f.rank == rank]
        self.rank = rank
        self.pending = [f for f in mine if f.instant]
        self.fired: list[FaultSpec] = []
        self._corrupted_steps: set[int] = set()  # steps a nan_loss fault fired in
        self.spans = [_Span(f, self._make_load(f, load_factory)) for f in mine if not f.instant]
        self._record = record or (lambda event: None)
        self._delay = delay or DeviceDelay("cpu")
        self._clock: StageClockLike | None = None
        self._last_timing: Callable[[], Mapping[str, float] | None] = dict
        self._baseline = TaskBaseline()
        self._step = 0
        self._closed = False
        if any(span.load for span in self.spans):
            atexit.register(self.close)  # a normal exit stops the loads even without close()

    @staticmethod
    def _make_load(spec: FaultSpec, factory: Callable[[FaultSpec], _LoadLike] | None) -> _LoadLike | None:
        if spec.kind != "background_load":
            return None
        if factory is None:
            raise InjectionError(f"injection.faults[{spec.index}] (background_load) needs a load factory; build "
                                 f"the injector with build_fault_injector(..., device=...)")
        return factory(spec)

    def attach_clock(self, clock: StageClockLike, last_timing: Callable[[], Mapping[str, float] | None]) -> None:
        """Time compute delays in ``clock``'s intervals; ``last_timing()`` gives the per-part seconds
        of the latest step the clock reported, with its ``step`` (what ``factor`` slowdowns scale)."""
        self._clock, self._last_timing = clock, last_timing

    # ---------------------------------------------------------------- the hook
    def on(self, phase: str, step: int, nbytes: int = 0) -> None:
        """``nbytes``: what the task sends (``send`` phase; a bandwidth-like slow link scales with it)."""
        if step < 1 or self._closed:
            return
        if self.spans:
            if step != self._step:
                self._step = step
                self._enter_step(step, phase)
            self._baseline.count_task(phase, step)
            self._slow_down(phase, step, nbytes)
        if self.pending:
            self._fire_instant(phase, step)

    def slow_probe(self, step: int, work_s: float) -> float:
        """The start probe (`synapse.health.speed_probe`) timed one round of its fixed work, ``work_s``
        seconds, before ``step`` (the launch's first): the compute slowdowns acting then with the
        ``probe`` phase (a ``slow_compute`` fault's default) slow the round as they slow a task: a
        ``factor`` f adds (f - 1) x ``work_s``, ``seconds`` its seconds. Returns the seconds added."""
        if step < 1 or self._closed or not self.spans:
            return 0.0
        if step != self._step:  # the faults of the launch's first step start acting now (events, loads)
            self._step = step
            self._enter_step(step, PROBE_PHASE)
        extra = sum(span.spec.extra_seconds(step, work_s) for span in self.spans
                    if span.state == "active" and span.spec.kind == "slow_compute" and PROBE_PHASE in span.spec.phases)
        if extra > 0.0:
            self._delay(extra)
        return extra

    def _fire_instant(self, phase: str, step: int) -> None:
        due = [f for f in self.pending if f.phase == phase
               and (f.step == step or (phase in EVENT_PHASES and f.step <= step))]
        for fault in due:
            self.pending.remove(fault)  # once per process
            self.fired.append(fault)
            self._emit("fault_injected", fault, step, phase)
            if fault.kind == "nan_loss":
                self._corrupted_steps.add(step)  # acted on by the training code: corrupts_output
            else:
                _FIRE[fault.kind](fault)

    def corrupts_output(self, step: int) -> bool:
        """Whether a ``nan_loss`` fault fired in ``step``: the rank's output of that step must be NaN."""
        return step in self._corrupted_steps

    def _enter_step(self, step: int, phase: str) -> None:
        for span in self.spans:
            spec = span.spec
            if span.state == "waiting" and spec.active(step):
                span.state = "active"
                if span.load is not None:
                    span.load.start()
                self._emit("fault_injected", spec, step, phase, **self._load_fields(span))
            elif span.state == "active" and not spec.in_window(step):
                self._clear(span, step, "end_step")
            elif span.state == "active" and span.load is not None:  # intermittent: on/off periods
                if spec.active(step):
                    span.load.resume()
                else:
                    span.load.pause()

    def _slow_down(self, phase: str, step: int, nbytes: int = 0) -> None:
        for span in self.spans:
            spec = span.spec
            if span.state != "active" or spec.kind not in SLOWDOWN_KINDS or phase not in spec.phases:
                continue
            base = self._baseline.per_task(phase, step, self._last_timing())
            extra = spec.extra_seconds(step, sum(base.values()) if base else None, nbytes)
            for part, seconds in split_extra(phase, extra, base).items():
                with timed(self._clock, part):
                    self._delay(seconds, host_only=part == "comm")
                self._baseline.add_injected(step, part, seconds)

    def _clear(self, span: _Span, step: int, reason: str) -> None:
        span.state = "cleared"
        if span.load is not None:
            span.load.stop()
        self._emit("fault_cleared", span.spec, step, None, reason=reason)

    def _emit(self, event: str, spec: FaultSpec, step: int, phase: str | None, **extra: Any) -> None:
        self._record({"event": event, **spec.describe(), "rank": self.rank, "step": step, "phase": phase,
                      "pid": os.getpid(), **extra})

    @staticmethod
    def _load_fields(span: _Span) -> dict[str, Any]:
        if span.load is None:
            return {}
        target = getattr(span.load, "target", None)
        return {"load_pids": list(span.load.pids), "device": getattr(target, "device", None),
                "core": getattr(target, "core", None)}

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop background loads; span faults still acting record ``fault_cleared`` (worker_exit)."""
        if self._closed:
            return
        self._closed = True
        for span in self.spans:
            if span.state == "active":
                self._clear(span, self._step, "worker_exit")
            elif span.load is not None:
                span.load.stop()


def build_fault_injector(faults: Sequence[FaultEntry] | None, rank: int, world_size: int,
                         run_dir: Path | str, device: torch.device | str = "cpu",
                         local_rank: int | None = None) -> FaultInjector:
    """The injector of one worker: events go to ``<run_dir>/failover_events.jsonl``, delays to
    ``device``; a CPU rank with a background_load fault is pinned to its core now (see
    ``background_load``)."""
    specs = parse_faults(faults, world_size)
    device = str(device)
    factory = None
    if any(f.kind == "background_load" and f.rank == rank for f in specs):
        local = int(os.environ.get("LOCAL_RANK", rank)) if local_rank is None else local_rank
        target = prepare_load_target(device, local)

        def factory(spec: FaultSpec) -> BackgroundLoad:
            return BackgroundLoad(target, spec.workers, spec.matrix_size)

    delay = DeviceDelay(device)
    if delay.device.type == "cuda" and any(f.kind == "slow_compute" and f.rank == rank for f in specs):
        delay.cycles_per_second()  # calibrate now, not inside the first slowed task's timing
    return FaultInjector(specs, rank, record=EventLog(events_path(run_dir), source="injector").write,
                         delay=delay, load_factory=factory)


def fired_fault_indices(events: Iterable[Mapping[str, Any]]) -> set[int]:
    """Indices (in injection.faults) of the faults that an event log says were injected: a restarted
    segment can leave those out so that a kill at step s does not fire again after a resume before s."""
    return {int(e["fault_index"]) for e in events if e.get("event") == "fault_injected" and "fault_index" in e}


# ---------------------------------------------------------------- what instant faults do
def _raise(fault: FaultSpec) -> None:
    raise InjectedFault(f"injected fault: rank {fault.rank} raises at step {fault.step} ({fault.phase})")


def _kill(fault: FaultSpec) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hang(fault: FaultSpec) -> None:
    """Stop making progress for good, process alive (signals still end it)."""
    never = threading.Event()
    while True:
        never.wait(3600.0)


def _cuda_error(fault: FaultSpec) -> None:
    error = getattr(torch, "AcceleratorError", RuntimeError)
    raise error(f"{CUDA_ERROR_MESSAGE}\n(injected by synapse: rank {fault.rank}, step {fault.step}, {fault.phase})")


_FIRE: dict[str, Callable[[FaultSpec], None]] = {"raise": _raise, "kill": _kill, "hang": _hang,
                                                 "cuda_error": _cuda_error}
