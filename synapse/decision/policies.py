"""Decision policies: given the options and what the monitors saw, KEEP, REPLAN, DEGRADE or REPLACE?

What a policy sees at one decision point and what it answers: ``DecisionContext`` and
``Decision``. A policy holds no state between calls: what it must remember (consecutive
detections, time lost, actions already taken in this slowdown) comes in the
``DecisionContext``, which the controller keeps and carries across restarts, so a
policy can be swapped, replayed from a log or restarted without losing anything.
The ``Decision`` it returns carries every option it weighed and why it chose one
(``to_dict``: a line of the decisions log).

Every policy has one shape (``Policy``: hard failure first, then the policy's slowdown
rule). The baselines:

* ``keep``       never acts on a slowdown.
* ``replan``     REPLAN once as soon as a slowdown is detected.
* ``degrade``    DEGRADE once as soon as a slowdown is detected.
* ``ski_rental`` keep "renting" (losing time) until the time lost equals the
  restart cost of the next rung of the ladder, then "buy" it.


On a hard failure KEEP and REPLAN are impossible (the device is gone): every
policy moves to an option that does not contain the failed device.

The default, ``eta``: take the lowest-ETA option, but only when it is clearly worth a restart.
"Clearly worth it" scales with the run (``EtaPolicyConfig``): the saving must be a
fraction of the time left and of the option's own restart cost, so the same settings
act on a 30-second CPU sweep and a 10-hour GPU run. Hysteresis gates (sustained
detection, a quiet period before the end, a cooldown between actions, the estimator
agreeing with the detector) keep it from acting on noise. Pure.

``make_policy`` builds a policy by name (what ``policy=<name>`` in the config makes), its
parameters validated against the policy's settings dataclass; ``policy_settings_type`` lets the
config schema type them all. Pure.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from synapse.decision.eta import WITHOUT_A_DEVICE, DeviceId, Option, OptionKind


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
        keep = self.option(OptionKind.KEEP)
        if keep is None:  # refused when the options were checked; this narrows the type
            raise PolicyError("options must include KEEP (build them with build_options)")
        return keep

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


class Policy(ABC):
    """Common shape: hard failure first, then the policy's slowdown rule."""

    name: ClassVar[str]

    def decide(self, ctx: DecisionContext) -> Decision:
        if ctx.hard_failure:
            return self._on_hard_failure(ctx)
        return self._on_running(ctx)

    @abstractmethod
    def _on_running(self, ctx: DecisionContext) -> Decision:
        """Decide when every device is alive."""

    def _on_hard_failure(self, ctx: DecisionContext) -> Decision:
        """Baselines: DEGRADE; where DEGRADE is impossible (every replica lost a device), the first option
        without the failed device in option order (SHRINK before REPLACE)."""
        survivors = self._survivors(ctx)
        chosen = min(survivors, key=lambda o: o.kind is not OptionKind.DEGRADE)
        return self._decision(ctx, chosen, f"hard failure of device {ctx.failed_device}: {chosen.kind.value}")

    def _decision(self, ctx: DecisionContext, chosen: Option, reason: str, **inputs: Any) -> Decision:
        return Decision(
            action=chosen.kind,
            chosen=chosen,
            options=ctx.options,
            reason=reason,
            step=ctx.step,
            remaining_steps=ctx.remaining_steps,
            inputs={"policy": self.name, **ctx.summary(), **inputs},
        )

    def _keep(self, ctx: DecisionContext, reason: str, **inputs: Any) -> Decision:
        return self._decision(ctx, ctx.keep, reason, **inputs)

    def _act_once(self, ctx: DecisionContext, kind: OptionKind) -> Decision:
        """Shared rule of the replan/degrade baselines: act once per slowdown, at once."""
        if not ctx.slowdown_detected:
            return self._keep(ctx, "no slowdown detected")
        if ctx.actions_in_episode > 0:
            return self._keep(ctx, f"already acted {ctx.actions_in_episode}x against this slowdown")
        option = ctx.option(kind)
        if option is None:
            return self._keep(ctx, f"slowdown detected but no {kind.value} option (e.g. K = 1)")
        return self._decision(ctx, option, f"slowdown detected: {kind.value}")

    @staticmethod
    def _survivors(ctx: DecisionContext) -> list[Option]:
        """After a hard failure, the only choices: DEGRADE / REPLACE / SHRINK options without the failed device."""
        survivors = [o for o in ctx.options if o.kind in WITHOUT_A_DEVICE and ctx.failed_device not in o.devices]
        if not survivors:
            raise NoViableOptionError(
                f"device {ctx.failed_device} failed and no DEGRADE/REPLACE/SHRINK option avoids it "
                f"(options: {[(o.kind.value, o.devices) for o in ctx.options]}); build the options with "
                "bad_device=<the failed device>, and with K = 1 configure a spare device"
            )
        return survivors


class KeepPolicy(Policy):
    """Baseline: ride out every slowdown; DEGRADE on a hard failure (no alternative)."""

    name = "keep"

    def _on_running(self, ctx: DecisionContext) -> Decision:
        return self._keep(ctx, "keep policy never acts on slowdowns")


class ReplanPolicy(Policy):
    """Baseline: REPLAN as soon as a slowdown is detected (once per slowdown)."""

    name = "replan"

    def _on_running(self, ctx: DecisionContext) -> Decision:
        return self._act_once(ctx, OptionKind.REPLAN)


class DegradePolicy(Policy):
    """Baseline: DEGRADE as soon as a slowdown is detected (once per slowdown)."""

    name = "degrade"

    def _on_running(self, ctx: DecisionContext) -> Decision:
        return self._act_once(ctx, OptionKind.DEGRADE)


class RebalancePolicy(Policy):
    """Baseline for replicas: give the slow replica a smaller share of the batch as soon as a slowdown
    is detected (once per slowdown); KEEP on one pipeline, which has no shares."""

    name = "rebalance"

    def _on_running(self, ctx: DecisionContext) -> Decision:
        return self._act_once(ctx, OptionKind.REBALANCE)


class ShrinkPolicy(Policy):
    """Baseline for replicas: re-cut the slow device's replica without it, on its other devices with a
    share that finishes with the others, as soon as a slowdown is detected (once per slowdown); KEEP
    where no replica can shrink (one pipeline, or replicas of one device). A lost device's replica is
    shrunk too, where it can be (the other baselines drop it)."""

    name = "shrink"

    def _on_running(self, ctx: DecisionContext) -> Decision:
        return self._act_once(ctx, OptionKind.SHRINK)

    def _on_hard_failure(self, ctx: DecisionContext) -> Decision:
        shrink = next((o for o in self._survivors(ctx) if o.kind is OptionKind.SHRINK), None)
        if shrink is None:
            return super()._on_hard_failure(ctx)
        return self._decision(ctx, shrink, f"hard failure of device {ctx.failed_device}: shrink")


@dataclass(frozen=True)
class SkiRentalConfig:
    ladder: tuple[str, ...] = (OptionKind.REPLAN.value, OptionKind.DEGRADE.value)

    def __post_init__(self) -> None:
        valid = [k.value for k in OptionKind if k is not OptionKind.KEEP]
        # Any non-string sequence (Hydra hands over a ListConfig, not a list).
        try:
            ladder = None if isinstance(self.ladder, str) else tuple(self.ladder)
        except TypeError:  # not iterable
            ladder = None
        if not ladder or any(step not in valid for step in ladder) or len(set(ladder)) != len(ladder):
            raise PolicyConfigError(
                f"ladder must be a non-empty list of distinct kinds from {valid}, got {self.ladder!r}")
        object.__setattr__(self, "ladder", ladder)


class SkiRentalPolicy(Policy):
    """Break-even rule: lose time ("rent") until it equals the next rung's restart cost, then take it ("buy").

    Rung i of the ladder (REPLAN, then DEGRADE) is taken once ``time_lost_s``
    (counted since the last action) reaches that rung's restart cost. For a
    single rung this is the classic deterministic ski-rental rule: whatever
    the slowdown's duration, the time spent is at most twice the optimum in
    hindsight (competitive ratio 2). It needs no prediction of the future,
    which is exactly what makes it a useful baseline for the ETA policy.
    """

    name = "ski_rental"

    def __init__(self, config: SkiRentalConfig | None = None) -> None:
        self.config = config or SkiRentalConfig()

    def _on_running(self, ctx: DecisionContext) -> Decision:
        if not ctx.slowdown_detected:
            return self._keep(ctx, "no slowdown detected")
        rungs = [o for kind in self.config.ladder if (o := ctx.option(OptionKind(kind))) is not None]
        if ctx.actions_in_episode >= len(rungs):
            return self._keep(ctx, f"ladder exhausted ({ctx.actions_in_episode} actions taken)")
        rung = rungs[ctx.actions_in_episode]
        numbers = {"next_rung": rung.kind.value, "break_even_s": rung.restart_cost_s}
        if ctx.time_lost_s < rung.restart_cost_s:
            reason = f"lost {ctx.time_lost_s:.1f} s < {rung.kind.value} restart cost {rung.restart_cost_s:.1f} s"
            return self._keep(ctx, reason, **numbers)
        reason = f"lost {ctx.time_lost_s:.1f} s >= {rung.kind.value} restart cost {rung.restart_cost_s:.1f} s"
        return self._decision(ctx, rung, reason, **numbers)


# Among options with equal ETA, prefer the least disruptive.
_DISRUPTION_ORDER = (OptionKind.KEEP, OptionKind.REBALANCE, OptionKind.REPLAN, OptionKind.REPLACE,
                     OptionKind.SHRINK, OptionKind.DEGRADE)


def _by_eta(ctx: DecisionContext, options: Sequence[Option]) -> Option:
    return min(options, key=lambda o: (ctx.eta_s(o), _DISRUPTION_ORDER.index(o.kind)))


@dataclass(frozen=True)
class EtaPolicyConfig:
    """When acting is "clearly worth it", relative to the run (issue #15): the saving must be at
    least ``min_saving_frac`` of the time left (ETA of KEEP) and ``min_saving_restart_frac`` of the
    option's own restart cost (the ETA pays that cost once already; this margin covers its error,
    which grows with it). So the same settings act on a 30-second CPU sweep and a 10-hour GPU run.
    ``min_saving_s`` is an optional absolute floor (0: none)."""

    min_saving_s: float = 0.0             # optional absolute floor, seconds
    min_saving_frac: float = 0.10         # saving >= this fraction of ETA(KEEP) ...
    min_saving_restart_frac: float = 0.5  # ... and >= this fraction of the option's restart cost
    sustain: int = 3                      # consecutive detections needed before acting
    quiet_last_steps: int = 10            # never restart this close to the end
    cooldown_steps: int = 20              # steps between two actions
    min_estimated_factor: float = 1.1     # act only once the estimator also sees the blamed device slow

    def __post_init__(self) -> None:
        if isinstance(self.min_saving_s, bool) or not isinstance(self.min_saving_s, (int, float)) \
                or not 0 <= self.min_saving_s < math.inf:
            raise PolicyConfigError(f"min_saving_s must be finite seconds >= 0 (0: no absolute floor), "
                                    f"got {self.min_saving_s!r}")
        if isinstance(self.min_saving_frac, bool) or not isinstance(self.min_saving_frac, (int, float)) \
                or not 0 <= self.min_saving_frac < 1:
            raise PolicyConfigError(f"min_saving_frac must be in [0, 1) (a fraction of the time left, e.g. 0.1), "
                                    f"got {self.min_saving_frac!r}")
        value = self.min_saving_restart_frac
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10:
            raise PolicyConfigError(f"min_saving_restart_frac must be in [0, 10] (a multiple of the option's "
                                    f"restart cost, e.g. 0.5), got {value!r}")
        value = self.min_estimated_factor
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value <= 10.0:
            raise PolicyConfigError(f"min_estimated_factor must be in [1, 10] (1: do not check that the "
                                    f"estimator agrees with the detector), got {value!r}")
        for name, minimum in (("sustain", 1), ("quiet_last_steps", 0), ("cooldown_steps", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise PolicyConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


class EtaPolicy(Policy):
    """Take the lowest-ETA option, but only when it is clearly worth a restart."""

    name = "eta"

    def __init__(self, config: EtaPolicyConfig | None = None) -> None:
        self.config = config or EtaPolicyConfig()

    def _on_hard_failure(self, ctx: DecisionContext) -> Decision:
        chosen = _by_eta(ctx, self._survivors(ctx))
        return self._decision(
            ctx, chosen, f"hard failure of device {ctx.failed_device}: {chosen.kind.value} has the lowest ETA"
        )

    def _on_running(self, ctx: DecisionContext) -> Decision:
        alternatives = [o for o in ctx.options if o.kind is not OptionKind.KEEP]
        if not alternatives:
            return self._keep(ctx, "no alternative to KEEP")
        best = _by_eta(ctx, alternatives)
        saving_s = ctx.eta_s(ctx.keep) - ctx.eta_s(best)
        cfg = self.config
        required_s = max(cfg.min_saving_s, cfg.min_saving_frac * ctx.eta_s(ctx.keep),
                         cfg.min_saving_restart_frac * best.restart_cost_s)
        numbers = {"best_alternative": best.kind.value, "saving_s": saving_s, "required_saving_s": required_s}
        blocked = self._blocked_by(ctx)
        if blocked:
            return self._keep(ctx, blocked, **numbers)
        if saving_s < required_s:
            return self._keep(
                ctx, f"{best.kind.value} would save {saving_s:.1f} s < required {required_s:.1f} s", **numbers
            )
        return self._decision(ctx, best, f"{best.kind.value} saves {saving_s:.1f} s >= {required_s:.1f} s", **numbers)

    def _blocked_by(self, ctx: DecisionContext) -> str | None:
        """The first hysteresis gate that forbids acting now, as a reason; None if all pass."""
        cfg = self.config
        if not ctx.slowdown_detected:
            return "no slowdown detected"
        if ctx.consecutive_detections < cfg.sustain:
            return f"slowdown not sustained ({ctx.consecutive_detections} < {cfg.sustain} detections)"
        if ctx.remaining_steps <= cfg.quiet_last_steps:
            return f"only {ctx.remaining_steps} steps left (quiet period {cfg.quiet_last_steps})"
        since = ctx.steps_since_last_action
        if since is not None and since < cfg.cooldown_steps:
            return f"cooling down ({since} < {cfg.cooldown_steps} steps since the last action)"
        factor = ctx.estimated_factor
        if factor is not None and factor < cfg.min_estimated_factor:
            # The options' ETAs come from the estimator: planning around a device it does not
            # (yet) measure as slow would move work on noise.
            return (f"the estimator does not see the detected device as slow yet (factor {factor:.2f} < "
                    f"{cfg.min_estimated_factor})")
        return None


# Each policy's constructor (a settings object, or nothing) and its settings dataclass.
_POLICIES: dict[str, tuple[Callable[..., Policy], type | None]] = {
    EtaPolicy.name: (EtaPolicy, EtaPolicyConfig),
    KeepPolicy.name: (KeepPolicy, None),
    ReplanPolicy.name: (ReplanPolicy, None),
    DegradePolicy.name: (DegradePolicy, None),
    RebalancePolicy.name: (RebalancePolicy, None),
    ShrinkPolicy.name: (ShrinkPolicy, None),
    SkiRentalPolicy.name: (SkiRentalPolicy, SkiRentalConfig),
}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def policy_settings_type(name: str) -> type | None:
    """The settings dataclass of the policy called ``name`` (None: it takes no parameters): what the
    config schema types ``policy.params`` with for ``policy=<name>``."""
    if name not in _POLICIES:
        raise PolicyConfigError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    return _POLICIES[name][1]


def make_policy(name: str, **params: Any) -> Policy:
    """The policy called ``name``, configured with ``params`` (validated; a None is the policy's default)."""
    params = {key: value for key, value in params.items() if value is not None}
    if name not in _POLICIES:
        raise PolicyConfigError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    policy_cls, config_cls = _POLICIES[name]
    if config_cls is None:
        if params:
            raise PolicyConfigError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        return policy_cls()
    valid = [f.name for f in fields(config_cls)]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise PolicyConfigError(f"policy {name!r} has no parameter(s) {unknown}; valid parameters: {valid}")
    return policy_cls(config_cls(**params))
