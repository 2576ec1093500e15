"""ETA model: what each failover option would cost, in seconds of wall time.

    ETA(option) = restart_cost_s + remaining_steps * predicted_step_s

Options (``OptionKind``):

* KEEP    carry on as is; predicted step = the *measured* current step, no restart.
* REPLAN  same devices, partition re-planned for the current alphas/betas.
* DEGRADE the failed or slowest device dropped, K-1 devices, re-planned.
* REPLACE the bad device swapped for a spare (only when spares exist), re-planned.

Calibration: the planner's cost model is never exact. Its compute per block is
corrected where it matters for the cuts, per block, by the measured stages
(``synapse.planner.block_calibration``: the caller's ``plan_fn`` and prediction
come from the calibrated planner). What that leaves (framework overhead,
communication and waiting it does not model, ...) is one residual factor: KEEP
is measured, the others are predicted, so comparing them raw would compare two
different scales. We therefore ask the caller for the (calibrated) planner's
prediction of the partition that is running *now* (under the current
alphas/betas) and multiply every re-planned prediction by ``measured_step_s /
predicted_step_s`` of that partition. It is not the block factors again: the
prediction it divides by already holds them, so with a model that is right it
is 1. This assumes the remaining error is a common factor across partitions of
the same models, which is the best a single measurement can tell us.

Everything here is pure: numbers and dataclasses in, numbers and dataclasses
out. The partitioner enters as an injected ``plan_fn``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from .placement import Placement

DeviceId = int

# plan_fn(device_ids, alphas aligned with device_ids, betas as given)
#   -> (teacher_counts, student_counts, predicted_step_s)
PlanFn = Callable[
    [tuple[DeviceId, ...], tuple[float, ...], Any],
    tuple[Sequence[int], Sequence[int], float],
]

DEFAULT_PATH = "restart"
# A device that has never run (a spare) is assumed to run at nominal speed.
SPARE_DEFAULT_ALPHA = 1.0


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


def _check_seconds(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise EtaModelError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _check_positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise EtaModelError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_steps(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EtaModelError(f"{name} must be an integer >= 0, got {value!r}")
    return value


# --------------------------------------------------------------------------- restart cost


@dataclass(frozen=True)
class RestartCost:
    """Seconds spent on one restart, by component."""

    checkpoint_save_s: float = 0.0
    teardown_s: float = 0.0
    launch_s: float = 0.0
    checkpoint_load_s: float = 0.0
    warmup_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _check_seconds(f.name, getattr(self, f.name)))

    @property
    def total_s(self) -> float:
        return sum(getattr(self, name) for name in RESTART_COMPONENTS)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> RestartCost:
        _reject_unknown_components(data)
        return cls(**data)


RESTART_COMPONENTS: tuple[str, ...] = tuple(f.name for f in fields(RestartCost))


def _reject_unknown_components(data: Mapping[str, Any]) -> None:
    unknown = sorted(set(data) - set(RESTART_COMPONENTS))
    if unknown:
        raise EtaModelError(f"unknown restart-cost component(s) {unknown}; valid: {', '.join(RESTART_COMPONENTS)}")


class RestartCostModel:
    """Restart cost per *path*, starting from a calibrated default and learning
    from the restarts this run has done.

    A path is a way of restarting ("restart" = checkpoint, tear down, relaunch;
    a future "live" re-plan without restart gets its own path and its own
    measurements). ``kind_paths`` says which path each restarting option takes.

    Update rule, per path and per component c (pseudo-count mean):

        estimate_c = (w * default_c + sum of observed c) / (w + n_c)

    The default counts as ``w = prior_weight`` observations, so the estimate
    moves towards the measurements and is dominated by them after a few
    restarts (with w = 1: half-way after one, 3/4 after three). w = 0 trusts the
    first observation completely. Components are counted separately so an
    observation may omit a component it could not measure (a crash restart has
    no checkpoint save).
    """

    def __init__(self, defaults: RestartCost | Mapping[str, RestartCost], *, prior_weight: float = 1.0,
                 kind_paths: Mapping[OptionKind | str, str] | None = None) -> None:
        if isinstance(defaults, RestartCost):
            defaults = {DEFAULT_PATH: defaults}
        if not defaults:
            raise EtaModelError("RestartCostModel needs a default cost for at least one path")
        for path, cost in defaults.items():
            if not isinstance(cost, RestartCost):
                raise EtaModelError(f"default for path {path!r} must be a RestartCost, got {cost!r}")
        self._defaults = dict(defaults)
        self.prior_weight = _check_seconds("prior_weight", prior_weight)
        self._kind_paths = self._validated_kind_paths(kind_paths)
        self._sums = {p: dict.fromkeys(RESTART_COMPONENTS, 0.0) for p in self._defaults}
        self._counts = {p: dict.fromkeys(RESTART_COMPONENTS, 0) for p in self._defaults}

    def _validated_kind_paths(self, kind_paths: Mapping[OptionKind | str, str] | None) -> dict:
        first_path = DEFAULT_PATH if DEFAULT_PATH in self._defaults else next(iter(self._defaults))
        resolved = dict.fromkeys(RESTARTING_KINDS, first_path)
        for kind, path in (kind_paths or {}).items():
            kind = OptionKind.parse(kind)
            if kind is OptionKind.KEEP:
                raise EtaModelError("KEEP has no restart, so it cannot be given a restart path")
            self._require_path(path)
            resolved[kind] = path
        return resolved

    def _require_path(self, path: str) -> None:
        if path not in self._defaults:
            raise EtaModelError(f"unknown restart path {path!r}; known paths: {sorted(self._defaults)}")

    @classmethod
    def from_benchmark(cls, data: Mapping[str, Any], **kwargs: Any) -> RestartCostModel:
        """Build from a benchmark JSON dict.

        Accepted forms: ``{"paths": {name: {component: seconds}}, "prior_weight": w, ...}``
        (other top-level keys are metadata and ignored) or a flat
        ``{component: seconds}`` dict, which calibrates the "restart" path.
        """
        if "paths" in data:
            paths = data["paths"]
            if not isinstance(paths, Mapping) or not paths:
                raise EtaModelError(f"benchmark 'paths' must be a non-empty dict, got {paths!r}")
            if "prior_weight" in data:
                kwargs.setdefault("prior_weight", data["prior_weight"])
            defaults = {name: RestartCost.from_dict(comps) for name, comps in paths.items()}
            return cls(defaults, **kwargs)
        return cls(RestartCost.from_dict(data), **kwargs)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._defaults)

    def observe(self, path: str, measured: RestartCost | Mapping[str, float]) -> None:
        """Record the measured components of one restart taken along ``path``."""
        self._require_path(path)
        if isinstance(measured, RestartCost):
            measured = measured.to_dict()
        _reject_unknown_components(measured)
        for name, seconds in measured.items():
            self._sums[path][name] += _check_seconds(name, seconds)
            self._counts[path][name] += 1

    def observations(self, path: str = DEFAULT_PATH) -> int:
        """Number of restarts observed on ``path`` (most-observed component)."""
        self._require_path(path)
        return max(self._counts[path].values())

    def estimate(self, path: str = DEFAULT_PATH) -> RestartCost:
        self._require_path(path)
        default, sums, counts = self._defaults[path], self._sums[path], self._counts[path]
        values = {}
        for name in RESTART_COMPONENTS:
            n = counts[name]
            prior = getattr(default, name)
            values[name] = prior if n == 0 else (self.prior_weight * prior + sums[name]) / (self.prior_weight + n)
        return RestartCost(**values)

    def seconds_for(self, kind: OptionKind | str) -> float:
        kind = OptionKind.parse(kind)
        if kind is OptionKind.KEEP:
            return 0.0
        return self.estimate(self._kind_paths[kind]).total_s

    def costs_by_kind(self) -> dict[OptionKind, float]:
        """The ``restart_costs`` mapping that ``build_options`` takes."""
        return {kind: self.seconds_for(kind) for kind in OptionKind}

    def state_dict(self) -> dict[str, Any]:
        return {
            "prior_weight": self.prior_weight,
            "defaults": {p: c.to_dict() for p, c in self._defaults.items()},
            "kind_paths": {k.value: p for k, p in self._kind_paths.items()},
            "observed_sum_s": {p: dict(s) for p, s in self._sums.items()},
            "observed_count": {p: dict(c) for p, c in self._counts.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            defaults = {p: RestartCost.from_dict(c) for p, c in state["defaults"].items()}
            fresh = RestartCostModel(defaults, prior_weight=state["prior_weight"], kind_paths=state["kind_paths"])
            sums, counts = state["observed_sum_s"], state["observed_count"]
            for path in fresh.paths:
                _reject_unknown_components(sums[path])
                _reject_unknown_components(counts[path])
                for name in RESTART_COMPONENTS:
                    fresh._sums[path][name] = _check_seconds(f"{path}.{name} sum", sums[path][name])
                    fresh._counts[path][name] = _check_steps(f"{path}.{name} count", counts[path][name])
        except KeyError as missing:
            raise EtaModelError(f"restart-cost state is missing key {missing}; pass a dict from state_dict()") from None
        self.__dict__.update(fresh.__dict__)


# --------------------------------------------------------------------------- options


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
        _check_positive("measured_step_s", self.measured_step_s)
        _check_positive("predicted_step_s", self.predicted_step_s)

    @property
    def devices(self) -> tuple[DeviceId, ...]:
        return self.placement.devices

    @property
    def calibration(self) -> float:
        """Factor that puts the planner's predictions on the measured scale (the residual of a
        block-calibrated planner; see the module docstring)."""
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
        _check_positive("predicted_step_s", self.predicted_step_s)
        _check_seconds("restart_cost_s", self.restart_cost_s)
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
        _check_steps("remaining_steps", remaining_steps)
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


def build_options(current: RunningPartition, alphas: Mapping[DeviceId, float], betas: Any,
                  bad_device: DeviceId | None, plan_fn: PlanFn, restart_costs: Mapping[OptionKind, float],
                  spare_devices: Sequence[DeviceId] = (), lost_devices: Sequence[DeviceId] = ()) -> list[Option]:
    """All options open to the run now: KEEP, REPLAN, DEGRADE (K > 1), REPLACE (spares).

    ``alphas`` maps device id -> slowdown factor (1.0 = nominal); it must cover
    the running devices, spares missing from it are assumed nominal.
    ``betas`` is passed through to ``plan_fn`` untouched: its shape belongs to
    the partitioner. ``bad_device`` is the failed or slowest device (None: the
    device with the largest alpha). Re-planned step predictions are multiplied
    by ``current.calibration`` (see module docstring). ``lost_devices``: devices gone with the bad
    one (a node lost with all its devices): DEGRADE drops them too, and no REPLACE is offered.
    """
    running_alphas = {d: _alpha_of(alphas, d, required=True) for d in current.devices}
    bad = _resolve_bad_device(current.devices, running_alphas, bad_device)
    spares = _check_spares(spare_devices, current.devices)
    options = [_keep_option(current)]
    candidates: list[tuple[OptionKind, tuple[DeviceId, ...], dict[str, Any]]] = [
        (OptionKind.REPLAN, current.devices, {})
    ]
    survivors = tuple(d for d in current.devices if d != bad and d not in lost_devices)
    if survivors:
        dropped = {"dropped_devices": [d for d in current.devices if d not in survivors]} if lost_devices else {}
        candidates.append((OptionKind.DEGRADE, survivors, {"dropped_device": bad, **dropped}))
    if spares and not lost_devices:
        spare = min(spares, key=lambda d: _alpha_of(alphas, d, required=False))
        swapped = tuple(spare if d == bad else d for d in current.devices)
        candidates.append((OptionKind.REPLACE, swapped, {"replaced_device": bad, "spare_device": spare}))
    for kind, devices, extra in candidates:
        restart_s = _restart_seconds(restart_costs, kind)
        options.append(_replanned_option(kind, devices, current, alphas, betas, plan_fn, restart_s, extra))
    return options


def _alpha_of(alphas: Mapping[DeviceId, float], device: DeviceId, *, required: bool) -> float:
    if device not in alphas:
        if required:
            raise EtaModelError(f"alphas has no entry for running device {device!r}; got alphas for {sorted(alphas)}")
        return SPARE_DEFAULT_ALPHA
    return _check_positive(f"alpha of device {device!r}", alphas[device])


def _resolve_bad_device(devices: tuple[DeviceId, ...], alphas: Mapping[DeviceId, float],
                        bad_device: DeviceId | None) -> DeviceId:
    if bad_device is None:
        return max(devices, key=lambda d: alphas[d])  # ties: the first listed
    if bad_device not in devices:
        raise EtaModelError(f"bad_device {bad_device!r} is not one of the running devices {devices}")
    return bad_device


def _check_spares(spares: Sequence[DeviceId], running: tuple[DeviceId, ...]) -> tuple[DeviceId, ...]:
    spares = tuple(spares)
    overlap = sorted(set(spares) & set(running))
    if overlap:
        raise EtaModelError(f"spare devices {overlap} are already running {running}; spares must be idle devices")
    if len(set(spares)) != len(spares):
        raise EtaModelError(f"spare_devices {spares} contain duplicates")
    return spares


def _restart_seconds(restart_costs: Mapping[OptionKind, float], kind: OptionKind) -> float:
    if kind not in restart_costs:
        raise EtaModelError(f"restart_costs has no entry for {kind.value!r}; pass RestartCostModel.costs_by_kind()")
    return _check_seconds(f"restart cost of {kind.value}", restart_costs[kind])


def _keep_option(current: RunningPartition) -> Option:
    return Option(
        kind=OptionKind.KEEP,
        placement=current.placement,
        predicted_step_s=current.measured_step_s,
        restart_cost_s=0.0,
        inputs={"measured_step_s": current.measured_step_s, "planner_step_s": current.predicted_step_s},
    )


def _replanned_option(kind: OptionKind, devices: tuple[DeviceId, ...], current: RunningPartition,
                      alphas: Mapping[DeviceId, float], betas: Any, plan_fn: PlanFn, restart_s: float,
                      extra: dict[str, Any]) -> Option:
    device_alphas = tuple(_alpha_of(alphas, d, required=False) for d in devices)
    teacher, student, planner_step_s = plan_fn(devices, device_alphas, betas)
    teacher, student = tuple(teacher), tuple(student)
    _check_plan_output(kind, devices, teacher, student, planner_step_s, current)
    return Option(
        kind=kind,
        placement=Placement(devices, teacher, student),
        predicted_step_s=planner_step_s * current.calibration,
        restart_cost_s=restart_s,
        inputs={"alphas": list(device_alphas), "planner_step_s": planner_step_s,
                "calibration": current.calibration, **extra},
    )


def _check_plan_output(kind: OptionKind, devices: tuple, teacher: tuple, student: tuple, step_s: float,
                       current: RunningPartition) -> None:
    what = f"plan_fn for {kind.value} on devices {devices}"
    if len(teacher) != len(devices) or len(student) != len(devices):
        raise EtaModelError(f"{what}: {len(devices)} devices but {len(teacher)} teacher counts {teacher} and "
                            f"{len(student)} student counts {student}; need one count per device")
    _check_positive(f"{what}: predicted step", step_s)
    running = current.placement
    if sum(teacher) != sum(running.teacher_counts) or sum(student) != sum(running.student_counts):
        raise EtaModelError(
            f"{what} placed {sum(teacher)} teacher / {sum(student)} student blocks, but the running "
            f"partition has {sum(running.teacher_counts)} / {sum(running.student_counts)}; "
            "a re-plan must place every block exactly once"
        )
