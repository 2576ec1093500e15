"""What the cost model is told: the devices (``DeviceSpec``), the step (``StepSpec``, ``Schedule``).

These are plain, validated facts that the planner's callers build (from the config,
from measured terms) and the cost model (``synapse.planner.cost_model``) turns into
stage times and memory; what each field means in the model is written there. Also
here: ``cpu_contention`` (the fair-share slowdown of CPU ranks sharing cores) and the
cost model's one error type, ``CostModelError``, with ``require``, the check that
raises it. Pure.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import Enum

# Optimizer state per byte of student parameters.
OPTIMIZER_STATE_MULTIPLIERS = {"sgd": 0.0, "sgd_momentum": 1.0, "adamw": 2.0}


class CostModelError(ValueError):
    """Invalid device, schedule or calibration input."""


class Schedule(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"

    @classmethod
    def parse(cls, value: "Schedule | str") -> "Schedule":
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise CostModelError(f"unknown schedule {value!r}; use one of: {allowed}") from None


def require(condition: bool, message: str) -> None:
    """Raise ``CostModelError(message)`` unless ``condition``: every input check of the cost model."""
    if not condition:
        raise CostModelError(message)


@dataclass(frozen=True)
class DeviceSpec:
    """One pipeline device. alpha/beta: compute/comm slowdown (1.0 = as profiled).

    memory_bytes = inf means unconstrained; link_bandwidth_bytes_per_s = inf and
    link_latency_s = 0 mean free communication to the next device. contention >= 1:
    how much slower everything this device computes runs because it shares its cores
    with other ranks (1.0: the cores are its own; see `cpu_contention`).
    """

    name: str
    alpha: float = 1.0
    beta: float = 1.0
    memory_bytes: float = math.inf
    link_bandwidth_bytes_per_s: float = math.inf
    contention: float = 1.0
    link_latency_s: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name), "DeviceSpec.name is empty; name devices e.g. 'cuda:0'")
        for field in ("alpha", "beta"):
            value = getattr(self, field)
            require(math.isfinite(value) and value > 0,
                    f"device {self.name!r}: {field}={value!r} must be finite and > 0 (1.0 = as profiled)")
        for field in ("memory_bytes", "link_bandwidth_bytes_per_s"):
            value = getattr(self, field)
            require(not math.isnan(value) and value > 0,
                    f"device {self.name!r}: {field}={value!r} must be > 0 (inf = unlimited)")
        require(math.isfinite(self.contention) and self.contention >= 1.0,
                f"device {self.name!r}: contention={self.contention!r} must be finite and >= 1 "
                f"(1.0 = cores of its own; ranks * threads / cores when they share)")
        require(math.isfinite(self.link_latency_s) and self.link_latency_s >= 0,
                f"device {self.name!r}: link_latency_s={self.link_latency_s!r} must be >= 0 seconds per message")


def cpu_contention(ranks: int, threads_per_rank: int, cores: int) -> float:
    """Fair-share slowdown of each of `ranks` CPU processes of `threads_per_rank` threads on `cores` cores.

    When the ranks want more threads than there are cores, the scheduler time-slices
    them: each runs ranks * threads / cores times slower than alone; otherwise 1.
    """
    for name, value in (("ranks", ranks), ("threads_per_rank", threads_per_rank), ("cores", cores)):
        require(isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1,
                f"cpu_contention: {name}={value!r} must be an integer >= 1")
    return max(1.0, ranks * threads_per_rank / cores)


@dataclass(frozen=True)
class StepSpec:
    """What one optimizer step looks like, as far as cost is concerned."""

    microbatches: int
    schedule: Schedule = Schedule.ONE_F_ONE_B
    optimizer_state_multiplier: float = OPTIMIZER_STATE_MULTIPLIERS["sgd_momentum"]
    optimizer_step_s: float = 0.0
    per_microbatch_overhead_s: float = 0.0  # host time per micro-batch on every stage, outside the blocks
    loss_s: float = 0.0  # KD loss per micro-batch on the last stage, profile seconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", Schedule.parse(self.schedule))
        m = self.microbatches
        require(isinstance(m, numbers.Integral) and not isinstance(m, bool) and m >= 1,
                f"microbatches={m!r} must be an integer >= 1")
        object.__setattr__(self, "microbatches", int(m))
        multiplier = self.optimizer_state_multiplier
        require(math.isfinite(multiplier) and multiplier >= 0,
                f"optimizer_state_multiplier={multiplier!r} must be >= 0 (SGD 0, momentum 1, AdamW 2)")
        for field in ("optimizer_step_s", "per_microbatch_overhead_s", "loss_s"):
            value = getattr(self, field)
            require(math.isfinite(value) and value >= 0, f"{field}={value!r} must be >= 0 seconds")
