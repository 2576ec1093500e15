"""Planning across nodes, pure: run-wide device ids, the price of a stage boundary between
nodes, and a DEGRADE that drops every device of a lost node."""
from __future__ import annotations

import math

import pytest

from synapse.decision import OptionKind, RunningPartition, build_options
from synapse.partitioning import (
    BlockProfile,
    DeviceFacts,
    ModelProfile,
    NodeTopology,
    Placement,
    StagePlanner,
    StepSpec,
    TopologyError,
)

COSTS = {OptionKind.KEEP: 0.0, OptionKind.REPLAN: 40.0, OptionKind.DEGRADE: 45.0, OptionKind.REPLACE: 50.0}
ALPHAS = {0: 1.0, 1: 1.0, 2: 3.0, 3: 1.0}


def analytic_plan(devices, alphas, betas):
    """Blocks split evenly (what is planned does not matter here, only on which devices)."""
    k = len(devices)
    teacher = [30 // k + (i < 30 % k) for i in range(k)]
    student = [57 // k + (i < 57 % k) for i in range(k)]
    return teacher, student, 1.0


def running(devices, alphas):
    teacher, student, _ = analytic_plan(devices, None, None)
    return RunningPartition(Placement(tuple(devices), tuple(teacher), tuple(student)), 1.0, 1.0)


def by_kind(options):
    return {o.kind: o for o in options}


def test_run_wide_ids_number_node_0_first_and_map_back():
    cpu = NodeTopology(2, (0, 1))
    assert cpu.devices == [0, 1, 2, 3] and [cpu.node_of(d) for d in cpu.devices] == [0, 0, 1, 1]
    assert [cpu.local_id(d) for d in cpu.devices] == [0, 1, 0, 1]
    gpus = NodeTopology(2, (2, 3))  # GPUs 2 and 3 of each node
    assert gpus.devices == [2, 3, 6, 7] and gpus.local_id(6) == 2 and gpus.node_of(7) == 1
    assert gpus.nodes_of([3, 6, 7]) == [0, 1] and gpus.local_devices_of(1, [3, 6, 7]) == [2, 3]
    spare = NodeTopology(1, (0, 1, 2))  # one node: a spare (trainer.spare_devices=[3]) is its device too
    assert spare.node_of(3) == 0 and spare.local_id(3) == 3 and spare.devices == [0, 1, 2]
    with pytest.raises(TopologyError, match="device 4 is on no node"):
        gpus.node_of(4)
    with pytest.raises(TopologyError, match="not grouped by node"):
        cpu.check_node_ordered([2, 0, 1])


def profile(blocks: int, out_kb: float) -> ModelProfile:
    return ModelProfile("m", [BlockProfile(f"b{i}", 1.0, 2.0, out_kb, out_kb, out_kb, 10.0) for i in range(blocks)])


def test_a_boundary_between_nodes_is_priced_at_the_node_link_and_moves_the_cut():
    topology = NodeTopology(2, (0, 1))
    same = DeviceFacts(link_bandwidth_bytes_per_s=1e12)
    across = DeviceFacts(link_bandwidth_bytes_per_s=1e12, node_of=topology.node_of,
                         cross_node_bandwidth_bytes_per_s=1e6, cross_node_latency_s=1e-3)
    specs = across.specs([0, 1, 2, 3])
    assert [s.link_bandwidth_bytes_per_s for s in specs] == [1e12, 1e6, 1e12, 1e12]
    assert specs[1].link_latency_s == 1e-3 and across.node_boundaries([0, 1, 2, 3]) == [1]
    assert across.node_boundaries([0, 1]) == [] and same.node_boundaries([0, 1, 2, 3]) == []
    step = StepSpec(4, "1f1b")
    uniform, slow_link = (StagePlanner(profile(8, 400.0), profile(8, 400.0), step, facts) for facts in (same, across))
    assert slow_link.predict([0, 1, 2, 3], [2] * 4, [2] * 4).step_time_s > \
        uniform.predict([0, 1, 2, 3], [2] * 4, [2] * 4).step_time_s
    # The same four devices on one node (ids 0..3 of one topology) pay nothing extra.
    one_node = DeviceFacts(link_bandwidth_bytes_per_s=1e12, node_of=NodeTopology(1, (0, 1, 2, 3)).node_of,
                           cross_node_bandwidth_bytes_per_s=1e6)
    assert one_node.specs([0, 1, 2, 3]) == same.specs([0, 1, 2, 3])


def test_a_lost_node_takes_all_its_devices_out_of_the_degrade_and_offers_no_replace():
    options = by_kind(build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, 2, analytic_plan, COSTS,
                                    lost_devices=[3]))
    degrade = options[OptionKind.DEGRADE]
    assert degrade.devices == (0, 1) and degrade.inputs["dropped_devices"] == [2, 3]
    assert sum(degrade.teacher_counts) == 30 and OptionKind.REPLACE not in options
    spares = build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, 2, analytic_plan, COSTS, spare_devices=(7,),
                           lost_devices=[3])
    assert OptionKind.REPLACE not in by_kind(spares)


def test_losing_every_device_leaves_no_degrade():
    current = RunningPartition(Placement((2, 3), (15, 15), (28, 29)), 1.0, 1.0)
    options = build_options(current, {2: 1.0, 3: 1.0}, None, 2, analytic_plan, COSTS, lost_devices=[3])
    assert OptionKind.DEGRADE not in by_kind(options) and math.isfinite(options[0].predicted_step_s)
