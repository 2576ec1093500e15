"""Which decisions the running workers take in place, without a stop: the one rule the controller prices by
and answers with (``FailoverController.takes_live``), which the watcher that sends the request
(``failover.watch``) and the simulator (``synapse.simulation``) ask."""
from __future__ import annotations

from synapse.config import FailoverConfig
from synapse.decision import OptionKind
from synapse.partitioning import Placement

# How a segment that the workers left live ends, by the action that ended it.
LIVE_OUTCOMES = {"replan": "replanned live", "rebalance": "rebalanced live"}

# What the workers can take in place (failover.replan_mode=live): a re-cut and new shares, on the same ranks.
LIVE_KINDS = frozenset({OptionKind.REPLAN, OptionKind.REBALANCE})


def replica_engine(failover: FailoverConfig, placement: Placement) -> str:
    """The engine that carries a segment on ``placement``: the run's ``failover.replica_engine``, or the
    restart path for a layout torchft does not carry (one replica left, replicas cut differently, unequal
    shares: what SHRINK, DEGRADE or REBALANCE may make of it)."""
    carried = placement.replicas > 1 and placement.cut_alike and len(set(placement.shares)) <= 1
    return str(failover.replica_engine) if carried else "restart"


def live_kinds(failover: FailoverConfig, engine: str) -> frozenset[OptionKind]:
    """The actions the workers of a launch on replica engine ``engine`` (``replica_engine`` of the placement it
    was launched on) take without a restart: with ``failover.replan_mode=live`` a REPLAN and a REBALANCE,
    none under torchft (each replica is a launch of its own whose share follows the quorum: every change of
    its layout restarts). A launch on the restart engine keeps it through its live changes, whatever
    placement they reach (equal shares again after a REBALANCE included)."""
    if failover.replan_mode != "live" or engine == "torchft":
        return frozenset()
    return LIVE_KINDS


def changes_live(kind: OptionKind, running: Placement, chosen: Placement) -> bool:
    """Whether the workers can move from ``running`` to ``chosen`` in place: a REPLAN keeps every rank on its
    device and in its replica and moves blocks between the ranks of each replica (every replica re-cut at
    once); a REBALANCE changes nothing but the replicas' shares of the global batch."""
    if kind is OptionKind.REPLAN:
        return running.same_ranks(chosen)
    if kind is OptionKind.REBALANCE:
        return running.only_shares_differ(chosen)
    return False


def taken_live(failover: FailoverConfig, engine: str, kind: OptionKind, running: Placement,
               chosen: Placement) -> bool:
    """Whether a decision of ``kind`` from ``running`` to ``chosen`` is carried out live, in a launch on ``engine``."""
    return kind in live_kinds(failover, engine) and changes_live(kind, running, chosen)
