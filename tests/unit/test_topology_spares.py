"""Spares across nodes (issue #34): their run-wide ids, the checks of trainer.spare_devices before any worker
starts, each node's segment config, and what the controller does with the spares of a node lost."""
from __future__ import annotations

import pytest

from synapse.config import ConfigError, NodeDevices, run_topology, typed_config, validate
from synapse.decision import OptionKind, RestartCost, RestartCostModel, make_policy
from synapse.failover import FailoverController, build_controller
from synapse.failover.decider import segment_node_settings
from synapse.partitioning import NodeTopology, Placement, TopologyError
from tests.unit.test_failover_controller import SHARED, planner  # noqa: F401  (the fixture)

ENDPOINT = "trainer.rdzv_endpoint=127.0.0.1:29999"


def test_the_stride_counts_the_spares_so_no_spare_shares_an_id_with_another_nodes_device():
    two = NodeTopology(2, (0, 1), (2,))
    assert two.devices == [0, 1, 3, 4] and two.spares == [2, 5] and two.stride == 3
    assert [two.node_of(d) for d in (0, 1, 2, 3, 4, 5)] == [0, 0, 0, 1, 1, 1]
    assert [two.local_id(d) for d in (2, 5)] == [2, 2] and two.spares_on(1) == [5]
    assert not set(two.devices) & set(two.spares)
    gpus = NodeTopology(3, (4, 5), (0, 7))  # spares below and above the devices' ids
    assert gpus.stride == 8 and gpus.devices == [4, 5, 12, 13, 20, 21] and gpus.spares == [0, 7, 8, 15, 16, 23]
    assert gpus.node_of(15) == 1 and gpus.local_id(15) == 7
    with pytest.raises(TopologyError, match=r"device 6 is on no node .* spares \[0, 7, 8, 15, 16, 23\]"):
        gpus.node_of(6)
    with pytest.raises(TopologyError, match="device 24 is on no node"):
        gpus.node_of(24)
    assert two.node_ordered([0, 2, 5, 4]) and not two.node_ordered([5, 1, 3, 4])
    for spares in ((1,), (2, 2)):
        with pytest.raises(TopologyError, match="a spare is an idle device, listed once"):
            NodeTopology(2, (0, 1), spares)
    assert NodeTopology(2, (0, 1)).devices == [0, 1, 2, 3], "without spares the ids are as before"


def test_the_runs_topology_holds_the_configured_spares(make_config):
    cfg = typed_config(make_config("trainer=cpu", "injection=none", "trainer.devices=2", "trainer.nodes=2", ENDPOINT,
                                   "trainer.spare_devices=[2]"))
    validate(make_config("trainer=cpu", "injection=none", "trainer.devices=2", "trainer.nodes=2", ENDPOINT,
                         "trainer.spare_devices=[2]"))  # accepted across nodes (it was refused: "not supported yet")
    assert run_topology(cfg.trainer) == NodeTopology(2, (0, 1), (2,))


@pytest.mark.parametrize("spares, problem", [
    ("[1]", "trainer.spare_devices: spares [1] [1] are also in trainer.devices=[0, 1] (on every node: "
            "trainer.nodes=2)"),
    ("[3,3]", "trainer.spare_devices: spares [3, 3] repeat a device (on every node: trainer.nodes=2)"),
    ("[-1]", "trainer.spare_devices: negative device id in [-1]"),
    ("[64]", "trainer.spare_devices: CPU slot ids [64] are out of range"),
])
def test_spares_that_cannot_work_across_nodes_are_refused_naming_the_fix(make_config, spares, problem):
    with pytest.raises(ConfigError) as error:
        validate(make_config("trainer=cpu", "injection=none", "trainer.devices=2", "trainer.nodes=2", ENDPOINT,
                             f"trainer.spare_devices={spares}"))
    assert str(error.value).startswith(problem), str(error.value)
    assert ". Fix: " in str(error.value)


def test_a_node_whose_host_lacks_a_spare_gpu_is_unfit_and_a_spares_memory_is_its_own():
    """What a node's agent says of its host (its hello) covers its spares: a decider on a host of its own refuses
    a node whose host lacks a spare's GPU, and plans a spare with that node's word of its memory."""
    fits = NodeDevices("cuda", 3, [0, 1], ["gpu-a", "gpu-a", "gpu-b"], [8e9, 8e9, 24e9], spares=[2])
    assert fits.unfit("cuda") is None and fits.memory_of(2) == 24e9 and fits.held == [0, 1, 2]
    lacks = NodeDevices("cuda", 2, [0, 1], ["gpu-a", "gpu-a", "gpu-a"], [8e9] * 3, spares=[2])
    assert lacks.unfit("cuda") == (
        "its host sees 2 CUDA device(s), and trainer.devices=[0, 1] with trainer.spare_devices=[2] needs 3 (GPU ids "
        "up to 2). Fix: give trainer.devices and trainer.spare_devices ids below 2 (the same on every node), or start "
        "that node on a host with at least 3 GPU(s)")
    assert "(spares [2])" in fits.describe()


def test_each_nodes_segment_config_lists_its_own_idle_spares_in_local_ids():
    topology = NodeTopology(2, (0, 1), (2,))
    # device 3 (node 1's first) replaced by node 1's spare 5: node 1 runs local [2, 1] and has no spare left
    node0 = segment_node_settings(topology, [0, 1, 5, 4], "h:1", node=0)
    node1 = segment_node_settings(topology, [0, 1, 5, 4], "h:1", node=1)
    assert node0["trainer.node_devices"] == node1["trainer.node_devices"] == [[0, 1], [2, 1]]
    assert node0["trainer.spare_devices"] == [2] and node1["trainer.spare_devices"] == []
    alone = segment_node_settings(topology, [5, 4], "h:1")  # a segment on node 1 alone: a one-node launch there
    assert alone["trainer.devices"] == [2, 1] and alone["trainer.spare_devices"] == []
    one = segment_node_settings(NodeTopology(1, (0, 1), (2, 3)), [0, 3], None)
    assert one == {"trainer.devices": [0, 3], "trainer.spare_devices": [2]}


def test_the_controller_gets_every_nodes_spares_and_drops_a_lost_nodes(make_config, planner, tmp_path):  # noqa: F811
    """Across nodes the controller's spares are run-wide, each with its node; a node lost takes its spares out
    (no later REPLACE may launch on a node whose agent is gone), and a REPLACE keeps the ranks node-ordered."""
    cfg = typed_config(make_config("trainer=cpu", "injection=none", "trainer.devices=2", "trainer.nodes=2", ENDPOINT,
                                   "trainer.spare_devices=[2]"))
    topology = run_topology(cfg.trainer)
    events: list[dict] = []
    controller = build_controller(cfg, planner, tmp_path, lambda m: None, topology=topology)
    assert controller.spare_devices == (2, 5) and controller.node_of is not None
    assert build_controller(cfg, planner, tmp_path, lambda m: None).spare_devices == (2,), "one node, or simulated"
    controller = FailoverController(policy=make_policy("degrade"), planner=planner, restart_costs=RestartCostModel(
        RestartCost(checkpoint_save_s=5, teardown_s=2, launch_s=20, checkpoint_load_s=3, warmup_s=5)),
        spare_devices=(2, 5), node_of=topology.node_of, log_event=lambda event, **f: events.append({"event": event,
                                                                                                     **f}))
    teacher, student, _ = planner.plan((0, 1, 3, 4), [1.0] * 4)
    controller.begin_segment(Placement((0, 1, 3, 4), tuple(teacher), tuple(student)))
    decision = controller.on_hard_failure(4, step=5, total_steps=100, cause="node_lost", lost_with_it=[3])
    assert decision.action is OptionKind.DEGRADE and decision.chosen.devices == (0, 1)
    assert controller.spare_devices == (2,), "node 1's spare 5 left with its node"
    assert [e for e in events if e["event"] == "spares_lost"] == [
        {"event": "spares_lost", "step": 5, "nodes": [1], "spares": [5]}]
    # node 1 back as a spare (the decider's on_spares: its devices and its spare), then node 0's first rank lost
    controller.spare_devices = (2, 3, 4, 5)
    controller.begin_segment(Placement(decision.chosen.devices, decision.chosen.teacher_counts,
                                       decision.chosen.student_counts))
    options = controller._options(0, lost=())
    [replace] = [o for o in options if o.kind is OptionKind.REPLACE]
    assert replace.devices == (2, 1), "node 0's own spare, in place"
    controller.spare_devices = (3, 4, 5)
    [replace] = [o for o in controller._options(0, lost=()) if o.kind is OptionKind.REPLACE]
    assert replace.devices == (1, 3), "node 1's device after node 0's: node-ordered, the cuts re-planned"


def test_a_decider_on_a_host_of_its_own_leaves_the_spares_gpu_check_to_the_nodes(make_config):
    """This machine has no GPU: a decider elsewhere checks no spare's GPU here (each node's agent checks its own
    host, and says what it has); a node of the same config is checked against this host, and refused."""
    import torch

    from synapse.config.validation import validate_failover

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    gpus = ("trainer.nodes=2", ENDPOINT, "trainer.devices=[0,1]", "trainer.accelerator=cuda",
            "trainer.spare_devices=[2]", "injection=none")
    validate_failover(make_config(*gpus, "trainer.role=decider"))
    with pytest.raises(ConfigError, match="cuda requested but no CUDA device is visible"):
        validate_failover(make_config(*gpus))
