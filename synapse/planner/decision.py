"""What a policy sees at one decision point and what it answers: ``DecisionContext`` and ``Decision``.

A policy holds no state between calls: what it must remember (consecutive
detections, time lost, actions already taken in this slowdown) comes in the
``DecisionContext``, which the controller keeps and carries across restarts, so a
policy can be swapped, replayed from a log or restarted without losing anything.
The ``Decision`` it returns carries every option it weighed and why it chose one
(``to_dict``: a line of the decisions log). The policy errors live here too, as every
policy module and the config checks raise them. Pure.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from synapse.planner.options import DeviceId, Option, OptionKind


class PolicyError(ValueError):
    """Bad input to a policy (the message names the value and the fix)."""


class PolicyConfigError(PolicyError):
    """Unknown policy name, unknown parameter or out-of-range parameter value."""


class NoViableOptionError(PolicyError):
    """A hard failure left no option that avoids the failed device."""


def _check_count(name: str, value: int, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PolicyError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class DecisionContext:
    """What a policy sees at one decision point.

    ``consecutive_detections``: decisions in a row at which a slowdown was
    detected (0 exactly when ``slowdown_detected`` is False).
    ``time_lost_s``: wall time lost to the current slowdown (measured minus
    baseline step time, summed), since it began or since the last action taken
    against it, whichever is later.
    ``steps_since_last_action``: steps since the last non-KEEP decision (None: never).
    ``actions_in_episode``: non-KEEP decisions already taken against the current slowdown.
    ``estimated_factor``: the alpha/beta estimator's factor (alpha for a compute slowdown, beta
    for a link) of the device the detector blames; None: not known. The options are planned
    with the estimator's factors, so a policy that trusts their ETAs can check that the two
    monitors agree first.
    """

    step: int
    remaining_steps: int
    options: tuple[Option, ...]
    slowdown_detected: bool = False
    consecutive_detections: int = 0
    hard_failure: bool = False
    failed_device: DeviceId | None = None
    time_lost_s: float = 0.0
    steps_since_last_action: int | None = None
    actions_in_episode: int = 0
    estimated_factor: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        _check_count("step", self.step)
        _check_count("remaining_steps", self.remaining_steps)
        _check_count("consecutive_detections", self.consecutive_detections)
        _check_count("actions_in_episode", self.actions_in_episode)
        if self.steps_since_last_action is not None:
            _check_count("steps_since_last_action", self.steps_since_last_action)
        if self.slowdown_detected != (self.consecutive_detections > 0):
            raise PolicyError(
                f"slowdown_detected={self.slowdown_detected} but consecutive_detections="
                f"{self.consecutive_detections}; a detected slowdown counts at least 1, none counts 0"
            )
        if self.hard_failure and self.failed_device is None:
            raise PolicyError("hard_failure=True needs failed_device (the id of the device that died)")
        if self.estimated_factor is not None and not (math.isfinite(self.estimated_factor)
                                                      and self.estimated_factor > 0):
            raise PolicyError(f"estimated_factor must be a finite number > 0 or None, got {self.estimated_factor!r}")
        if not math.isfinite(self.time_lost_s) or self.time_lost_s < 0:
            raise PolicyError(f"time_lost_s must be finite seconds >= 0, got {self.time_lost_s!r}")
        self._check_options()

    def _check_options(self) -> None:
        kinds = [o.kind for o in self.options]
        duplicated = sorted({k.value for k in kinds if kinds.count(k) > 1})
        if duplicated:
            raise PolicyError(f"at most one option per kind, got several of {duplicated}")
        if OptionKind.KEEP not in kinds:
            got = [k.value for k in kinds]
            raise PolicyError(f"options must include KEEP (build them with build_options), got {got}")

    def option(self, kind: OptionKind) -> Option | None:
        return next((o for o in self.options if o.kind is kind), None)

    @property
    def keep(self) -> Option:
        return self.option(OptionKind.KEEP)

    def eta_s(self, option: Option) -> float:
        return option.eta_s(self.remaining_steps)

    def summary(self) -> dict[str, Any]:
        """The scalar fields, for a decision's ``inputs``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}


@dataclass(frozen=True)
class Decision:
    action: OptionKind
    chosen: Option
    options: tuple[Option, ...]
    reason: str
    step: int
    remaining_steps: int
    inputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def eta_s(self) -> float:
        return self.chosen.eta_s(self.remaining_steps)

    def to_dict(self) -> dict[str, Any]:
        """One JSON-friendly record (a line of the decisions JSONL log)."""
        return {
            "step": self.step,
            "action": self.action.value,
            "reason": self.reason,
            "remaining_steps": self.remaining_steps,
            "eta_s": self.eta_s,
            "chosen": self.chosen.to_dict(self.remaining_steps),
            "options": [o.to_dict(self.remaining_steps) for o in self.options],
            "inputs": {k: _jsonable(v) for k, v in self.inputs.items()},
        }


def _jsonable(value: Any) -> Any:
    return value.value if isinstance(value, OptionKind) else value
