"""The alpha/beta estimator's settings and errors (pure; `synapse.planner.estimator` explains
the roles of the settings)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

COMPUTE, COMM = "compute", "comm"
KINDS = (COMPUTE, COMM)


class EstimatorConfigError(ValueError):
    """An estimator setting is out of range (the message names it and the fix)."""


class EstimatorInputError(ValueError):
    """Measurements, predictions or a state dict do not fit (the message says which)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class EstimatorConfig:
    """Settings of `AlphaBetaEstimator` (roles: see the module docstring)."""

    warmup_steps: int = 10
    baseline_steps: int = 30
    median_window: int = 5
    ema_weight: float = 0.2
    min_alpha: float = 0.25
    max_alpha: float = 20.0
    min_beta: float = 0.25
    max_beta: float = 1000.0
    min_predicted_s: float = 1e-6
    min_predicted_share: float = 0.1  # of the median rank's predicted compute (0: measure every rank)
    transfer_baseline_steps: int = 15
    min_shift_samples: int = 3  # samples since an onset needed to read a shifted level (a median of 3)

    def __post_init__(self) -> None:
        for name, minimum in (("warmup_steps", 0), ("baseline_steps", 1), ("median_window", 1),
                              ("transfer_baseline_steps", 1), ("min_shift_samples", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise EstimatorConfigError(f"{name}={value!r} must be an integer >= {minimum}")
        if not (_is_number(self.ema_weight) and 0 < self.ema_weight <= 1):
            raise EstimatorConfigError(f"ema_weight={self.ema_weight!r} must be in (0, 1] (1 = no smoothing)")
        for low, high in (("min_alpha", "max_alpha"), ("min_beta", "max_beta")):
            lo, hi = getattr(self, low), getattr(self, high)
            if not (_is_number(lo) and _is_number(hi) and 0 < lo <= 1 <= hi):
                raise EstimatorConfigError(f"{low}={lo!r}, {high}={hi!r}: need finite 0 < {low} <= 1 <= {high}")
        if not (_is_number(self.min_predicted_s) and self.min_predicted_s > 0):
            raise EstimatorConfigError(f"min_predicted_s={self.min_predicted_s!r} must be a finite number > 0 seconds")
        if not (_is_number(self.min_predicted_share) and 0 <= self.min_predicted_share < 1):
            raise EstimatorConfigError(f"min_predicted_share={self.min_predicted_share!r} must be in [0, 1) "
                                       "(e.g. 0.1; 0 measures every rank)")

    def bounds(self, kind: str) -> tuple[float, float]:
        return (self.min_alpha, self.max_alpha) if kind == COMPUTE else (self.min_beta, self.max_beta)
