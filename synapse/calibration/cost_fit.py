"""Fitting the cost model to what a run measures: ``Calibration``, ``calibration_error``, ``TermCalibration``.

The cost model (``synapse.partitioning.cost_model``) predicts from profiles taken under
other conditions than the run. Two corrections, measured rather than assumed:

* ``Calibration``: an affine map of predicted step times onto measured ones (a
  least-squares fit), and ``calibration_error``, the median relative error that says
  when to fit again.
* ``TermCalibration``: the physical per-step terms (compute scale, per-micro-batch
  overhead, loss, optimizer step) measured on one K = 1 step; they enter the stage
  times, so the partitioner plans with them.

Per-block factors learnt from measured stages are ``synapse.calibration.blocks``. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from synapse.partitioning import CostModel, require


@dataclass(frozen=True)
class Calibration:
    """Affine map from model seconds to measured wall seconds: scale * t + overhead_s."""

    scale: float = 1.0
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        require(math.isfinite(self.scale) and self.scale > 0,
                f"calibration scale={self.scale!r} must be finite and > 0")
        require(math.isfinite(self.overhead_s) and self.overhead_s >= 0,
                f"calibration overhead_s={self.overhead_s!r} must be >= 0")

    def apply(self, predicted_s: npt.ArrayLike) -> float | np.ndarray:
        """Wall-time seconds for model seconds (a float, or an array of them)."""
        result = self.scale * np.asarray(predicted_s, dtype=np.float64) + self.overhead_s
        return float(result) if result.ndim == 0 else result

    @classmethod
    def fit(cls, predicted_s: Sequence[float], measured_s: Sequence[float]) -> Calibration:
        """Least-squares fit of measured = scale * predicted + overhead, with overhead >= 0.

        With a single pair, or when all predictions are equal, scale and overhead
        cannot be separated: the fit is then scale-only (overhead 0).
        """
        x, y = _check_pairs(predicted_s, measured_s)
        if x.size >= 2 and np.ptp(x) > 1e-12 * np.abs(x).max():
            scale, overhead = np.polyfit(x, y, 1)
            if overhead >= 0 and scale > 0:
                return cls(float(scale), float(overhead))
        # The constrained optimum lies on overhead = 0 (convex problem, one active bound).
        scale = float(x @ y / (x @ x))
        require(scale > 0,
                f"measured times {y.tolist()} do not grow with predicted times {x.tolist()}; cannot calibrate")
        return cls(scale, 0.0)


def _check_pairs(predicted_s: Sequence[float], measured_s: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(predicted_s, dtype=np.float64)
    y = np.asarray(measured_s, dtype=np.float64)
    require(x.ndim == 1 and x.shape == y.shape and x.size >= 1,
            f"need equally long, non-empty 1-D sequences; got {x.shape} predicted and {y.shape} measured")
    require(bool(np.all(np.isfinite(x)) and np.all(np.isfinite(y))), "predicted and measured times must be finite")
    require(bool(np.all(x > 0) and np.all(y > 0)), "predicted and measured times must be > 0 seconds")
    return x, y


def calibration_error(predicted_s: Sequence[float], measured_s: Sequence[float]) -> float:
    """Median relative error |predicted - measured| / measured; large means: re-calibrate."""
    x, y = _check_pairs(predicted_s, measured_s)
    return float(np.median(np.abs(x - y) / y))


@dataclass(frozen=True)
class TermCalibration:
    """Physical per-step terms measured on a single-device (K = 1) run of the same step.

    compute_scale multiplies every device's alpha: the profile was taken under other
    conditions than the run (thread count, load, caches). The other fields are the
    `StepSpec` terms of the same names. Unlike `Calibration` (an affine map of the
    predicted step time), these enter the stage times, so the partitioner plans with them.
    """

    compute_scale: float = 1.0
    per_microbatch_overhead_s: float = 0.0
    loss_s: float = 0.0
    optimizer_step_s: float = 0.0

    def __post_init__(self) -> None:
        require(math.isfinite(self.compute_scale) and self.compute_scale > 0,
                f"compute_scale={self.compute_scale!r} must be finite and > 0 (1.0 = the profile is right)")

    @classmethod
    def from_single_device_step(cls, model: CostModel, block_compute_s: float, loss_s: float,
                                optimizer_s: float, wall_s: float) -> TermCalibration:
        """Terms from one K = 1 step of `model`'s shape (medians over steps, seconds per step).

        block_compute_s: teacher forward + student forward + student backward; loss_s and
        optimizer_s: the KD loss and the optimizer step; wall_s: the whole step. What the
        blocks, loss and optimizer do not explain is the per-micro-batch overhead.
        """
        require(model.num_stages == 1, f"calibrate on a single-device model, not one of {model.num_stages} stages")
        parts = {"block_compute_s": block_compute_s, "loss_s": loss_s, "optimizer_s": optimizer_s, "wall_s": wall_s}
        require(all(math.isfinite(v) and v >= 0 for v in parts.values()) and block_compute_s > 0,
                f"measured parts {parts} must be finite seconds >= 0 (block compute > 0)")
        m = model.step.microbatches
        profiled_s = m * float(model.teacher_work_s(0, model.num_teacher_blocks)
                               + model.student_work_s(0, model.num_student_blocks))
        require(profiled_s > 0, "the profiles have no forward/backward time; cannot calibrate against them")
        scale = block_compute_s / (profiled_s * model.compute_scale(0))
        unexplained_s = max(0.0, wall_s - block_compute_s - loss_s - optimizer_s)
        return cls(compute_scale=scale, per_microbatch_overhead_s=unexplained_s / m / model.devices[0].contention,
                   loss_s=loss_s / m / (scale * model.compute_scale(0)), optimizer_step_s=optimizer_s)

    def apply(self, model: CostModel) -> CostModel:
        """The same profiles, devices and step with these terms in."""
        devices = [replace(d, alpha=d.alpha * self.compute_scale) for d in model.devices]
        step = replace(model.step, per_microbatch_overhead_s=self.per_microbatch_overhead_s, loss_s=self.loss_s,
                       optimizer_step_s=self.optimizer_step_s)
        return CostModel(model.teacher, model.student, devices, step)
