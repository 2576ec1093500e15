"""Which decisions the running workers take in place, and that the ETA model prices them on the path they take.

A REBALANCE of replicas changes only the shares of the global batch, so under failover.replan_mode=live it is
taken live like a REPLAN of one pipeline (tests/dist/test_live_rebalance.py runs it); these are the rules the
supervisor's watcher and the restart-cost model share.
"""
from __future__ import annotations

import pytest

from synapse.config import FailoverConfig, ReplanMode, TrainerConfig
from synapse.config.schema import ReplicaEngine
from synapse.decision import OptionKind
from synapse.failover.live import changes_live, live_kinds, replica_engine
from synapse.failover.run import restart_cost_model
from synapse.partitioning import Placement
from synapse.pipeline.repartition import BlockMove, student_moves

TWO_BY_ONE = Placement((0, 1), (11,), (10,), replicas=2, shares=(16, 16))


TWO_BY_TWO = Placement((0, 1, 2, 3), (5, 6), (5, 5), replicas=2, shares=(16, 16))


def test_live_mode_takes_replan_and_rebalance_live_restart_mode_neither_a_torchft_launch_neither():
    assert live_kinds(FailoverConfig(), "restart") == {OptionKind.REPLAN, OptionKind.REBALANCE}
    assert live_kinds(FailoverConfig(replan_mode=ReplanMode.restart), "restart") == frozenset()
    torchft = FailoverConfig(replica_engine=ReplicaEngine.torchft)
    assert live_kinds(torchft, "torchft") == frozenset()  # each replica its own launch: a change restarts
    # torchft hands a layout it does not carry to the restart engine, whose launch takes changes live again
    assert replica_engine(torchft, TWO_BY_ONE) == "torchft"
    assert replica_engine(torchft, TWO_BY_ONE.with_shares((28, 4))) == "restart"
    assert replica_engine(torchft, Placement((0, 1), (6, 5), (5, 5))) == "restart"
    assert replica_engine(FailoverConfig(), TWO_BY_ONE) == "restart"
    assert live_kinds(torchft, "restart") == {OptionKind.REPLAN, OptionKind.REBALANCE}


def test_a_rebalance_is_live_only_when_nothing_but_the_shares_change():
    assert TWO_BY_ONE.only_shares_differ(TWO_BY_ONE.with_shares((28, 4)))
    assert changes_live(OptionKind.REBALANCE, TWO_BY_ONE, TWO_BY_ONE.with_shares((28, 4)))
    moved = Placement((0, 2), (11,), (10,), replicas=2, shares=(28, 4))  # another device: a relaunch
    assert not TWO_BY_ONE.only_shares_differ(moved)
    assert not changes_live(OptionKind.REBALANCE, TWO_BY_ONE, moved)
    assert not changes_live(OptionKind.DEGRADE, TWO_BY_ONE, TWO_BY_ONE.with_shares((28, 4)))


def test_a_replan_is_live_when_every_rank_stays_on_its_device_in_its_replica():
    one_pipeline = Placement((0, 1), (6, 5), (5, 5))
    assert changes_live(OptionKind.REPLAN, one_pipeline, Placement((0, 1), (5, 6), (4, 6)))
    assert changes_live(OptionKind.REPLAN, TWO_BY_TWO, Placement((0, 1, 2, 3), (7, 4), (6, 4), 2, (16, 16)))
    # replicas re-cut differently, each on its own ranks, and new shares with it: still the same ranks
    apart = Placement((0, 1, 2, 3), (5, 6, 7, 4), (5, 5, 6, 4), 2, (20, 12), (2, 2))
    assert changes_live(OptionKind.REPLAN, TWO_BY_TWO, apart)
    assert not changes_live(OptionKind.REPLAN, TWO_BY_TWO, TWO_BY_TWO.on((0, 1, 2, 4)))  # another device
    shrunk = Placement((0, 1, 2), (5, 6, 11), (5, 5, 10), 2, (20, 12), (2, 1))  # a replica of fewer stages
    assert not changes_live(OptionKind.REPLAN, TWO_BY_TWO, shrunk)
    four_by_one = Placement((0, 1, 2, 3), (11,), (10,), replicas=4)
    assert not changes_live(OptionKind.REPLAN, TWO_BY_TWO, four_by_one)  # the same devices, other pipelines


def test_a_live_replan_moves_each_block_between_the_ranks_of_its_own_replica():
    recut = Placement((0, 1, 2, 3), (7, 4), (6, 4), 2, (16, 16))
    assert student_moves(TWO_BY_TWO, recut) == [BlockMove(5, 1, 0), BlockMove(5, 3, 2)]
    apart = Placement((0, 1, 2, 3), (5, 6, 7, 4), (5, 5, 3, 7), 2, (20, 12), (2, 2))
    assert student_moves(TWO_BY_TWO, apart) == [BlockMove(3, 2, 3), BlockMove(4, 2, 3)]
    with pytest.raises(ValueError, match="keeps every rank on its device"):
        student_moves(TWO_BY_TWO, TWO_BY_TWO.on((0, 1, 2, 4)))
    with pytest.raises(ValueError, match="different numbers of blocks"):
        student_moves(TWO_BY_TWO, Placement((0, 1, 2, 3), (5, 6), (5, 6), 2, (16, 16)))


def test_a_live_rebalance_is_priced_on_the_live_path_and_by_restart_on_the_restart_path():
    """The kinds the workers can take live have the live path; where they do not (replan_mode=restart, a torchft
    launch) the controller prices them at the restart path (``costs_by_kind(restarting=...)``)."""
    costs = restart_cost_model(TrainerConfig(), FailoverConfig(), log=lambda m: None)
    assert costs.seconds_for(OptionKind.REBALANCE) == costs.seconds_for(OptionKind.REPLAN) == \
        costs.estimate("live").total_s
    restarting = costs.costs_by_kind(restarting=(OptionKind.REBALANCE, OptionKind.REPLAN))
    assert restarting[OptionKind.REBALANCE] == restarting[OptionKind.REPLAN] == costs.estimate("restart").total_s
    assert costs.seconds_for(OptionKind.REBALANCE) < restarting[OptionKind.REBALANCE]
    assert costs.seconds_for(OptionKind.DEGRADE) == restarting[OptionKind.DEGRADE]
