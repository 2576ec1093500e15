"""Per-device compute (alpha) and communication (beta) slowdown factors.

Pure: measured per-rank seconds and the cost model's predicted per-rank seconds
in, one alpha and one beta per device out (1.0 = as fast as the profile says).

For each step and each rank r, running on device g::

    ratio = measured_s[r] / predicted_s[r]                  (compute and comm alike)
    alpha_g = ratio / reference_compute,  beta_g = ratio / reference_comm

The reference makes the estimate independent of where the profile was taken:
a profile measured on a faster machine, or per micro-batch instead of per step,
makes every ratio off by the same factor, which must not read as a slowdown.
After ``warmup_steps`` (ignored), ``baseline_steps`` steps give each device its
median ratio, and the reference is the median of those over the devices. The
median over devices is robust while fewer than half the devices are slow at
the start; with two devices it is their mean, so one device slow from the start
shifts both alphas half way. Each kind (compute, comm) has its own baseline,
counted in steps that measured it (comm may appear only later, after a
re-partition gives a rank a successor).

Smoothing: each device keeps the last ``median_window`` normalised ratios, and
their median (a single-step spike cannot move it) feeds an EMA of weight
``ema_weight``. Samples are clipped to [min_alpha, max_alpha] (and the beta
bounds): below 1 is allowed, a device may be faster than the reference (a
heterogeneous cluster), but not absurdly so after a glitch (default 0.25, so the
planner never loads a device with more than 4x its share on such evidence);
the default upper bound 20 keeps costs finite: a device slower than that is
effectively failed and dropping it (DEGRADE) is the planner's answer.

Contract for the predictions:

* at nominal speed (``DeviceSpec(alpha=1, beta=1)``), or a slowdown already
  planned for is divided out and reads as 1, and the next plan forgets it;
* a rank whose predicted time is below ``min_predicted_s`` is not measured (the
  last stage sends nothing; infinite bandwidth predicts no comm): its factor
  keeps its last value, 1.0 at first;
* nor, for compute, a rank predicted below ``min_predicted_share`` of the median rank's
  compute: a stage of a block or two (e.g. the heads a re-plan leaves on a slow device)
  takes mostly what the block profiles do not hold (dispatching each part, the loss), so
  measured over predicted there reads as a slowdown many times the real one (a 3x slow
  device read 18x on CPU ranks, and the factor went on to every plan and report);
* measured comm includes waiting for peers while the cost model predicts
  transfers, so beta reads waiting as well; the reference removes the part
  common to all ranks, not per-rank differences in waiting.

Own transfer time (``comm_is_transfer=True``): when measured comm is each link's own send
time (no waiting in it) and the prediction is the cost model's transfer time of the bytes
the link carries (no latency), beta is read as a bandwidth slowdown::

    beta_g = 1 + max(0, measured_s - healthy_s[g]) / predicted_s

``healthy_s[g]`` is the link's lower-quartile own time over its first
``transfer_baseline_steps`` measured steps (posting overhead a healthy link pays whatever it
carries; the lower quartile stays healthy if a fault starts inside them). That is the
detector's baseline window, so beta is mostly known by the time the detector blames a link.
A link that moves bytes k times slower then reads about k whatever the cuts, so the
planner's price of each cut (bytes x beta / bandwidth) holds after a re-plan too. No
reference: the excess is already in the prediction's units.
The default upper bound is 1000: a link between processes of one host is ~4 GB/s, and
one a thousand times slower (4 MB/s) still moves a small activation.

Level shifts (`mark_shift`): smoothing reads a step change slowly (a 3x device read 1.6x ten
steps after the detector saw 3.4x; the re-plan priced on that under-corrected). When the detector
reports a device's compute level changed at an onset step, its alpha becomes the median of the
samples since then; inside the baseline phase, at the phase's end (not earlier: the block
calibration beside it rescales the predictions first), the samples before the onset making its
share of the reference. A device slow from the start has no samples before its onset, and alone
(K = 1) it would be its own reference: when the detector judged it against the plan, the
reference its verdict implies ends the phase at once (`assume_compute_reference`).

State is keyed by device id (an int, like `synapse.decision.eta.DeviceId`), not by
rank: alpha is a property of the device, and survives re-partitions unchanged.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
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


STATE_VERSION = 1
HISTORY_STEPS = 64  # raw samples kept per device for `mark_shift` (a detector's onset lies within)


@dataclass
class _Factor:
    """One device's smoothed factor of one kind."""

    window: int
    value: float | None = None  # None until the first smoothed sample
    recent: deque[float] = field(init=False)  # last normalised, clipped ratios

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.window)


class _Kind:
    """Reference and per-device factors of one kind (compute or comm)."""

    def __init__(self, config: EstimatorConfig, kind: str) -> None:
        self.config, self.kind = config, kind
        self.reference: float | None = None
        self.baseline: dict[int, list[float]] = {}  # device -> raw ratios of the baseline phase
        self.baseline_steps = 0
        self.factors: dict[int, _Factor] = {}
        self.healthy: dict[int, float] = {}  # transfer mode: each link's own send seconds when healthy
        self.history: dict[int, deque[float]] = {}  # device -> its latest raw ratios (level shifts)
        self.pending_shifts: dict[int, int] = {}  # device -> index in its baseline of its first sample after an onset

    def observe(self, ratios: Mapping[int, float]) -> None:
        """Raw measured / predicted ratios of one step, for the devices measured."""
        if not ratios:
            return
        for device, ratio in ratios.items():
            self.history.setdefault(device, deque(maxlen=HISTORY_STEPS)).append(ratio)
        if self.reference is None:
            self._collect(ratios)
            return
        for device, ratio in ratios.items():
            self._smooth(device, ratio / self.reference)

    def _collect(self, ratios: Mapping[int, float]) -> None:
        for device, ratio in ratios.items():
            self.baseline.setdefault(device, []).append(ratio)
        self.baseline_steps += 1
        if self.baseline_steps >= self.config.baseline_steps:
            self.end_baseline()

    def end_baseline(self, reference: float | None = None) -> None:
        """The baseline phase ends: the reference is ``reference`` if given (known from elsewhere),
        else the median over devices of their samples' medians."""
        # a device whose level changed inside the baseline: its samples since the onset are its level,
        # the ones before it its share of the reference
        shifted = {device: len(self.baseline.get(device, ())) - first for device, first in self.pending_shifts.items()}
        shifted = {device: n for device, n in shifted.items() if n >= self.config.min_shift_samples}
        self.pending_shifts = {}
        before = {device: values[:len(values) - shifted.get(device, 0)] for device, values in self.baseline.items()}
        device_medians = {device: median(values) for device, values in before.items() if values}
        self.baseline, self.baseline_steps, baseline = {}, 0, self.baseline
        if reference is None:
            if not device_medians or median(device_medians.values()) <= 0:
                return  # nothing was measured (e.g. comm timed as 0): start the baseline again
            reference = median(device_medians.values())
        self.reference = reference
        for device, values in baseline.items():
            level = median(values[-shifted[device]:]) if device in shifted else device_medians.get(device)
            if level is not None:
                self.factors[device] = _Factor(self.config.median_window, self._clip(level / self.reference))

    def shift(self, device: int, samples: int) -> bool:
        """Read the factor from the device's latest ``samples`` alone (see `mark_shift`)."""
        if self.reference is None:
            self.pending_shifts[device] = max(0, len(self.baseline.get(device, ())) - samples)
            return False
        recent = list(self.history.get(device, ()))[-samples:]
        if len(recent) < self.config.min_shift_samples:
            return False
        factor = self.factors.setdefault(device, _Factor(self.config.median_window))
        normalised = [self._clip(r / self.reference) for r in recent]
        factor.recent = deque(normalised[-factor.window:], maxlen=factor.window)
        factor.value = median(normalised)
        return True

    def _smooth(self, device: int, normalised: float) -> None:
        factor = self.factors.setdefault(device, _Factor(self.config.median_window))
        factor.recent.append(self._clip(normalised))
        if len(factor.recent) < self.config.median_window:
            return  # too few samples for a median a spike cannot move
        sample = median(factor.recent)
        weight = self.config.ema_weight
        factor.value = sample if factor.value is None else factor.value + weight * (sample - factor.value)

    def _clip(self, value: float) -> float:
        low, high = self.config.bounds(self.kind)
        return min(max(value, low), high)

    def rescale(self, device: int, scale: float) -> None:
        """The device's predictions are now ``scale`` times what they were: re-express its ratios."""
        if device in self.baseline:
            self.baseline[device] = [r / scale for r in self.baseline[device]]
        if device in self.history:
            self.history[device] = deque((r / scale for r in self.history[device]), maxlen=HISTORY_STEPS)
        factor = self.factors.get(device)
        if factor is not None:
            factor.recent = deque((r / scale for r in factor.recent), maxlen=factor.window)
            factor.value = None if factor.value is None else factor.value / scale

    def value(self, device: int) -> float:
        factor = self.factors.get(device)
        return 1.0 if factor is None or factor.value is None else factor.value

    def observe_transfer(self, samples: Mapping[int, tuple[float, float]]) -> None:
        """(measured own transfer s, predicted transfer s) of one step per device (module docstring)."""
        if not samples:
            return
        if self.reference is None:
            for device, (measured, _) in samples.items():
                self.baseline.setdefault(device, []).append(measured)
            self.baseline_steps += 1
            if self.baseline_steps >= self.config.transfer_baseline_steps:
                self.healthy = {device: _lower_quartile(values) for device, values in self.baseline.items()}
                self.baseline, self.baseline_steps, self.reference = {}, 0, 1.0
                self.factors = {device: _Factor(self.config.median_window) for device in self.healthy}
            return
        for device, (measured, predicted) in samples.items():
            healthy = self.healthy.setdefault(device, measured)
            self._smooth(device, 1.0 + max(0.0, measured - healthy) / predicted)

    def state_dict(self) -> dict[str, Any]:
        return {
            "healthy": [[device, value] for device, value in sorted(self.healthy.items())],
            "reference": self.reference,
            "baseline_steps": self.baseline_steps,
            "baseline": [[device, list(values)] for device, values in sorted(self.baseline.items())],
            "factors": [[device, f.value] for device, f in sorted(self.factors.items())],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        reference = state["reference"]
        if reference is not None and not (_is_number(reference) and reference > 0):
            raise ValueError(f"reference={reference!r} must be a number > 0 or null")
        self.reference = reference
        self.healthy = {_device_id(device): float(value) for device, value in state.get("healthy", [])}
        self.baseline_steps = int(state["baseline_steps"])
        self.baseline = {_device_id(device): [float(v) for v in values] for device, values in state["baseline"]}
        # Smoothing windows are not saved: they would hold the previous process's last steps.
        self.factors = {_device_id(device): _Factor(self.config.median_window, None if value is None else float(value))
                        for device, value in state["factors"]}


def _lower_quartile(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


def _device_id(device: Any) -> int:
    if isinstance(device, bool) or not isinstance(device, int):
        raise EstimatorInputError(f"device id {device!r} must be an int (see synapse.decision.eta.DeviceId)")
    return device


def _check_seconds(name: str, values: Sequence[float], expected: int) -> list[float]:
    values = list(values)
    if len(values) != expected:
        raise EstimatorInputError(f"{name} has {len(values)} entries; give one per rank ({expected}, as in devices)")
    # plain finite floats >= 0 (what every step gives) pass in one C-level check, the rest value by value
    if set(map(type, values)) == {float} and all(map(math.isfinite, values)) and min(values) >= 0:
        return values
    for rank, value in enumerate(values):
        if not (_is_number(value) and value >= 0):
            raise EstimatorInputError(f"{name}[{rank}]={value!r} must be a finite number of seconds >= 0")
    return [float(v) for v in values]


class AlphaBetaEstimator:
    """Feed `update` once per step; read `alphas()` / `betas()` for the planner."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config if config is not None else EstimatorConfig()
        self._kinds = {kind: _Kind(self.config, kind) for kind in KINDS}
        self._steps_since_start = 0

    def update(self, *, devices: Sequence[int], measured_compute_s: Sequence[float],
               measured_comm_s: Sequence[float], predicted_compute_s: Sequence[float],
               predicted_comm_s: Sequence[float], comm_is_transfer: bool = False) -> None:
        """One step. ``devices[r]`` is the device of rank r; the other sequences are
        per rank, predictions at nominal speed (see the module docstring). ``comm_is_transfer``:
        measured comm is each link's own send time and predicted its bytes' transfer time."""
        devices = [_device_id(d) for d in devices]
        if not devices or len(set(devices)) != len(devices):
            raise EstimatorInputError(f"devices={devices!r} must list one distinct device id per rank")
        width = len(devices)
        measured = {COMPUTE: _check_seconds("measured_compute_s", measured_compute_s, width),
                    COMM: _check_seconds("measured_comm_s", measured_comm_s, width)}
        predicted = {COMPUTE: _check_seconds("predicted_compute_s", predicted_compute_s, width),
                     COMM: _check_seconds("predicted_comm_s", predicted_comm_s, width)}
        self._steps_since_start += 1
        if self._steps_since_start <= self.config.warmup_steps:
            return
        for kind, state in self._kinds.items():
            if kind == COMM and comm_is_transfer:
                state.observe_transfer({device: (m, p) for device, m, p in zip(devices, measured[kind], predicted[kind])
                                        if p >= self.config.min_predicted_s})
                continue
            floor = self.config.min_predicted_s
            if kind == COMPUTE:
                floor = max(floor, self.config.min_predicted_share * median(predicted[kind]))
            state.observe({device: m / p for device, m, p in zip(devices, measured[kind], predicted[kind])
                           if p >= floor})

    def rescale_compute(self, scales: Mapping[int, float]) -> None:
        """The predicted compute of each device in ``scales`` is now that many times what it was
        (the block profiles were calibrated): what was measured against the old predictions is
        re-expressed against the new, so alphas keep meaning "slower than predicted" and a
        profile error corrected in the blocks is not also read as a slow device. Every ratio is
        linear in 1 / prediction, so this equals having measured against the new ones from the
        start (baseline samples, smoothing window and smoothed value alike)."""
        for device, scale in scales.items():
            if not (_is_number(scale) and scale > 0):
                raise EstimatorInputError(f"scale of device {device!r} is {scale!r}; must be a finite number > 0")
            self._kinds[COMPUTE].rescale(_device_id(device), float(scale))

    def mark_shift(self, device: int, steps_since_onset: int) -> bool:
        """``device``'s compute level changed ``steps_since_onset`` measured steps ago (its latest
        samples, the onset's included): its alpha is now their median (module docstring). Whether it
        was re-read now: not inside the baseline phase, nor with < ``min_shift_samples`` samples."""
        if isinstance(steps_since_onset, bool) or not isinstance(steps_since_onset, int) or steps_since_onset < 1:
            raise EstimatorInputError(f"steps_since_onset={steps_since_onset!r} must be an integer >= 1")
        return self._kinds[COMPUTE].shift(_device_id(device), steps_since_onset)

    def assume_compute_reference(self, reference: float) -> bool:
        """The healthy measured / predicted compute ratio is known before the baseline phase ends:
        the detector found a device slow from the start against the plan and its peers, so the
        phase's median would hold that slowdown (a lone device's would be all of it, its alpha 1).
        The phase ends now, every device's factor its level against ``reference``. Whether it was
        taken (not once the reference is known)."""
        if not (_is_number(reference) and reference > 0):
            raise EstimatorInputError(f"reference={reference!r} must be a finite number > 0")
        state = self._kinds[COMPUTE]
        if state.reference is not None:
            return False
        state.end_baseline(float(reference))
        return True

    def reference(self, kind: str) -> float | None:
        """Median measured / predicted ratio of the baseline phase; None before it ends."""
        return self._kind(kind).reference

    @property
    def ready(self) -> bool:
        """Whether the compute reference is known (betas may still be 1.0 by default)."""
        return self._kinds[COMPUTE].reference is not None

    def alpha(self, device: int) -> float:
        return self._kinds[COMPUTE].value(_device_id(device))

    def beta(self, device: int) -> float:
        return self._kinds[COMM].value(_device_id(device))

    def alphas(self) -> dict[int, float]:
        """alpha of every device measured so far (unmeasured devices: assume 1.0)."""
        return {device: self.alpha(device) for device in sorted(self._kinds[COMPUTE].factors)}

    def betas(self) -> dict[int, float]:
        return {device: self.beta(device) for device in sorted(self._kinds[COMM].factors)}

    def _kind(self, kind: str) -> _Kind:
        if kind not in self._kinds:
            raise EstimatorInputError(f"kind={kind!r}; use one of {KINDS}")
        return self._kinds[kind]

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly: references, baseline samples, smoothed factors."""
        return {"version": STATE_VERSION, **{kind: state.state_dict() for kind, state in self._kinds.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`. The next ``warmup_steps`` steps are the restarted
        process's warm-up and are ignored; the smoothing windows start empty."""
        kinds = {kind: _Kind(self.config, kind) for kind in KINDS}
        try:
            if state["version"] != STATE_VERSION:
                raise ValueError(f"version {state['version']!r}, expected {STATE_VERSION}")
            for kind, kind_state in kinds.items():
                kind_state.load_state_dict(state[kind])
        except (KeyError, TypeError, ValueError) as error:
            raise EstimatorInputError(f"not an estimator state_dict() of version {STATE_VERSION}: {error}") from None
        self._kinds, self._steps_since_start = kinds, 0
