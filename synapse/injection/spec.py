"""What a configured fault is, and when it acts: parsing, validation and the pure schedule.

Two families of faults (``injection.faults`` in the config, one mapping per fault):

* *instant* faults fire once, at one (phase, step): ``raise``, ``kill`` (SIGKILL),
  ``hang`` (block forever, process alive), ``cuda_error`` (a RuntimeError that reads like a
  device failure). Config: ``{kind: kill, rank: 1, step: 60, phase: forward}``.
  ``nan_loss`` makes the rank's student output NaN in every forward of one step (a device that
  computes garbage), so that step's loss is NaN: ``{kind: nan_loss, rank: 1, step: 60}``
  (phase: forward only). What the run then does is ``trainer.nonfinite`` (stop or skip).
  ``phase: repartition`` fires in the first live re-partition at or after ``step`` (a failing
  live REPLAN: ``{kind: raise, rank: 1, step: 1, phase: repartition}``).
* *span* faults act over the steps ``[start, end]`` (``end`` inclusive, omitted: to the end
  of the run): ``slow_compute`` (extra time per forward/backward task), ``slow_comm``
  (extra time each time the rank hands its sends over: a slow link on its side) and ``background_load`` (a separate
  process contending for the rank's device). Config:
  ``{kind: slow_compute, rank: 2, start: 30, end: 90, factor: 2.0}``.

A slowdown is either fixed (``seconds`` extra per task) or relative (``factor``: extra =
(factor - 1) x the rank's own measured time of the task). A ``slow_comm`` fault may instead
be a bandwidth-limited link (``bytes_per_s``: each send waits its bytes / bytes_per_s), whose
cost then depends on where the cuts are, as a real slow link's does. ``ramp_steps: N`` raises it
linearly from nothing at ``start`` to full strength N steps later (a ramp to factor f over
[start, end] is ``ramp_steps: end - start``). ``on_steps``/``off_steps`` make any span fault
intermittent: on for ``on_steps`` steps, off for ``off_steps``, repeating from ``start``.

Steps are 1-based optimizer steps, like the metrics records. Everything here is pure.

Which faults a later launch still injects, and on which of its ranks
(`faults_for_segment`): a fault in ``injection.faults`` names a rank of the run as the
user started it; what it models is a *device* (that rank's device) misbehaving. After a
restart the devices may be renumbered (DEGRADE drops one, REPLACE swaps one), so each
fault follows its device to the rank that now runs it, and disappears with the device. An
instant fault (kill, hang, ...) that already fired stays fired: resuming from a checkpoint
taken before its step must not kill the device a second time. Pure.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # any dataclass instance: exists for the type checker only

# One fault as the config gives it: a mapping (YAML, tests) or the typed config's FaultSettings, a
# dataclass this package cannot name (config sits above injection).
FaultEntry: TypeAlias = "Mapping[str, Any] | DataclassInstance"

PHASES = ("step_start", "forward", "backward", "send", "optimizer", "checkpoint_write", "repartition")
# Phases that happen when something is decided, not at a step known in advance: an instant fault
# there fires at the first occurrence at or after its step (a live re-partition's transfer).
EVENT_PHASES = ("repartition",)
INSTANT_KINDS = ("raise", "kill", "hang", "cuda_error", "nan_loss")
SLOWDOWN_KINDS = ("slow_compute", "slow_comm")
SPAN_KINDS = (*SLOWDOWN_KINDS, "background_load")
FAULT_KINDS = (*INSTANT_KINDS, *SPAN_KINDS)

# Not a step's phase: each round of a launch's start probe, before its first step
# (`FaultInjector.slow_probe`). A compute slowdown slows it as it slows a task: a device slow from
# the start is slow on the probe's fixed work too, which is how such a device is told from a heavy stage.
PROBE_PHASE = "probe"
# The phases each span kind may act in (all of them by default).
SPAN_PHASES = {"slow_compute": ("forward", "backward", PROBE_PHASE), "slow_comm": ("send",),
               "background_load": ("step_start",)}
# Instant kinds that act in fewer phases than PHASES (nan_loss corrupts a forward's output).
INSTANT_PHASES: dict[str, tuple[str, ...]] = {"nan_loss": ("forward",)}

# fault_id: the fault's index in the user's list, kept when a restarted segment renumbers ranks or
# leaves fired faults out (events and "fired once" are keyed by it).
_COMMON_KEYS = ("kind", "rank", "phase", "fault_id")
_KEYS = {
    **{kind: (*_COMMON_KEYS, "step") for kind in INSTANT_KINDS},
    **{kind: (*_COMMON_KEYS, "step", "start", "end", "seconds", "factor", "ramp_steps", "on_steps", "off_steps")
       for kind in SLOWDOWN_KINDS},
    "slow_comm": (*_COMMON_KEYS, "step", "start", "end", "seconds", "factor", "bytes_per_s", "ramp_steps",
                  "on_steps", "off_steps"),
    "background_load": (*_COMMON_KEYS, "step", "start", "end", "on_steps", "off_steps", "workers", "matrix_size"),
}
_EXAMPLES = {
    "raise": "{kind: raise, rank: 1, step: 3}",
    "kill": "{kind: kill, rank: 1, step: 60, phase: forward}",
    "hang": "{kind: hang, rank: 1, step: 60, phase: backward}",
    "cuda_error": "{kind: cuda_error, rank: 1, step: 60, phase: forward}",
    "nan_loss": "{kind: nan_loss, rank: 2, step: 60}",
    "slow_compute": "{kind: slow_compute, rank: 2, start: 30, factor: 2.0} or {..., seconds: 0.05}",
    "slow_comm": "{kind: slow_comm, rank: 1, start: 30, end: 80, seconds: 0.02} or {..., bytes_per_s: 2.0e6}",
    "background_load": "{kind: background_load, rank: 2, start: 30, end: 90, workers: 1}",
}


class InjectionError(ValueError):
    """A fault spec that cannot be injected; the message names the fault and says what to fix."""


@dataclass(frozen=True)
class FaultSpec:
    """One validated fault. ``index`` is its position in ``injection.faults`` (events name it)."""

    kind: str
    rank: int
    start: int
    end: int | None = None  # inclusive; instant faults: == start
    phases: tuple[str, ...] = ("step_start",)
    seconds: float | None = None  # slowdowns: fixed extra seconds per task
    factor: float | None = None  # slowdowns: task time x factor
    bytes_per_s: float | None = None  # slow_comm: a link this fast (each send waits bytes / bytes_per_s)
    ramp_steps: int | None = None  # slowdowns: linear rise over this many steps from start
    on_steps: int | None = None  # span faults: intermittent on/off periods (steps)
    off_steps: int | None = None
    workers: int = 1  # background_load: contending processes
    matrix_size: int = 4096  # background_load on a GPU: side of the multiplied matrices
    index: int = 0
    fault_id: int | None = None  # the index in the user's original list (None: ``index``)

    @property
    def step(self) -> int:
        """The step an instant fault fires at (the first step of a span fault)."""
        return self.start

    @property
    def phase(self) -> str:
        return self.phases[0]

    @property
    def instant(self) -> bool:
        return self.kind in INSTANT_KINDS

    def in_window(self, step: int) -> bool:
        """Whether ``step`` lies in [start, end], on- or off-period alike."""
        return self.start <= step and (self.end is None or step <= self.end)

    def active(self, step: int) -> bool:
        """Whether the fault acts during ``step`` (in its window and, if intermittent, in an on-period)."""
        if not self.in_window(step):
            return False
        if self.on_steps is None:
            return True
        if self.off_steps is None:  # parsing sets both or neither
            raise ValueError(f"fault {self.index} has on_steps but no off_steps")
        return (step - self.start) % (self.on_steps + self.off_steps) < self.on_steps

    def level(self, step: int) -> float:
        """Strength in [0, 1] during ``step``: 0 when inactive, the ramp's fraction while ramping, else 1."""
        if not self.active(step):
            return 0.0
        if self.ramp_steps is None:
            return 1.0
        return min(1.0, (step - self.start) / self.ramp_steps)

    def effective_factor(self, step: int) -> float:
        """The slowdown factor in force during ``step`` (1.0: none); only for ``factor`` slowdowns."""
        return 1.0 + (self.factor - 1.0) * self.level(step) if self.factor is not None else 1.0

    def extra_seconds(self, step: int, task_seconds: float | None, nbytes: int = 0) -> float:
        """Seconds to add to one task of ``step``; ``task_seconds`` is its measured time (None: unknown),
        ``nbytes`` what the task sends (a ``bytes_per_s`` link)."""
        level = self.level(step)
        if level == 0.0:
            return 0.0
        if self.seconds is not None:
            return self.seconds * level
        if self.bytes_per_s is not None:
            return level * nbytes / self.bytes_per_s
        if task_seconds is None:
            return 0.0  # nothing measured yet (validation keeps factor faults off step 1)
        return (self.effective_factor(step) - 1.0) * max(0.0, task_seconds)

    def describe(self) -> dict[str, Any]:
        """The fault's settings as plain data (event records carry them)."""
        fields = {"kind": self.kind, "rank": self.rank,
                  "fault_index": self.index if self.fault_id is None else self.fault_id}
        if self.instant:
            return {**fields, "step": self.start, "phase": self.phase}
        fields.update(start=self.start, end=self.end, phases=list(self.phases))
        for name in ("seconds", "factor", "bytes_per_s", "ramp_steps", "on_steps", "off_steps"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.kind == "background_load":
            fields.update(workers=self.workers, matrix_size=self.matrix_size)
        return fields

    @classmethod
    def from_config(cls, spec: Mapping[str, Any], index: int = 0) -> FaultSpec:
        return _SpecReader(spec, index).read()


def parse_faults(specs: Sequence[FaultEntry] | None, world_size: int) -> list[FaultSpec]:
    """Validate every fault against the run's world size before any worker starts."""
    faults = []
    for i, spec in enumerate(specs or []):
        # the typed config's FaultSettings, or a mapping
        entry = dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) and not isinstance(spec, type) else spec
        if not isinstance(entry, Mapping):  # a DictConfig is one too
            raise InjectionError(f"injection.faults[{i}] is {spec!r}, not a mapping; write each fault as "
                                 f"{_EXAMPLES['raise']}")
        fault = FaultSpec.from_config(entry, index=i)
        if fault.rank >= world_size:
            raise InjectionError(f"injection.faults[{i}] targets rank {fault.rank} but the run has {world_size} "
                                 f"rank(s) (0..{world_size - 1}); pick an existing rank")
        faults.append(fault)
    return faults


class _SpecReader:
    """Reads one fault mapping; every error names the fault's index and the fix."""

    def __init__(self, spec: Mapping[str, Any], index: int):
        # An unset key (None, as the typed config node holds every key) is a key not given.
        self.spec, self.index = {str(k): v for k, v in spec.items() if v is not None}, index
        # The kind is checked first (every other check depends on it), so the reader's kind is a known one.
        kind = self.spec.get("kind")
        if not isinstance(kind, str) or kind not in FAULT_KINDS:
            self.fail(f"kind {kind!r} is unknown" if "kind" in self.spec else "no kind given",
                      f"use one of {', '.join(FAULT_KINDS)}")
        self.kind: str = kind

    def fail(self, problem: str, fix: str) -> NoReturn:
        given_kind = self.spec.get("kind")
        what = f" ({given_kind})" if given_kind in FAULT_KINDS else ""
        raise InjectionError(f"injection.faults[{self.index}]{what}: {problem}; {fix}")

    def read(self) -> FaultSpec:
        unknown = sorted(set(self.spec) - set(_KEYS[self.kind]))
        if unknown:
            self.fail(f"unknown key(s) {unknown}", f"a {self.kind} fault takes {', '.join(_KEYS[self.kind])}, "
                                                   f"e.g. {_EXAMPLES[self.kind]}")
        if "rank" not in self.spec:
            self.fail("no rank given", f"add rank: R, e.g. {_EXAMPLES[self.kind]}")
        rank = self.integer("rank", minimum=0)
        spec = self.read_instant(rank) if self.kind in INSTANT_KINDS else self.read_span(rank)
        if "fault_id" in self.spec:
            return dataclasses.replace(spec, fault_id=self.integer("fault_id", minimum=0))
        return spec

    def read_instant(self, rank: int) -> FaultSpec:
        if "step" not in self.spec:
            self.fail("no step given",
                      f"an instant fault fires once: add step: N (1-based), e.g. {_EXAMPLES[self.kind]}")
        allowed = INSTANT_PHASES.get(self.kind, PHASES)
        phases = self.phases(allowed, default=allowed[:1] if self.kind in INSTANT_PHASES else ("step_start",))
        if len(phases) != 1:
            self.fail(f"phase {list(phases)} names several phases", "an instant fault fires in one phase")
        return FaultSpec(self.kind, rank, self.integer("step", minimum=1), phases=phases, index=self.index)

    def read_span(self, rank: int) -> FaultSpec:
        if ("step" in self.spec) == ("start" in self.spec):
            self.fail("give either start (with an optional end) or step (a single step)",
                      f"e.g. {_EXAMPLES[self.kind]}")
        if "step" in self.spec and "end" in self.spec:
            self.fail("step is a single step and takes no end", "write start: S, end: E for a range of steps")
        start = self.integer("start" if "start" in self.spec else "step", minimum=1)
        end = start if "step" in self.spec else self.optional_integer("end", minimum=start)
        on, off = self.optional_integer("on_steps", 1), self.optional_integer("off_steps", 1)
        if (on is None) != (off is None):
            self.fail("on_steps and off_steps go together", "give both, e.g. on_steps: 10, off_steps: 10")
        span = FaultSpec(self.kind, rank, start, end=end, on_steps=on, off_steps=off, index=self.index,
                         phases=self.phases(SPAN_PHASES[self.kind], default=SPAN_PHASES[self.kind]))
        if self.kind == "background_load":
            return dataclasses.replace(span, workers=self.integer("workers", 1, default=1),
                                       matrix_size=self.integer("matrix_size", 64, default=4096))
        return dataclasses.replace(span, **self.slowdown(start, span.phases))

    def slowdown(self, start: int, phases: tuple[str, ...]) -> dict[str, Any]:
        given = [key for key in ("seconds", "factor", "bytes_per_s") if key in self.spec]
        if len(given) != 1:
            link = " or bytes_per_s (a link this fast)" if self.kind == "slow_comm" else ""
            self.fail(f"give exactly one of seconds (fixed extra per task) or factor (relative){link}"
                      + (f", not {given}" if given else ""), "e.g. seconds: 0.05 or factor: 2.0")
        seconds = self.number("seconds", exclusive_minimum=0.0) if "seconds" in self.spec else None
        link_speed = self.number("bytes_per_s", exclusive_minimum=0.0) if "bytes_per_s" in self.spec else None
        factor = self.number("factor", exclusive_minimum=1.0) if "factor" in self.spec else None
        ramp = self.optional_integer("ramp_steps", 1)
        # From step 1: step 1's tasks have no measured time to scale (its first tasks run as measured: the
        # warm-up, never judged), but the start probe before it is slowed, and every later step
        if factor is not None and ramp is None and start < 2 and PROBE_PHASE not in phases:
            self.fail("a factor slowdown scales the task time measured in the step before, and step 1 has none",
                      f"start at step 2 or later (or use seconds, or ramp_steps, or add the {PROBE_PHASE} phase)")
        return {"seconds": seconds, "factor": factor, "bytes_per_s": link_speed, "ramp_steps": ramp}

    def phases(self, allowed: tuple[str, ...], default: tuple[str, ...]) -> tuple[str, ...]:
        raw = self.spec.get("phase", default)
        phases = (raw,) if isinstance(raw, str) else tuple(raw)
        bad = [p for p in phases if p not in allowed]
        if bad or not phases:
            self.fail(f"phase {bad or list(phases)} is not one a {self.kind} fault acts in",
                      f"use one of {', '.join(allowed)}")
        return phases

    def integer(self, key: str, minimum: int, default: int | None = None) -> int:
        value = self.spec.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{key}={value!r} is not an integer", f"write {key}: N with N >= {minimum}")
        if value < minimum:
            self.fail(f"{key}={value} is below {minimum}", f"use {key} >= {minimum}"
                      + (" (steps are 1-based)" if key in ("step", "start") else ""))
        return value

    def optional_integer(self, key: str, minimum: int) -> int | None:
        return None if self.spec.get(key) is None else self.integer(key, minimum)

    def number(self, key: str, exclusive_minimum: float) -> float:
        value = self.spec[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(f"{key}={value!r} is not a finite number", f"write {key}: X with X > {exclusive_minimum}")
        if value <= exclusive_minimum:
            hint = " (2.0 = twice as slow)" if key == "factor" else ""
            self.fail(f"{key}={value} must be > {exclusive_minimum}{hint}", f"use {key} > {exclusive_minimum}")
        return float(value)


def instant_fault_steps(faults: Sequence[FaultSpec]) -> set[int]:
    """Steps at which an instant fault fires on some rank (at a fixed step: not the event phases).

    Every rank knows them (each parses the whole list), so all can settle together before such a
    step: the training loop lets the checkpoint in flight commit first, which makes the checkpoint
    a restart resumes from the same under any load (an asynchronous save would otherwise race the
    injected crash; a real crash mid-save is tested by the ``checkpoint_write`` phase)."""
    return {f.step for f in faults if f.instant and f.phase not in EVENT_PHASES}


def fault_id(fault: Mapping[str, Any], position: int) -> int:
    given = fault.get("fault_id")  # unset (None) in the typed config: the fault's place in the list
    return int(position if given is None else given)


def faults_for_segment(faults: Sequence[Mapping[str, Any]], first_devices: Sequence[int],
                     segment_devices: Sequence[int], fired: set[int]) -> list[dict[str, Any]]:
    """The faults of a segment on ``segment_devices``: ranks remapped, each tagged with its ``fault_id``.

    ``faults`` is the user's list (ranks refer to ``first_devices``); ``fired`` holds the ids of
    instant faults that already fired.
    """
    kept = []
    for position, fault in enumerate(faults):
        ident = fault_id(fault, position)
        if fault["kind"] in INSTANT_KINDS and ident in fired:
            continue
        device = first_devices[int(fault["rank"])]
        if device not in segment_devices:
            continue  # the device is gone, and its fault with it
        given = {key: value for key, value in fault.items() if value is not None}  # unset keys stay unset
        kept.append({**given, "rank": list(segment_devices).index(device), "fault_id": ident})
    return kept


def dropped_faults(faults: Sequence[Mapping[str, Any]], first_devices: Sequence[int],
                   segment_devices: Sequence[int], fired: set[int]) -> list[int]:
    """Ids of the faults ``faults_for_segment`` leaves out (fired, or their device dropped)."""
    kept = {f["fault_id"] for f in faults_for_segment(faults, first_devices, segment_devices, fired)}
    return [fault_id(f, i) for i, f in enumerate(faults) if fault_id(f, i) not in kept]
