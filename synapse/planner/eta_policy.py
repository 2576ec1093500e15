"""The default policy, ``eta``: take the lowest-ETA option, but only when it is clearly worth a restart.

"Clearly worth it" scales with the run (``EtaPolicyConfig``): the saving must be a
fraction of the time left and of the option's own restart cost, so the same settings
act on a 30-second CPU sweep and a 10-hour GPU run. Hysteresis gates (sustained
detection, a quiet period before the end, a cooldown between actions, the estimator
agreeing with the detector) keep it from acting on noise. Pure.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from synapse.planner.decision import Decision, DecisionContext, PolicyConfigError
from synapse.planner.options import Option, OptionKind
from synapse.planner.policy import Policy

# Among options with equal ETA, prefer the least disruptive.
_DISRUPTION_ORDER = (OptionKind.KEEP, OptionKind.REPLAN, OptionKind.REPLACE, OptionKind.DEGRADE)


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
