"""The decider-agent channel over a real TCPStore on loopback: typed records round trip, a
node_rank claimed twice is refused, orders arrive in order, and an unreachable decider is named
within the timeout."""
from __future__ import annotations

import time

import pytest

from synapse.failover import (
    ExitOrder,
    LaunchOrder,
    NodeChannel,
    NodeChannelError,
    NodeHello,
    NodeReport,
    NodeSetupError,
    StopOrder,
    Welcome,
)
from synapse.launch import free_port


@pytest.fixture
def pair():
    endpoint = f"127.0.0.1:{free_port()}"
    decider = NodeChannel.host(endpoint, timeout_s=10)
    return decider, NodeChannel.connect(endpoint, node_rank=1, timeout_s=10)


def test_hello_welcome_orders_reports_and_beats_round_trip(pair):
    decider, agent = pair
    agent.say_hello(NodeHello(1, 2, [0, 1], "host-b", 123))
    assert decider.hellos() == {1: NodeHello(1, 2, [0, 1], "host-b", 123)}
    assert agent.wait_welcome(1, timeout_s=0.1) is None
    decider.welcome(1, Welcome())
    assert agent.wait_welcome(1, timeout_s=1) == Welcome(None)
    launch = LaunchOrder(3, "trainer: {}\n", {"devices": [0, 1, 3], "teacher": [1, 1, 1], "student": [1, 1, 1]},
                         4, None, "/w/teacher.pt", store_hosted=True)
    for order in (launch, StopOrder(3, "node 0 failed"), ExitOrder()):
        decider.order(1, order)
    assert [agent.next_order(1, seq, timeout_s=1) for seq in range(3)] == [launch, StopOrder(3, "node 0 failed"),
                                                                          ExitOrder()]
    assert agent.next_order(1, 3, timeout_s=0) is None
    report = NodeReport(1, 3, "failed", rank=2, cause="killed by SIGKILL", device_failure=True)
    assert decider.report_of(3, 1) is None
    agent.report(report)
    assert decider.report_of(3, 1) == report
    assert decider.beats(1) == 0 and agent.beat(1) == 1 and agent.beat(1) == 2 and decider.beats(1) == 2


def test_a_node_rank_claimed_twice_is_refused(pair):
    decider, agent = pair
    agent.say_hello(NodeHello(1, 2, [0], "a", 1))
    twin = NodeChannel.connect(decider.endpoint, node_rank=1, timeout_s=10)
    with pytest.raises(NodeSetupError, match="trainer.node_rank=1 is already taken"):
        twin.say_hello(NodeHello(1, 2, [0], "b", 2))


def test_a_foreign_record_is_named(pair):
    decider, agent = pair
    decider.store.set("synapse/nodes/report/0/1", "not json")
    decider.store.check(["synapse/nodes/report/0/1"])
    with pytest.raises(NodeChannelError, match="NodeReport record that Synapse did not write"):
        decider.report_of(0, 1)


@pytest.mark.slow  # waits out the connection timeout
def test_an_unreachable_decider_is_named_within_the_timeout():
    endpoint = f"127.0.0.1:{free_port()}"  # nobody listens
    started = time.monotonic()
    with pytest.raises(NodeSetupError, match=r"node 0 could not be reached within trainer.rdzv_timeout_s=2 s"):
        NodeChannel.connect(endpoint, node_rank=1, timeout_s=2)
    assert time.monotonic() - started < 30


def test_ranks_follow_node_rank_whatever_order_torch_gave_the_nodes():
    from datetime import timedelta

    from torch.distributed import HashStore
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from synapse.launch import NODE_RANK_KEY, node_ordered_rank

    store = HashStore()
    store.set_timeout(timedelta(seconds=2))
    store.set(NODE_RANK_KEY.format(0), "1")  # torch's rank 0 is trainer.node_rank 1 (it sorted by pid)
    assert node_ordered_rank(store, rank=1, world_size=2, node_rank=0) == 0
    twice = HashStore()
    twice.set_timeout(timedelta(seconds=2))
    twice.set(NODE_RANK_KEY.format(0), "0")
    with pytest.raises(RendezvousError, match=r"claim trainer.node_rank \[0, 0\]"):
        node_ordered_rank(twice, rank=1, world_size=2, node_rank=0)


def test_stop_requests_cross_nodes_through_the_deciders_store():
    from omegaconf import OmegaConf

    from synapse.control import (
        ControlRecordError,
        StopAck,
        StopRequest,
        StoreControlChannel,
        control_endpoint,
        open_channel,
    )
    from synapse.partitioning import Placement

    endpoint = f"127.0.0.1:{free_port()}"
    decider = NodeChannel.host(endpoint, timeout_s=10)  # the decider's store (served while referenced)
    groups = lambda nodes, failover=True: (  # noqa: E731  (the trainer and failover groups control_endpoint reads)
        OmegaConf.create({"nodes": nodes, "rdzv_endpoint": endpoint}), OmegaConf.create({"enabled": failover}))
    assert control_endpoint(*groups(2)) == endpoint and control_endpoint(*groups(1)) is None
    assert control_endpoint(*groups(2, failover=False)) is None
    supervisor, worker = (open_channel("/nonexistent", control_endpoint(*groups(2)), 10) for _ in range(2))
    assert isinstance(worker, StoreControlChannel) and worker.poll() is None
    request = StopRequest("r1", "degrade", 5, 0, "restart", Placement((0, 1, 3), (4, 4, 3), (4, 4, 3)))
    supervisor.send(request)
    assert worker.poll() == request
    worker.acknowledge(StopAck("r1", 6))
    assert supervisor.acknowledged() == StopAck("r1", 6)
    supervisor.send(StopRequest("r2", "interrupt (SIGINT)", 6, 0, "restart", request.placement))
    assert supervisor.acknowledged() is None, "a new request drops the old acknowledgement"
    supervisor.clear()
    assert worker.poll() is None and worker.acknowledged() is None
    supervisor.store.set(StoreControlChannel.STOP_KEY, "{torn")
    supervisor.store.check([StoreControlChannel.STOP_KEY])  # the set is processed before the worker reads
    with pytest.raises(ControlRecordError, match="synapse/control/stop is not JSON"):
        worker.poll()
    del decider
