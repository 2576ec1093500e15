"""Which decisions the running workers take in place, and that the ETA model prices them on the path they take.

A REBALANCE of replicas changes only the shares of the global batch, so under failover.replan_mode=live it is
taken live like a REPLAN of one pipeline (tests/dist/test_live_rebalance.py runs it); these are the rules the
supervisor's watcher and the restart-cost model share.
"""
from __future__ import annotations

from synapse.config import FailoverConfig, ReplanMode, TrainerConfig
from synapse.config.schema import ReplicaEngine
from synapse.decision import OptionKind
from synapse.failover.live import changes_live, live_kinds
from synapse.failover.run import restart_cost_model
from synapse.partitioning import Placement

TWO_BY_ONE = Placement((0, 1), (11,), (10,), replicas=2, shares=(16, 16))


def test_live_mode_takes_replan_and_rebalance_live_restart_mode_neither_torchft_no_rebalance():
    assert live_kinds(FailoverConfig()) == {OptionKind.REPLAN, OptionKind.REBALANCE}
    assert live_kinds(FailoverConfig(replan_mode=ReplanMode.restart)) == frozenset()
    assert live_kinds(FailoverConfig(replica_engine=ReplicaEngine.torchft)) == {OptionKind.REPLAN}


def test_a_rebalance_is_live_only_when_nothing_but_the_shares_change():
    assert TWO_BY_ONE.only_shares_differ(TWO_BY_ONE.with_shares((28, 4)))
    assert changes_live(OptionKind.REBALANCE, TWO_BY_ONE, TWO_BY_ONE.with_shares((28, 4)))
    moved = Placement((0, 2), (11,), (10,), replicas=2, shares=(28, 4))  # another device: a relaunch
    assert not TWO_BY_ONE.only_shares_differ(moved)
    assert not changes_live(OptionKind.REBALANCE, TWO_BY_ONE, moved)
    one_pipeline = Placement((0, 1), (6, 5), (5, 5))
    assert changes_live(OptionKind.REPLAN, one_pipeline, Placement((0, 1), (5, 6), (4, 6)))
    assert not changes_live(OptionKind.REPLAN, TWO_BY_ONE, TWO_BY_ONE)  # replicas re-cut through a restart
    assert not changes_live(OptionKind.DEGRADE, TWO_BY_ONE, TWO_BY_ONE.with_shares((28, 4)))


def test_a_live_rebalance_is_priced_on_the_live_path_and_by_restart_on_the_restart_path():
    trainer = TrainerConfig()
    live = restart_cost_model(trainer, FailoverConfig(), log=lambda m: None)
    restart = restart_cost_model(trainer, FailoverConfig(replan_mode=ReplanMode.restart), log=lambda m: None)
    assert live.seconds_for(OptionKind.REBALANCE) == live.seconds_for(OptionKind.REPLAN) == \
        live.estimate("live").total_s
    assert restart.seconds_for(OptionKind.REBALANCE) == restart.estimate("restart").total_s
    assert live.seconds_for(OptionKind.REBALANCE) < restart.seconds_for(OptionKind.REBALANCE)
    assert live.seconds_for(OptionKind.DEGRADE) == restart.seconds_for(OptionKind.DEGRADE)
