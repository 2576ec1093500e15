"""What one restart costs, and how the run learns it: ``RestartCost`` and ``RestartCostModel``.

The ETA of every restarting option (REPLAN, DEGRADE, REPLACE) starts with the seconds
its restart takes. They come from benchmarks (``experiments/bench_restart_cost.py``,
shipped as priors) and move towards the run's own restarts as they are measured, per
restart path ("restart": checkpoint, tear down, relaunch; "live": a re-plan without one)
and per component (save, teardown, launch, load, warm-up). ``costs_by_kind()`` is the
``restart_costs`` mapping ``synapse.decision.eta.build_options`` takes. Pure.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from synapse.decision.eta import RESTARTING_KINDS, EtaModelError, OptionKind, check_seconds, check_steps

DEFAULT_PATH = "restart"


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
            object.__setattr__(self, f.name, check_seconds(f.name, getattr(self, f.name)))

    @property
    def total_s(self) -> float:
        total_s: float = sum(getattr(self, name) for name in RESTART_COMPONENTS)
        return total_s

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
    "live" = a re-plan without a restart, with its own
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
        self.prior_weight = check_seconds("prior_weight", prior_weight)
        self._kind_paths = self._validated_kind_paths(kind_paths)
        self._sums = {p: dict.fromkeys(RESTART_COMPONENTS, 0.0) for p in self._defaults}
        self._counts = {p: dict.fromkeys(RESTART_COMPONENTS, 0) for p in self._defaults}

    def _validated_kind_paths(self, kind_paths: Mapping[OptionKind | str, str] | None) -> dict[OptionKind, str]:
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
            self._sums[path][name] += check_seconds(name, seconds)
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

    def costs_by_kind(self, restarting: Collection[OptionKind] = ()) -> dict[OptionKind, float]:
        """The ``restart_costs`` mapping that ``build_options`` takes. ``restarting``: kinds that take the
        restart path this time whatever their configured one (the workers cannot take them live: a launch
        under torchft, failover.replan_mode=restart)."""
        restart_s = self.estimate(DEFAULT_PATH).total_s
        return {kind: restart_s if kind in restarting and kind is not OptionKind.KEEP else self.seconds_for(kind)
                for kind in OptionKind}

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
                    fresh._sums[path][name] = check_seconds(f"{path}.{name} sum", sums[path][name])
                    fresh._counts[path][name] = check_steps(f"{path}.{name} count", counts[path][name])
        except KeyError as missing:
            raise EtaModelError(f"restart-cost state is missing key {missing}; pass a dict from state_dict()") from None
        self.__dict__.update(fresh.__dict__)
