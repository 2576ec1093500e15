"""Online calibration of the block profiles: per-block compute factors from the running pipeline.

The planner predicts each stage from profiled block times; the run measures each stage's
compute. Where the two differ (a profile taken eagerly for a graphed stage, at another batch,
on another machine), the difference belongs to the *blocks* of that stage, so every block of
a stage gets the stage's ratio::

    ratio_r = measured_r / (predicted_r * slowdown_r)

``predicted_r`` is the profile's (uncalibrated) compute of stage r at nominal speed and
``slowdown_r`` the slowdown of its device as known while it was measured (the estimator's
alpha). Dividing it out keeps a slow device out of the block factors: the planner already
prices a device's speed by its alpha, and a slowdown in both would be counted twice.

Blocks seen in several placements (the run re-plans): each new measurement of a stage
multiplies the factors of its blocks by ``ratio_r / current_r``, ``current_r`` being what the
factors say of that stage now (the profile-weighted mean factor of its blocks). The calibrated
profile then predicts the stage exactly as measured (the latest measurement wins for the
range), and what earlier placements taught about blocks inside the range is kept (a block
range measured 2x slow, then re-measured inside a larger stage that agrees, keeps its 2x).
Blocks never measured get the median factor of the measured ones (1.0 while none are).

Which steps are a fair measurement is `CalibrationWindow`'s job: the first steady steps of a
placement, per rank, while the detector flags nothing on the rank. The device's alpha is the
one known *before* the placement (a snapshot): one placement alone cannot tell slow blocks
from a slow device, but the device's speed just before the switch can. A device flagged slow
is not measured at all: its alpha is then an estimate still moving (an EMA that lags the
fault; 2.4 for a 3x device at a REPLAN in the controller test), and the difference would
land in its blocks. Nor is one whose speed changes inside its window.

Limits. On the first placement no alpha is known yet (unless the plan was made for one:
``partition.alphas``), so a device slow from the start (less than the detector's prior
threshold, 4x its peers) is read as slow blocks: from one placement
the two cannot be told apart, and the profile being wrong per stage is the commoner case on
GPUs. Measured compute also holds the KD loss (last stage) and the optimizer step, which the
profiles lack: they land in the stage's blocks (in the CPU demo ~3% and 6-10% of a stage).
Communication is not touched (the estimator's betas price links).

`OnlineCalibration` is the run's block calibration as one component, which the failover
controller composes: the factors so far, the running placement's window, and the planner on the
calibrated profiles (``priced``: what every prediction and re-plan uses). ``begin`` at every new
placement (first launch, restart, live re-partition), ``observe`` every step.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

import numpy as np

from synapse.partitioning import ModelProfile, Placement, StagePlanner


class CalibrationError(ValueError):
    """Bad input to the block calibration (the message names the value and the fix)."""


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CalibrationError(f"{name}={value!r} must be a finite number > 0")
    return float(value)


@dataclass(frozen=True)
class StageMeasurement:
    """One stage of a running placement, measured (seconds of compute per step)."""

    teacher_blocks: range
    student_blocks: range
    predicted_s: float  # the profile's compute of this stage at nominal speed (uncalibrated)
    measured_s: float  # measured compute of the stage: a median over steady steps
    slowdown: float = 1.0  # the device's known slowdown while measured (alpha), divided out

    def __post_init__(self) -> None:
        for name in ("teacher_blocks", "student_blocks"):
            blocks = getattr(self, name)
            if not isinstance(blocks, range) or blocks.step != 1 or len(blocks) < 1 or blocks.start < 0:
                raise CalibrationError(f"{name}={blocks!r} must be a non-empty range of block indices (step 1)")
        where = f"stage teacher {self.teacher_blocks} / student {self.student_blocks}"
        object.__setattr__(self, "predicted_s", _positive(f"{where}: predicted_s", self.predicted_s))
        object.__setattr__(self, "measured_s", _positive(f"{where}: measured_s", self.measured_s))
        object.__setattr__(self, "slowdown", _positive(f"{where}: slowdown (1.0 = nominal)", self.slowdown))

    @property
    def ratio(self) -> float:
        """Measured over the profile's prediction, the device's slowdown divided out."""
        return self.measured_s / (self.predicted_s * self.slowdown)


def measurements(placement: Placement, predicted_s: Sequence[float], measured_s: Sequence[float],
                 slowdowns: Sequence[float] | None = None) -> list[StageMeasurement]:
    """One `StageMeasurement` per stage of ``placement`` (sequences aligned with its stages)."""
    k = placement.num_stages
    slowdowns = [1.0] * k if slowdowns is None else list(slowdowns)
    for name, values in (("predicted_s", predicted_s), ("measured_s", measured_s), ("slowdowns", slowdowns)):
        if len(values) != k:
            raise CalibrationError(f"{name} has {len(values)} entries for a placement of {k} stages; "
                                   "give one per stage")
    return [StageMeasurement(placement.teacher_range(r), placement.student_range(r), predicted_s[r], measured_s[r],
                             slowdowns[r]) for r in range(k)]


@dataclass(frozen=True)
class BlockCalibration:
    """Per-block compute factors of the teacher and the student (None: never measured).

    ``*_weights`` are the profiled seconds of each block (teacher forward, student forward +
    backward): what a stage's current factor is the weighted mean over. Immutable: `observe`
    returns a new calibration."""

    teacher_weights: tuple[float, ...]
    student_weights: tuple[float, ...]
    teacher_factors: tuple[float | None, ...]
    student_factors: tuple[float | None, ...]
    observations: int = 0  # stages measured so far

    def __post_init__(self) -> None:
        for which in ("teacher", "student"):
            weights, factors = getattr(self, f"{which}_weights"), getattr(self, f"{which}_factors")
            if len(weights) != len(factors) or not weights:
                raise CalibrationError(f"{which}: {len(weights)} block weights for {len(factors)} factors; "
                                       "build the calibration with BlockCalibration.neutral(teacher, student)")
            if any(not (math.isfinite(w) and w >= 0) for w in weights):
                raise CalibrationError(f"{which} block weights {weights} must be finite seconds >= 0")
            for block, factor in enumerate(factors):
                if factor is not None:
                    _positive(f"{which} factor of block {block}", factor)

    @classmethod
    def neutral(cls, teacher: ModelProfile, student: ModelProfile) -> BlockCalibration:
        """Nothing measured yet: the profiles as they are."""
        t = tuple(float(w) for w in teacher.column("forward_time_ms") * 1e-3)
        s = tuple(float(w) for w in (student.column("forward_time_ms") + student.column("backward_time_ms")) * 1e-3)
        return cls(t, s, (None,) * len(t), (None,) * len(s))

    @property
    def neutral_factor(self) -> float:
        """What an unmeasured block is assumed to be: the median measured factor (1.0: none measured)."""
        measured = [f for f in (*self.teacher_factors, *self.student_factors) if f is not None]
        return median(measured) if measured else 1.0

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """Teacher and student factors per block, unmeasured blocks at `neutral_factor`."""
        fill = self.neutral_factor
        return (np.array([fill if f is None else f for f in self.teacher_factors], dtype=np.float64),
                np.array([fill if f is None else f for f in self.student_factors], dtype=np.float64))

    def stage_factor(self, teacher_blocks: range, student_blocks: range) -> float:
        """Calibrated over profiled compute of a stage: the weighted mean factor of its blocks."""
        self._check_ranges(teacher_blocks, student_blocks)
        t_factor, s_factor = self.factors()
        t_w, s_w = np.asarray(self.teacher_weights), np.asarray(self.student_weights)
        t, s = slice(teacher_blocks.start, teacher_blocks.stop), slice(student_blocks.start, student_blocks.stop)
        total = t_w[t].sum() + s_w[s].sum()
        if total <= 0:  # blocks profiled at 0 s: the mean is undefined, the plain mean stands in
            return float(np.concatenate((t_factor[t], s_factor[s])).mean())
        return float((t_factor[t] @ t_w[t] + s_factor[s] @ s_w[s]) / total)

    def observe(self, stages: Sequence[StageMeasurement]) -> BlockCalibration:
        """The calibration after measuring ``stages`` (disjoint: e.g. the stages of one placement)."""
        stages = list(stages)
        if not stages or not all(isinstance(s, StageMeasurement) for s in stages):
            raise CalibrationError(f"observe() takes a non-empty list of StageMeasurement, got {stages!r}")
        for stage in stages:
            self._check_ranges(stage.teacher_blocks, stage.student_blocks)
        self._check_disjoint(stages)
        fill = self.neutral_factor  # once, so the order of the stages does not matter
        teacher = [fill if f is None else f for f in self.teacher_factors]
        student = [fill if f is None else f for f in self.student_factors]
        measured_t: set[int] = set()
        measured_s: set[int] = set()
        for stage in stages:
            step = stage.ratio / self.stage_factor(stage.teacher_blocks, stage.student_blocks)
            for b in stage.teacher_blocks:
                teacher[b] *= step
            for b in stage.student_blocks:
                student[b] *= step
            measured_t.update(stage.teacher_blocks)
            measured_s.update(stage.student_blocks)
        return dataclasses.replace(
            self,
            teacher_factors=tuple(f if b in measured_t else self.teacher_factors[b] for b, f in enumerate(teacher)),
            student_factors=tuple(f if b in measured_s else self.student_factors[b] for b, f in enumerate(student)),
            observations=self.observations + len(stages))

    def calibrated(self, planner: StagePlanner) -> StagePlanner:
        """``planner`` on block profiles corrected by these factors (a new plan cache): its cuts, and
        not only its step times, follow what the running stages measured."""
        return planner.with_profiles(*self.apply(planner.teacher, planner.student))

    def apply(self, teacher: ModelProfile, student: ModelProfile) -> tuple[ModelProfile, ModelProfile]:
        """The profiles with every block's times multiplied by its factor (sizes unchanged)."""
        if (len(teacher), len(student)) != (len(self.teacher_factors), len(self.student_factors)):
            raise CalibrationError(f"the calibration has {len(self.teacher_factors)} teacher / "
                                   f"{len(self.student_factors)} student blocks, the profiles {len(teacher)} / "
                                   f"{len(student)}; calibrate the profiles the planner was built with")
        t_factor, s_factor = self.factors()
        return _scaled(teacher, t_factor), _scaled(student, s_factor)

    def _check_ranges(self, teacher_blocks: range, student_blocks: range) -> None:
        for which, blocks, n in (("teacher", teacher_blocks, len(self.teacher_factors)),
                                 ("student", student_blocks, len(self.student_factors))):
            if blocks.stop > n:
                raise CalibrationError(f"{which} blocks {blocks} lie outside the model's {n} blocks; "
                                       "measure stages of a placement of these models")

    @staticmethod
    def _check_disjoint(stages: Sequence[StageMeasurement]) -> None:
        for which in ("teacher_blocks", "student_blocks"):
            seen: set[int] = set()
            for stage in stages:
                blocks = set(getattr(stage, which))
                if seen & blocks:
                    raise CalibrationError(f"{which} {sorted(seen & blocks)} appear in two stages of one observation; "
                                           "observe the stages of one placement at a time")
                seen |= blocks

    def to_dict(self, digits: int = 4) -> dict[str, Any]:
        """The factors (rounded; null = never measured), for records and state files."""
        def rounded(factors: Sequence[float | None]) -> list[float | None]:
            return [None if f is None else round(f, digits) for f in factors]
        return {"teacher": rounded(self.teacher_factors), "student": rounded(self.student_factors),
                "neutral": round(self.neutral_factor, digits), "observations": self.observations}

    def state_dict(self) -> dict[str, Any]:
        return {"teacher_factors": list(self.teacher_factors), "student_factors": list(self.student_factors),
                "observations": self.observations}

    def load_state(self, state: Mapping[str, Any]) -> BlockCalibration:
        """This calibration's weights with the factors of `state_dict()` (the same models)."""
        try:
            teacher, student = tuple(state["teacher_factors"]), tuple(state["student_factors"])
            observations = int(state["observations"])
        except (KeyError, TypeError, ValueError) as error:
            raise CalibrationError(f"not a BlockCalibration.state_dict(): {error!r}") from None
        if (len(teacher), len(student)) != (len(self.teacher_factors), len(self.student_factors)):
            raise CalibrationError(f"saved factors cover {len(teacher)} teacher / {len(student)} student blocks, "
                                   f"the models have {len(self.teacher_factors)} / {len(self.student_factors)}")
        return dataclasses.replace(self, teacher_factors=teacher, student_factors=student, observations=observations)


def _scaled(profile: ModelProfile, factors: np.ndarray) -> ModelProfile:
    blocks = tuple(dataclasses.replace(block, forward_time_ms=block.forward_time_ms * float(f),
                                       backward_time_ms=block.backward_time_ms * float(f))
                   for block, f in zip(profile.blocks, factors))
    return dataclasses.replace(profile, blocks=blocks)


class CalibrationWindow:
    """The first steady steps of one placement, per rank: what `BlockCalibration.observe` is fed.

    After ``warmup_steps`` steps, each rank collects ``steps`` compute samples; its measurement
    is their median over the profile's prediction, its device's ``slowdowns`` entry (alpha as
    known when the placement began) divided out. A rank the detector flags (slow) at any step of
    its window or of the ``hold_steps`` after it (the detector's latency: a slowdown that began
    inside the window is flagged only later) is dropped for this placement: its device is slow
    or its speed moved, and the samples say nothing certain of its blocks. Each rank is
    measured once."""

    def __init__(self, placement: Placement, predicted_s: Sequence[float], slowdowns: Sequence[float],
                 warmup_steps: int, steps: int, hold_steps: int = 0) -> None:
        for name, value, low in (("warmup_steps", warmup_steps, 0), ("steps", steps, 1), ("hold_steps", hold_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CalibrationError(f"{name}={value!r} must be an integer >= {low}")
        k = placement.num_stages
        for name, values in (("predicted_s", predicted_s), ("slowdowns", slowdowns)):
            if len(values) != k:
                raise CalibrationError(f"{name} has {len(values)} entries for {k} stages; give one per rank")
        self.placement, self.warmup_steps, self.steps, self.hold_steps = placement, warmup_steps, steps, hold_steps
        for rank, p in enumerate(predicted_s):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
                raise CalibrationError(f"predicted_s[{rank}]={p!r} must be a finite number of seconds >= 0")
        self.predicted_s = [float(p) for p in predicted_s]
        self.slowdowns = [_positive(f"slowdowns[{r}]", a) for r, a in enumerate(slowdowns)]
        self.samples: list[list[float]] = [[] for _ in range(k)]
        self.held: list[int] = [0] * k  # steps seen since the rank's samples were complete
        # Ranks measured or dropped; a stage the profile says costs nothing has no ratio to measure.
        self.closed: set[int] = {r for r, p in enumerate(self.predicted_s) if p == 0}
        self.seen = 0

    def add(self, compute_s: Sequence[float], flagged: Sequence[bool]) -> list[StageMeasurement]:
        """One step's per-rank compute and the detector's verdicts; the ranks whose window ends now."""
        k = self.placement.num_stages
        if len(compute_s) != k or len(flagged) != k:
            raise CalibrationError(f"a step of {len(compute_s)} compute values / {len(flagged)} verdicts for "
                                   f"a placement of {k} stages; give one per rank")
        self.seen += 1
        done = []
        for rank in range(k):
            if rank in self.closed:
                continue
            if flagged[rank]:
                self.closed.add(rank)  # its device is slow, or its speed changed inside the window
                continue
            if self.seen <= self.warmup_steps:
                continue
            if len(self.samples[rank]) < self.steps:
                self.samples[rank].append(float(compute_s[rank]))
            else:
                self.held[rank] += 1
            if len(self.samples[rank]) == self.steps and self.held[rank] == self.hold_steps:
                self.closed.add(rank)
                measured = median(self.samples[rank])
                if measured > 0:
                    done.append(StageMeasurement(self.placement.teacher_range(rank), self.placement.student_range(rank),
                                                 self.predicted_s[rank], measured, self.slowdowns[rank]))
        return done

    @property
    def finished(self) -> bool:
        return len(self.closed) == self.placement.num_stages


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
            self._priced = self.factors.calibrated(self.planner) if self.factors.observations else self.planner
        return self._priced

    def begin(self, placement: Placement, slowdowns: Sequence[float]) -> None:
        """A new placement runs; ``slowdowns``: each stage's device alpha as known now (divided out)."""
        # Replicas repeat replica 0's blocks: its pipeline is the one measured (``observe`` gets its ranks).
        k = placement.stages_in(0)
        predicted = self.planner.layout_cost(placement).compute_s[:k]
        self._window = CalibrationWindow(placement.pipeline(0), predicted, list(slowdowns)[:k], *self.window_steps)

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
        if self._window is None:
            raise CalibrationError("describe() names the stages of the running placement: call begin() first")
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
