"""The run's block calibration as one component: the factors so far, the running placement's
window, and the planner on the calibrated profiles (what every prediction and re-plan uses).

The failover controller composes it: ``begin`` at every new placement (first launch, restart,
live re-partition), ``observe`` every step, ``priced`` for every plan and price. The rules
(which steps measure, how factors combine, why a slow device is left out) are
`synapse.planner.block_calibration`'s. Pure: no torch.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from synapse.planner.block_calibration import BlockCalibration, CalibrationWindow, StageMeasurement
from synapse.planner.placement import Placement
from synapse.planner.stage_planner import StagePlanner


class OnlineCalibration:
    """``warmup_steps``, ``steps`` and ``hold_steps``: each placement's window (`CalibrationWindow`)."""

    def __init__(self, planner: StagePlanner, warmup_steps: int, steps: int, hold_steps: int) -> None:
        self.planner = planner
        self.window_steps = (warmup_steps, steps, hold_steps)
        self.factors = BlockCalibration.neutral(planner.teacher, planner.student)
        self._priced: StagePlanner | None = None
        self._window: CalibrationWindow | None = None

    @property
    def priced(self) -> StagePlanner:
        """The planner on the calibrated block profiles (the run's own planner until a stage was measured)."""
        if self._priced is None:
            self._priced = self.planner.calibrated(self.factors) if self.factors.observations else self.planner
        return self._priced

    def begin(self, placement: Placement, slowdowns: Sequence[float]) -> None:
        """A new placement runs; ``slowdowns``: each stage's device alpha as known now (divided out)."""
        predicted = self.planner.per_step_compute_s(placement.devices, placement.teacher_counts,
                                                    placement.student_counts)
        self._window = CalibrationWindow(placement, predicted, slowdowns, *self.window_steps)

    def observe(self, compute_s: Sequence[float], flagged: Sequence[bool]) -> list[StageMeasurement]:
        """One step of the running placement (per-rank compute, the detector's slow verdicts). Returns the
        stages measured at this step (empty: nothing changed); the factors and ``priced`` follow them."""
        if self._window is None or self._window.finished:
            return []
        measured = self._window.add(compute_s, flagged)
        if measured:
            self.factors, self._priced = self.factors.observe(measured), None
        return measured

    def describe(self, measured: Sequence[StageMeasurement]) -> list[dict[str, Any]]:
        """The measured stages of the running placement as records (rank, device, seconds, ratio)."""
        placement = self._window.placement
        rows = []
        for m in measured:
            rank = next(r for r in range(placement.num_stages) if placement.teacher_range(r) == m.teacher_blocks)
            rows.append({"rank": rank, "device": placement.devices[rank], "profile_s": m.predicted_s,
                         "measured_s": m.measured_s, "slowdown": m.slowdown, "ratio": m.ratio})
        return rows

    def state_dict(self) -> dict[str, Any]:
        return self.factors.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.factors, self._priced = self.factors.load_state(state), None
