"""What the slowdown detector says and is set with: its settings, its events, its errors, and
the checks of its inputs (pure; `synapse.monitor.detector` explains the rules)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from synapse.monitor.timing import StepTiming

COMPUTE, COMM = "compute", "comm"
KINDS = (COMPUTE, COMM)
SLOWDOWN, RECOVERY = "slowdown", "recovery"


class DetectorConfigError(ValueError):
    """A detector setting is out of range (the message names it and the fix)."""


class DetectorInputError(ValueError):
    """A record, state dict or rebase argument does not fit the detector's state."""


def _check_number(name: str, value: Any, minimum: float, *, integer: bool = False,
                  strict: bool = False, hint: str = "") -> None:
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):
        what = "an integer" if integer else "a finite number"
        raise DetectorConfigError(f"{name}={value!r} must be {what} {'>' if strict else '>='} {minimum}{hint}")


@dataclass(frozen=True)
class DetectorConfig:
    """Settings of `SlowdownDetector` (roles: see the module docstring)."""

    warmup_steps: int = 10
    baseline_window: int = 15
    refine_window: int = 200
    compute_noise_z: float = 5.0  # a compute ratio must be this many sd of a window median above 1
    comm_baseline_window: int = 30  # comm's noise (spread) needs more samples than compute's level
    prior_threshold: float | None = 4.0
    # A rank with no peers (K = 1): learnt compute this many times the plan's = slow from the start.
    # Off by default: on CPU the plan's absolute error is large (the demo's K = 1 stage measured
    # 1.58x its profile, no fault); trainer=gpu sets it (synapse/monitor/baseline.py says why).
    alone_threshold: float | None = None
    window: int = 10
    threshold: float = 1.25
    peer_threshold: float | None = 1.15
    # A rank must also be further above its peers than its own wander has been: this many sd of
    # its window median's ratio to its peers over its calm steps (`synapse.monitor.wander`;
    # CPU ranks drift). None: peer_threshold alone.
    peer_wander_z: float | None = 5.0
    sustain: int = 3
    # Also judge compute on where the window stands now (its Theil-Sen projection to the latest
    # step, `synapse.monitor.trend`), so a device degrading gradually is seen as it crosses the
    # threshold, not half a window later. False: the window median alone.
    trend: bool = True
    min_comm_s: float = 0.005
    wait_explain_factor: float = 2.0

    def __post_init__(self) -> None:
        _check_number("warmup_steps", self.warmup_steps, 0, integer=True)
        for name in ("baseline_window", "comm_baseline_window", "window", "sustain"):
            _check_number(name, getattr(self, name), 1, integer=True)
        _check_number("refine_window", self.refine_window, 0, integer=True, hint=" (0: never refine)")
        _check_number("compute_noise_z", self.compute_noise_z, 0.0, hint=" (e.g. 5; 0: no noise floor)")
        if self.prior_threshold is not None:
            _check_number("prior_threshold", self.prior_threshold, 1.0, strict=True,
                          hint=" (e.g. 4.0: 4x its peers against the plan; None: no prior)")
        if self.alone_threshold is not None:
            _check_number("alone_threshold", self.alone_threshold, 1.0, strict=True,
                          hint=" (e.g. 1.5: a lone device 1.5x the plan; None: no check)")
        _check_number("threshold", self.threshold, 1.0, strict=True, hint=" (e.g. 1.25: 25% slower)")
        if self.peer_threshold is not None:
            _check_number("peer_threshold", self.peer_threshold, 1.0, hint=" (e.g. 1.15; None: no peer check)")
        if self.peer_wander_z is not None:
            _check_number("peer_wander_z", self.peer_wander_z, 0.0, hint=" (e.g. 3; None: peer_threshold alone)")
        if not isinstance(self.trend, bool):
            raise DetectorConfigError(f"trend={self.trend!r} must be true or false")
        if self.trend and self.window < 2:
            raise DetectorConfigError(f"window={self.window} is too short for trend=true (a line needs >= 2 "
                                      "steps); raise window or set trend=false")
        _check_number("min_comm_s", self.min_comm_s, 0.0, hint=" seconds (e.g. 0.005)")
        _check_number("wait_explain_factor", self.wait_explain_factor, 0.0, hint=" (e.g. 2.0; 0 disables)")

    @property
    def recover_below(self) -> float:
        return 1.0 + (self.threshold - 1.0) / 2.0

    @property
    def history_len(self) -> int:
        """Steps kept for evaluation and onset estimation."""
        return 4 * self.window + self.sustain


@dataclass(frozen=True)
class Detection:
    """A slowdown, or the recovery from one, of one rank's compute or comm."""

    rank: int
    kind: str  # COMPUTE or COMM
    event: str  # SLOWDOWN or RECOVERY
    ratio: float  # windowed ratio to the baseline when the event fired
    onset_step: int  # first step of the sustained change (estimated)
    detected_step: int
    latency_steps: int
    latency_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Detection:
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise DetectorInputError(f"detection record lacks {missing}; required keys: {names}")
        return cls(**{name: data[name] for name in names})


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise DetectorInputError(f"kind={kind!r}; use one of {KINDS}")
    return kind


def check_next_step(timing: StepTiming, last_step: int | None, num_ranks: int | None) -> None:
    """``timing`` may follow ``last_step`` of a detector tracking ``num_ranks`` (None: none yet)."""
    if not isinstance(timing, StepTiming):
        raise DetectorInputError(f"update() takes a StepTiming, got {type(timing).__name__}")
    if last_step is not None and timing.step <= last_step:
        raise DetectorInputError(
            f"step {timing.step} arrived after step {last_step}; records must come in "
            "increasing step order (after a restart, load the detector state saved with the checkpoint)")
    if num_ranks is not None and timing.num_ranks != num_ranks:
        raise DetectorInputError(
            f"step {timing.step} has {timing.num_ranks} ranks but the detector tracks "
            f"{num_ranks}; after a re-partition call rebase(..., previous_rank=...)")


def check_rebase(old_ranks: int, previous_rank: Sequence[int] | None, compute_scale: Sequence[float],
                 comm_scale: Sequence[float] | None, relearn: Sequence[int], fresh: Sequence[int]
                 ) -> tuple[list[int], list[float], list[float] | None, tuple[int, ...], tuple[int, ...]]:
    """`SlowdownDetector.rebase`'s arguments, checked: (mapping, compute_scale, comm_scale, relearn, fresh)."""
    mapping = _check_mapping(previous_rank, old_ranks)
    new = len(mapping)
    return (mapping, _check_scales("compute_scale", compute_scale, new),
            None if comm_scale is None else _check_scales("comm_scale", comm_scale, new),
            _check_relearn(relearn, new), _check_relearn(fresh, new, "fresh"))


def _check_mapping(previous_rank: Sequence[int] | None, old_ranks: int) -> list[int]:
    if previous_rank is None:
        return list(range(old_ranks))
    mapping = list(previous_rank)
    valid = all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < old_ranks for r in mapping)
    if not mapping or not valid or len(set(mapping)) != len(mapping):
        raise DetectorInputError(
            f"previous_rank={mapping!r} must give each new rank a distinct old rank in 0..{old_ranks - 1}")
    return mapping


def _check_scales(name: str, scales: Sequence[float], num_ranks: int) -> list[float]:
    values = list(scales)
    if len(values) != num_ranks:
        raise DetectorInputError(f"{name} has {len(values)} entries; give one per new rank ({num_ranks})")
    for rank, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DetectorInputError(f"{name}[{rank}]={value!r} must be a finite number > 0 (new / old predicted time)")
    return [float(v) for v in values]


def _check_relearn(ranks: Sequence[int], num_ranks: int, name: str = "relearn") -> tuple[int, ...]:
    ranks = tuple(ranks)
    if any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < num_ranks for r in ranks):
        raise DetectorInputError(f"{name}={list(ranks)!r} must list new ranks in 0..{num_ranks - 1}")
    return ranks
