"""Which decisions the running workers take in place, without a stop: the one rule the controller's
pricing (``failover.run``), the watcher that sends the request (``failover.watch``), the supervisor's
records and the simulator (``synapse.simulation``) all follow."""
from __future__ import annotations

from synapse.config import FailoverConfig
from synapse.decision import OptionKind
from synapse.partitioning import Placement

# How a segment that the workers left live ends, by the action that ended it.
LIVE_OUTCOMES = {"replan": "replanned live", "rebalance": "rebalanced live"}


def live_kinds(failover: FailoverConfig) -> frozenset[OptionKind]:
    """The actions the running workers may take without a restart (``failover.replan_mode=live``): a REPLAN,
    and a REBALANCE of the replicas of one launch. Under torchft each replica is a launch of its own whose
    share follows the quorum, so a REBALANCE there stays on the restart path."""
    if failover.replan_mode != "live":
        return frozenset()
    if str(failover.replica_engine) == "torchft":
        return frozenset({OptionKind.REPLAN})
    return frozenset({OptionKind.REPLAN, OptionKind.REBALANCE})


def changes_live(kind: OptionKind, running: Placement, chosen: Placement) -> bool:
    """Whether the workers can move from ``running`` to ``chosen`` in place: a REPLAN moves blocks inside
    one pipeline (a layout with replicas re-cuts through a restart, and is priced so by the controller); a
    REBALANCE changes nothing but the replicas' shares of the global batch (same devices, cuts and groups)."""
    if kind is OptionKind.REPLAN:
        return chosen.replicas == 1
    if kind is OptionKind.REBALANCE:
        return running.only_shares_differ(chosen)
    return False


def taken_live(live: frozenset[OptionKind], kind: OptionKind, running: Placement, chosen: Placement) -> bool:
    """Whether a decision of ``kind`` from ``running`` to ``chosen`` is carried out live in a run whose
    live kinds are ``live`` (``live_kinds``)."""
    return kind in live and changes_live(kind, running, chosen)
