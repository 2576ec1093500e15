"""What the run could do next, priced: the vocabulary of the ETA model (``synapse.planner.eta``).

* ``OptionKind``       KEEP, REPLAN, DEGRADE, REPLACE.
* ``RunningPartition`` the placement running now, measured: what KEEP keeps and what puts
                       the planner's predictions on the measured scale (``calibration``).
* ``Option``           one option: its placement, predicted step time and restart cost, and
                       ``eta_s(remaining_steps) = restart_cost_s + remaining_steps * predicted_step_s``.
* ``EtaModelError`` and the checks every part of the ETA model applies to its numbers.

These are the types the ETA model, the restart-cost model and the policies share; who
builds the options (``eta.build_options``) and what a restart costs (``restart_cost``)
live in their own modules. Pure: numbers and dataclasses only.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from synapse.planner.placement import Placement

DeviceId = int


class EtaModelError(ValueError):
    """Bad input to the ETA model (the message names the value and the fix)."""


class OptionKind(str, Enum):
    KEEP = "keep"
    REPLAN = "replan"
    DEGRADE = "degrade"
    REPLACE = "replace"

    @classmethod
    def parse(cls, value: OptionKind | str) -> OptionKind:
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(k.value for k in cls)
            raise EtaModelError(f"unknown option kind {value!r}; valid kinds: {valid}") from None


RESTARTING_KINDS = (OptionKind.REPLAN, OptionKind.DEGRADE, OptionKind.REPLACE)


def check_seconds(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise EtaModelError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def check_positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise EtaModelError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_steps(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EtaModelError(f"{name} must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class RunningPartition:
    """The placement running now, measured: what KEEP keeps and what calibrates the planner.

    ``predicted_step_s`` is the planner's cost model evaluated on *this*
    placement under the current alphas/betas (not the prediction made when it
    was planned); ``measured_step_s`` is the step time actually measured.
    """

    placement: Placement
    measured_step_s: float
    predicted_step_s: float

    def __post_init__(self) -> None:
        _check_placement(self.placement, "running partition")
        check_positive("measured_step_s", self.measured_step_s)
        check_positive("predicted_step_s", self.predicted_step_s)

    @property
    def devices(self) -> tuple[DeviceId, ...]:
        return self.placement.devices

    @property
    def calibration(self) -> float:
        """Factor that puts the planner's predictions on the measured scale (the residual of a
        block-calibrated planner; see ``synapse.planner.eta``)."""
        return self.measured_step_s / self.predicted_step_s


def _check_placement(placement: Placement, what: str) -> None:
    """What a placement must be to be priced here (``Placement`` checks the counts themselves)."""
    if not isinstance(placement, Placement):
        raise EtaModelError(f"{what}: needs a Placement, got {type(placement).__name__}")
    if len(set(placement.devices)) != len(placement.devices):
        raise EtaModelError(f"{what}: devices {placement.devices} contain duplicates")


@dataclass(frozen=True)
class Option:
    """One thing the run could do next: where it would run, and its predicted wall-time cost."""

    kind: OptionKind
    placement: Placement
    predicted_step_s: float
    restart_cost_s: float
    inputs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OptionKind.parse(self.kind))
        _check_placement(self.placement, f"{self.kind.value} option")
        check_positive("predicted_step_s", self.predicted_step_s)
        check_seconds("restart_cost_s", self.restart_cost_s)
        if self.kind is OptionKind.KEEP and self.restart_cost_s != 0:
            raise EtaModelError(f"KEEP does not restart, so its restart_cost_s must be 0, got {self.restart_cost_s}")

    @property
    def devices(self) -> tuple[DeviceId, ...]:
        return self.placement.devices

    @property
    def teacher_counts(self) -> tuple[int, ...]:
        return self.placement.teacher_counts

    @property
    def student_counts(self) -> tuple[int, ...]:
        return self.placement.student_counts

    def eta_s(self, remaining_steps: int) -> float:
        """Seconds of wall time to finish the run if this option is taken now."""
        check_steps("remaining_steps", remaining_steps)
        return self.restart_cost_s + remaining_steps * self.predicted_step_s

    def to_dict(self, remaining_steps: int | None = None) -> dict[str, Any]:
        record = {
            "kind": self.kind.value,
            "devices": list(self.devices),
            "teacher_counts": list(self.teacher_counts),
            "student_counts": list(self.student_counts),
            "predicted_step_s": self.predicted_step_s,
            "restart_cost_s": self.restart_cost_s,
            "inputs": dict(self.inputs),
        }
        if remaining_steps is not None:
            record["eta_s"] = self.eta_s(remaining_steps)
        return record
