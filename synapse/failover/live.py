"""Which decisions the running workers take in place, without a stop: the one rule the controller's
pricing (``failover.controller``), the watcher that sends the request (``failover.watch``), the supervisor's
records and the simulator (``synapse.simulation``) all follow."""
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


def live_kinds(failover: FailoverConfig, running: Placement) -> frozenset[OptionKind]:
    """The actions the workers of a segment on ``running`` take without a restart: with
    ``failover.replan_mode=live`` a REPLAN and a REBALANCE, unless torchft carries the segment (each replica
    is a launch of its own whose share follows the quorum: every change of its layout restarts). A segment
    that torchft handed to the restart engine (``replica_engine``) takes them live again."""
    if failover.replan_mode != "live" or replica_engine(failover, running) == "torchft":
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


def taken_live(failover: FailoverConfig, kind: OptionKind, running: Placement, chosen: Placement) -> bool:
    """Whether a decision of ``kind`` from ``running`` to ``chosen`` is carried out live."""
    return kind in live_kinds(failover, running) and changes_live(kind, running, chosen)
