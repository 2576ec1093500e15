"""REPLACE across nodes (issue #34): which spare takes a bad device's place, and a launch's ranks stay
node-ordered (rank r runs on devices[r], node 0's first). Exhaustive over small runs: 2 and 3 nodes, every
bad device, every set of spares."""
from __future__ import annotations

import itertools

import pytest

from synapse.decision import OptionKind, RunningPartition, build_options, replica_options
from synapse.partitioning import NodeTopology, Placement
from tests.unit.test_eta import COSTS, analytic_plan, running
from tests.unit.test_layouts import COSTS as REPLICA_COSTS
from tests.unit.test_layouts import planner


def replace_of(devices, bad, spares, node_of, alphas=None):
    alphas = alphas or {}
    nominal = {**dict.fromkeys(devices, 1.0), **alphas}
    options = build_options(running(list(devices), nominal), nominal, None, bad, analytic_plan, COSTS,
                            spare_devices=spares, node_of=node_of)
    return next((o for o in options if o.kind is OptionKind.REPLACE), None)


def subsets(items):
    return [combo for size in range(1, len(items) + 1) for combo in itertools.combinations(items, size)]


@pytest.mark.parametrize("nodes, local, local_spares", [(2, (0, 1), (2,)), (2, (0,), (1, 2)), (3, (0, 1), (2,)),
                                                        (2, (1, 3), (0, 2))])
def test_one_pipeline_always_gets_a_node_ordered_replace_preferring_the_bad_devices_node(nodes, local, local_spares):
    """Every bad device, every non-empty set of the run's spares: REPLACE is offered (one pipeline's cuts are
    re-planned, so its devices may be put in node order), node-ordered, holds the spare instead of the bad
    device, and takes a spare of the bad device's node whenever one is given."""
    topology = NodeTopology(nodes, local, local_spares)
    for bad in topology.devices:
        for spares in subsets(topology.spares):
            replace = replace_of(topology.devices, bad, spares, topology.node_of)
            assert replace is not None, (bad, spares)
            spare = replace.inputs["spare_device"]
            assert topology.node_ordered(replace.devices), (bad, spares, replace.devices)
            assert sorted(replace.devices) == sorted([*(d for d in topology.devices if d != bad), spare])
            own = [s for s in spares if topology.node_of(s) == topology.node_of(bad)]
            assert spare == (own[0] if own else spares[0]), (bad, spares, spare)
            if own:  # a spare of its own node takes its place in place: every neighbour keeps its link
                assert replace.devices == tuple(spare if d == bad else d for d in topology.devices)


def test_node_0s_first_rank_replaced_by_a_rejoined_node_1_device_keeps_node_order():
    """The rejoined-spare REPLACE (node 1 declared lost, back with devices 2, 3 as spares; the run on node 0's
    [0, 1]): device 0 failing was answered by (2, 1), node 1's rank before node 0's, which the decider refuses
    (``check_node_ordered``). Across nodes the devices are put in node order, and the cuts re-planned."""
    topology = NodeTopology(2, (0, 1))
    replace = replace_of((0, 1), 0, (2, 3), topology.node_of)
    assert replace.devices == (1, 2) and replace.inputs["spare_device"] == 2
    assert sum(replace.teacher_counts) == 30 and sum(replace.student_counts) == 57
    assert replace_of((0, 1), 0, (2, 3), None).devices == (2, 1), "on one node the order is free"


def test_a_slow_spare_of_the_bad_devices_node_is_still_preferred_and_among_its_nodes_the_fastest_wins():
    topology = NodeTopology(2, (0, 1), (2, 3))  # devices 0, 1 | 4, 5; spares 2, 3 | 6, 7
    slow_own = replace_of(topology.devices, 4, (2, 6, 7), topology.node_of, alphas={6: 2.0, 7: 1.0})
    assert slow_own.inputs["spare_device"] == 7, "the fastest of node 1's spares"
    assert replace_of(topology.devices, 4, (2, 6), topology.node_of, alphas={6: 2.0}).inputs["spare_device"] == 6
    elsewhere = replace_of(topology.devices, 4, (2, 3), topology.node_of, alphas={2: 1.5})
    assert elsewhere.inputs["spare_device"] == 3 and elsewhere.devices == (0, 1, 3, 5)


def test_a_lost_node_offers_no_replace_even_with_spares_elsewhere():
    topology = NodeTopology(2, (0, 1), (2,))
    options = build_options(running([0, 1, 3, 4], dict.fromkeys([0, 1, 3, 4], 1.0)), dict.fromkeys([0, 1, 3, 4], 1.0),
                            None, 3, analytic_plan, COSTS, spare_devices=(2,), lost_devices=[4],
                            node_of=topology.node_of)
    assert OptionKind.REPLACE not in {o.kind for o in options}


def replica_replace(placement: Placement, bad: int, spares, node_of):
    alphas = dict.fromkeys(placement.devices, 1.0)
    plan = planner(placement.replicas, 1)
    predicted = plan.layout_cost(placement, alphas).step_time_s
    options = replica_options(RunningPartition(placement, predicted, predicted), alphas, None, bad, plan,
                              REPLICA_COSTS, spares, node_of=node_of)
    return next((o for o in options if o.kind is OptionKind.REPLACE), None)


@pytest.mark.parametrize("stages", [1, 2])
def test_replicas_keep_their_cuts_so_a_spare_is_offered_only_where_the_swap_in_place_stays_node_ordered(stages):
    """Replicas keep each device's place (their cuts stay): every bad device and set of spares of 2 nodes x 2
    devices + 1 spare, 4 / stages replicas. A REPLACE is node-ordered and in place; it is missing only where no
    given spare could stand in place (another node's spare, and the bad device between devices of its own node)."""
    topology = NodeTopology(2, (0, 1), (2,))
    devices = tuple(topology.devices)
    replicas = len(devices) // stages
    placement = Placement(devices, (8 // stages,) * stages, (8 // stages,) * stages, replicas,
                          (64 // replicas,) * replicas)
    offered = 0
    for bad in devices:
        for spares in subsets(topology.spares):
            replace = replica_replace(placement, bad, spares, topology.node_of)
            in_place = [s for s in spares
                        if topology.node_ordered(tuple(s if d == bad else d for d in devices))]
            if replace is None:
                assert not in_place, (bad, spares)
                continue
            offered += 1
            spare = replace.inputs["spare_device"]
            assert replace.placement.devices == tuple(spare if d == bad else d for d in devices)
            assert topology.node_ordered(replace.placement.devices)
            own = [s for s in in_place if topology.node_of(s) == topology.node_of(bad)]
            assert spare == (own[0] if own else in_place[0])
    assert offered > 0
    # node 0's first device cannot take node 1's spare in place: (5, 1, 3, 4) would put a node-1 rank first
    assert replica_replace(placement, 0, (5,), topology.node_of) is None
    assert replica_replace(placement, 0, (5,), None) is not None, "on one node any spare stands in"
    # at the boundary another node's spare can: node 0's last -> (0, 5, 3, 4), node 1's first -> (0, 1, 2, 4)
    assert replica_replace(placement, 1, (5,), topology.node_of).placement.devices == (0, 5, 3, 4)
    assert replica_replace(placement, 3, (2,), topology.node_of).placement.devices == (0, 1, 2, 4)
    assert replica_replace(placement, 4, (2,), topology.node_of) is None  # (0, 1, 3, 2): node 0 after node 1
    assert replica_replace(placement, 4, (2, 5), topology.node_of).placement.devices == (0, 1, 3, 5)
