"""Decision policies: given the options and what the monitors saw, KEEP, REPLAN, DEGRADE or REPLACE?

Every policy answers ``decide(ctx) -> Decision`` (``synapse.planner.decision``) and
holds no state between calls. This module holds their common shape (``Policy``:
hard failure first, then the policy's slowdown rule) and the baselines:

* ``keep``       never acts on a slowdown.
* ``replan``     REPLAN once as soon as a slowdown is detected.
* ``degrade``    DEGRADE once as soon as a slowdown is detected.
* ``ski_rental`` keep "renting" (losing time) until the time lost equals the
  restart cost of the next rung of the ladder, then "buy" it.

The default, ``eta`` (lowest ETA, with hysteresis), is in ``synapse.planner.eta_policy``;
``synapse.planner.policy_registry`` makes any of them by name.

On a hard failure KEEP and REPLAN are impossible (the device is gone): every
policy moves to an option that does not contain the failed device.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from synapse.planner.decision import Decision, DecisionContext, NoViableOptionError, PolicyConfigError
from synapse.planner.options import Option, OptionKind


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
        """Baselines: DEGRADE (REPLACE only if DEGRADE is impossible)."""
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
        """After a hard failure, the only choices: DEGRADE / REPLACE options without the failed device."""
        survivors = [
            o for o in ctx.options
            if o.kind in (OptionKind.DEGRADE, OptionKind.REPLACE) and ctx.failed_device not in o.devices
        ]
        if not survivors:
            raise NoViableOptionError(
                f"device {ctx.failed_device} failed and no DEGRADE/REPLACE option avoids it "
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
