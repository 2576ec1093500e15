"""What goes wrong in a simulated run, per device: slowdowns of its compute or its link, and its death.

Three sources, one form (``DeviceFault``):

* the injection group (``injection.faults``): the very ``FaultSpec`` schedule real workers inject,
  mapped from the rank it names to that rank's device in the first placement (a fault models a
  device misbehaving, and follows its device through re-placements as in real runs);
* a CSV trace (``simulate.trace``): per-device events in simulated seconds or in steps;
* random events from rates (``simulate.*_mtbf_h``): exponential gaps per device, seeded.

A slowdown multiplies the device's compute time (alpha) or its link's transfer time (beta) by its
factor while it lasts; a fail-stop kills the device once; a node loss (``node_loss``, traces only:
the row names any device of the node) kills every device of that node at once, as a lost host or
agent does (the multi-node recovery runs of experiments/results/recovery_nodes_cpu.*).
"""
from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse.config import ConfigError
from synapse.injection import FaultSpec, InjectionError, parse_faults

COMPUTE, COMM, STOP, NODE = "slow_compute", "slow_comm", "fail_stop", "node_loss"
KINDS = (COMPUTE, COMM, STOP, NODE)
DEATHS = (STOP, NODE)  # kinds that kill (once) rather than slow
# Injection kinds a simulation stands in for: a killed, hung or CUDA-failed rank is a device lost.
INSTANT_AS_STOP = ("kill", "hang", "cuda_error")
TRACE_COLUMNS = "device, kind (slow_compute|slow_comm|fail_stop|node_loss), start_s or start_step, " \
                "duration_s or end_step (empty: to the end), factor (empty for fail_stop and node_loss)"


@dataclass(frozen=True)
class DeviceFault:
    """One fault of one device, over simulated steps (``start``..``end``, inclusive; ``end`` None: to
    the end) or simulated seconds since the run began (``in_seconds``)."""

    device: int
    kind: str
    start: float
    end: float | None = None
    factor: float = 1.0
    in_seconds: bool = False
    spec: FaultSpec | None = None  # an injected fault: its own schedule (ramps, on/off periods)
    source: str = "injection"

    def factor_at(self, step: int, clock_s: float) -> float:
        """The slowdown in force during ``step`` (starting at ``clock_s`` seconds into the run)."""
        if self.spec is not None:
            return self.spec.effective_factor(step)
        now = clock_s if self.in_seconds else step
        if now < self.start or (self.end is not None and now > self.end):
            return 1.0
        return self.factor

    @property
    def slows_evaluation(self) -> bool:
        """Whether an evaluation runs slower under it. An injected slowdown is the injector's hooks,
        which fire in training steps only (``synapse.injection.injector``: a step below 1, an
        evaluation's, fires nothing); a fault from a trace or rates is the device itself being slow."""
        return self.spec is None

    def due(self, step: int, clock_s: float) -> bool:
        """A fail-stop: whether it has struck by ``step`` (at ``clock_s``)."""
        return (clock_s if self.in_seconds else step) >= self.start

    def describe(self) -> dict[str, Any]:
        unit = "s" if self.in_seconds else "step"
        return {"device": self.device, "kind": self.kind, f"start_{unit}": self.start, f"end_{unit}": self.end,
                "factor": self.factor, "origin": self.source}


def injected_faults(faults: Sequence[Mapping[str, Any]], first_devices: Sequence[int]) -> list[DeviceFault]:
    """``injection.faults`` on the first placement's devices (rank r is device ``first_devices[r]``)."""
    try:
        specs = parse_faults(list(faults), len(first_devices))
    except InjectionError as exc:
        raise ConfigError(f"injection.faults: {exc}. Fix: see conf/injection/ for examples") from None
    out = []
    for spec in specs:
        device, where = first_devices[spec.rank], f"injection.faults[{spec.index}]"
        if spec.kind in INSTANT_AS_STOP:
            out.append(DeviceFault(device, STOP, spec.start, spec.start, spec=None))
        elif spec.kind in (COMPUTE, COMM):
            if spec.factor is None:
                raise ConfigError(f"{where}: a simulated {spec.kind} takes a factor (seconds and bytes_per_s depend on "
                                  f"measured task times and bytes the simulation does not have). Fix: give factor, "
                                  f"e.g. {{kind: {spec.kind}, rank: {spec.rank}, start: {spec.start}, factor: 4}}")
            out.append(DeviceFault(device, spec.kind, spec.start, spec.end, spec.factor, spec=spec))
        else:
            raise ConfigError(f"{where}: kind {spec.kind} is not simulated (it is a fault of the code or of the host, "
                              f"not of a device's speed). Fix: use slow_compute, slow_comm, kill, hang or cuda_error")
    return out


def trace_faults(path: str | Path, devices: Iterable[int]) -> list[DeviceFault]:
    """The events of a CSV trace; any bad row is an error naming the file, the row and the fix."""
    path, known = Path(path), set(devices)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        columns = set(reader.fieldnames or ())
        in_seconds = "start_s" in columns
        required = {"device", "kind", "factor", "start_s" if in_seconds else "start_step"}
        if not required <= columns or ("start_s" in columns and "start_step" in columns):
            raise ConfigError(f"simulate.trace: {path} has the columns {sorted(columns)}; it needs {TRACE_COLUMNS}. "
                              f"Fix: write a header such as 'device,kind,start_s,duration_s,factor'")
        out = []
        for line, row in enumerate(reader, start=2):
            out.append(_trace_row(row, in_seconds, known, f"simulate.trace: {path}:{line}"))
    return out


def _trace_row(row: Mapping[str, str], in_seconds: bool, known: set[int], where: str) -> DeviceFault:
    def number(key: str, cast: type = float, empty: Any = None) -> Any:
        text = (row.get(key) or "").strip()
        if not text:
            return empty
        try:
            value = cast(text)
        except ValueError:
            raise ConfigError(f"{where}: {key}={text!r} is not a number. Fix: write a number") from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: {key}={text} must be finite and >= 0. Fix: write a number >= 0")
        return value

    kind = (row.get("kind") or "").strip()
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}. Fix: use one of them")
    device = number("device", int)
    if device not in known:
        raise ConfigError(f"{where}: device {device} is not one of the run's simulated devices "
                          f"(0..{max(known)}). Fix: name a device of the run")
    start = number("start_s" if in_seconds else "start_step", float if in_seconds else int)
    if start is None:
        raise ConfigError(f"{where}: no start. Fix: give start_s (or start_step)")
    end = None
    if in_seconds:
        duration = number("duration_s")
        end = None if duration is None else start + duration
    else:
        end = number("end_step", int)
    factor = number("factor", float, 1.0)
    if kind not in DEATHS and not factor > 1:
        raise ConfigError(f"{where}: a {kind} needs a factor > 1, got {factor}. Fix: e.g. factor 2 (half speed)")
    return DeviceFault(int(device), kind, start, end, factor, in_seconds=in_seconds, source="trace")


@dataclass(frozen=True)
class FaultRates:
    """Per device: mean hours between events of each kind (None: none), slowdowns' durations and factors."""

    fail_slow_mtbf_h: float | None = None
    fail_slow_duration_s: float = 600.0
    fail_slow_factor: float = 2.0
    comm_fail_slow_mtbf_h: float | None = None
    comm_fail_slow_duration_s: float = 1440.0
    comm_fail_slow_factor: float = 2.0
    fail_stop_mtbf_h: float | None = None
    node_loss_mtbf_h: float | None = None  # per node: all its devices at once

    def __post_init__(self) -> None:
        for name in ("fail_slow_mtbf_h", "comm_fail_slow_mtbf_h", "fail_stop_mtbf_h", "node_loss_mtbf_h"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"simulate.{name}={value}: a mean time between events must be > 0 hours. Fix: give "
                                  f"hours, or null for none")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.fail_slow_mtbf_h, self.comm_fail_slow_mtbf_h, self.fail_stop_mtbf_h,
                                           self.node_loss_mtbf_h))


def random_faults(rates: FaultRates, devices: Iterable[int], horizon_s: float, seed: int,
                  nodes: Sequence[Sequence[int]] = ()) -> list[DeviceFault]:
    """Events of every device up to ``horizon_s`` simulated seconds: exponential gaps (a Poisson
    process per device and kind), slowdowns of exponential duration around their mean; and a node
    loss per node of ``nodes`` (each node's devices) at its own exponential time, named by the node's
    first device (the engine takes every device of that device's node). Seeded."""
    rng = random.Random(f"synapse.simulation.faults:{seed}")
    out: list[DeviceFault] = []
    kinds = ((COMPUTE, rates.fail_slow_mtbf_h, rates.fail_slow_duration_s, rates.fail_slow_factor),
             (COMM, rates.comm_fail_slow_mtbf_h, rates.comm_fail_slow_duration_s, rates.comm_fail_slow_factor),
             (STOP, rates.fail_stop_mtbf_h, 0.0, 1.0))
    for device in devices:
        for kind, mtbf_h, duration_s, factor in kinds:
            if mtbf_h is None:
                continue
            at = rng.expovariate(1.0 / (mtbf_h * 3600.0))
            while at < horizon_s:
                if kind == STOP:
                    out.append(DeviceFault(device, STOP, at, at, in_seconds=True, source="rates"))
                    break  # a dead device does not come back
                length = rng.expovariate(1.0 / duration_s)
                out.append(DeviceFault(device, kind, at, at + length, factor, in_seconds=True, source="rates"))
                at += length + rng.expovariate(1.0 / (mtbf_h * 3600.0))
    if rates.node_loss_mtbf_h is not None:
        # a stream of its own, so that adding node losses leaves the devices' events as they were
        node_rng = random.Random(f"synapse.simulation.faults.nodes:{seed}")
        for node in nodes:
            at = node_rng.expovariate(1.0 / (rates.node_loss_mtbf_h * 3600.0))
            if node and at < horizon_s:  # a lost node does not come back
                out.append(DeviceFault(min(node), NODE, at, at, in_seconds=True, source="rates"))
    return sorted(out, key=lambda f: (f.start, f.device))
