"""Deterministic fault injection: "fail at rank r, step s".

Faults come from the ``injection`` config group as a list of specs. Each rank builds a
``FaultInjector`` holding the faults aimed at it; the training code calls ``on(phase, step)``
at fixed points of every step (phases below), and the injector fires each fault exactly when
and where it was configured, once, and records that it fired.

Steps are numbered like the metrics records: step s is the s-th optimizer step of the run
(1-based), so ``step: 5`` fires while the fifth step runs.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

PHASES = ("step_start", "forward", "backward", "send", "optimizer", "checkpoint_write")
FAULT_KINDS = ("raise", "kill")


class InjectionError(ValueError):
    """A fault spec that cannot be injected; the message says what to fix."""


class InjectedFault(RuntimeError):
    """The error an injected ``raise`` fault throws (so tests can tell it from real bugs)."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int
    step: int
    phase: str = "step_start"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise InjectionError(f"fault kind {self.kind!r} is unknown; use one of {', '.join(FAULT_KINDS)}")
        if self.phase not in PHASES:
            raise InjectionError(f"fault phase {self.phase!r} is unknown; use one of {', '.join(PHASES)}")
        if self.rank < 0 or self.step < 1:
            raise InjectionError(f"fault {self.kind} at rank {self.rank}, step {self.step}: ranks start at 0 and "
                                 f"steps at 1")

    @classmethod
    def from_config(cls, spec: Mapping[str, Any]) -> "FaultSpec":
        known = {"kind", "rank", "step", "phase"}
        return cls(kind=spec["kind"], rank=int(spec["rank"]), step=int(spec["step"]),
                   phase=spec.get("phase", "step_start"), params={k: v for k, v in spec.items() if k not in known})


def parse_faults(specs: Sequence[Mapping[str, Any]], world_size: int) -> list[FaultSpec]:
    """Validate every fault against the run's world size before any worker starts."""
    faults = []
    for i, spec in enumerate(specs):
        missing = [k for k in ("kind", "rank", "step") if k not in spec]
        if missing:
            raise InjectionError(f"injection.faults[{i}] lacks {missing}; a fault needs kind, rank and step")
        fault = FaultSpec.from_config(spec)
        if fault.rank >= world_size:
            raise InjectionError(f"injection.faults[{i}] targets rank {fault.rank} but the run has {world_size} "
                                 f"rank(s) (0..{world_size - 1}); pick an existing rank")
        faults.append(fault)
    return faults


class FaultInjector:
    """The faults aimed at one rank, fired at their (phase, step)."""

    def __init__(self, faults: Sequence[FaultSpec], rank: int, record: Callable[[dict], None] | None = None):
        self.pending = [f for f in faults if f.rank == rank]
        self.rank = rank
        self.fired: list[FaultSpec] = []
        self._record = record or (lambda event: None)

    def on(self, phase: str, step: int) -> None:
        for fault in [f for f in self.pending if f.phase == phase and f.step == step]:
            self.pending.remove(fault)  # once per process
            self.fired.append(fault)
            self._record({"event": "fault_injected", "kind": fault.kind, "rank": self.rank, "step": step,
                          "phase": phase})
            _FIRE[fault.kind](fault)


def _raise(fault: FaultSpec) -> None:
    raise InjectedFault(f"injected fault: rank {fault.rank} raises at step {fault.step} ({fault.phase})")


def _kill(fault: FaultSpec) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_FIRE: dict[str, Callable[[FaultSpec], None]] = {"raise": _raise, "kill": _kill}
