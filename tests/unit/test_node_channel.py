"""The decider-agent channel over a real TCPStore on loopback: typed records round trip, a
node_rank claimed twice is refused, orders arrive in order, an unreachable decider is named
within the timeout, and a record the run did not seal is refused and logged, never raised."""
from __future__ import annotations

import json
import threading
import time

import pytest

from synapse.failover import (
    ExitOrder,
    LaunchOrder,
    NodeChannel,
    NodeHello,
    NodeReport,
    NodeSetupError,
    StopOrder,
    Welcome,
)
from synapse.launch import free_port
from synapse.rundir import events_path, read_events


@pytest.fixture
def pair(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    decider = NodeChannel.host(endpoint, timeout_s=10, run_dir=tmp_path)
    return decider, NodeChannel.connect(endpoint, node_rank=1, timeout_s=10, run_dir=tmp_path)


def test_hello_welcome_orders_reports_and_beats_round_trip(pair):
    decider, agent = pair
    agent.say_hello(NodeHello(1, 2, [0, 1], "host-b", 123, "n1"))
    assert decider.hellos() == {1: NodeHello(1, 2, [0, 1], "host-b", 123, "n1")}
    assert agent.wait_welcome(1, timeout_s=0.1, nonce="n1") is None
    decider.welcome(1, Welcome(hello_nonce="n1", instance="i1"))
    assert agent.wait_welcome(1, timeout_s=0.2, nonce="earlier") is None, "a welcome for another hello is not ours"
    assert agent.wait_welcome(1, timeout_s=1, nonce="n1") == Welcome(None, "n1", "i1")
    decider.join("i1")
    agent.join("i1")
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


def test_a_node_rank_claimed_twice_is_refused(pair, tmp_path):
    decider, agent = pair
    agent.say_hello(NodeHello(1, 2, [0], "a", 1, "first"))
    twin = NodeChannel.connect(decider.endpoint, node_rank=1, timeout_s=10, run_dir=tmp_path)
    with pytest.raises(NodeSetupError, match="trainer.node_rank=1 is already taken"):
        twin.say_hello(NodeHello(1, 2, [0], "b", 2, "second"))


def test_records_the_run_did_not_seal_are_refused_and_logged_not_raised(pair, caplog):
    """#33 item 1: garbage under a node report key killed the decider's watch thread; a forged
    well-formed report (a failed rank) would have dropped a device. Both read as absent, said once."""
    decider, agent = pair
    report_key, beat_key = "synapse/nodes/report/0/1", "synapse/nodes/beat/1"
    forged = json.dumps({"node_rank": 1, "segment": 0, "outcome": "failed", "rank": 1, "device_failure": True})
    for value in (b"\x80\x04garbage\xff", forged):
        decider.store.set(report_key, value)
        decider.store.check([report_key])
        assert decider.report_of(0, 1) is None
        assert decider.report_of(0, 1) is None
    decider.store.set(beat_key, "not a number")  # the store's add on it would have dropped the connection
    decider.store.check([beat_key])
    assert decider.beats(1) == 0 and agent.beat(1) == 1 and decider.beats(1) == 1
    refusals = [r.getMessage() for r in caplog.records if "refused the value" in r.getMessage()]
    assert len(refusals) == 3, refusals  # each value once, however often it was read
    assert all("decider: refused the value under 'synapse/nodes/" in line for line in refusals)
    report = NodeReport(1, 0, "finished")
    agent.report(report)
    assert decider.report_of(0, 1) == report, "the channel works on after the refusals"
    events = [e for e in read_events(events_path(agent_run_dir(decider))) if e["event"] == "store_record_refused"]
    assert {e["key"] for e in events} == {report_key, beat_key}


def test_an_overwritten_order_and_report_are_put_back(pair):
    decider, agent = pair
    decider.order(1, StopOrder(0, "why"))
    decider.store.set("synapse/nodes/order/1/0", "garbage")
    assert agent.next_order(1, 0, timeout_s=0.2) is None
    decider.keep_orders(1, since=0)
    assert agent.next_order(1, 0, timeout_s=1) == StopOrder(0, "why")
    agent.report(NodeReport(1, 0, "finished"))
    agent.store.delete_key("synapse/nodes/report/0/1")
    assert decider.report_of(0, 1) is None
    agent.keep_report()
    assert decider.report_of(0, 1) == NodeReport(1, 0, "finished")


def agent_run_dir(channel: NodeChannel):
    return channel.records.refused.events.path.parent


@pytest.mark.slow  # waits out the connection timeout
def test_an_unreachable_decider_is_named_within_the_timeout():
    endpoint = f"127.0.0.1:{free_port()}"  # nobody listens
    started = time.monotonic()
    with pytest.raises(NodeSetupError, match=r"node 0 could not be reached within trainer.rdzv_timeout_s=2 s"):
        NodeChannel.connect(endpoint, node_rank=1, timeout_s=2, run_dir="/nonexistent")
    assert time.monotonic() - started < 30


def test_ranks_follow_node_rank_whatever_order_torch_gave_the_nodes(tmp_path, caplog):
    from datetime import timedelta

    from torch.distributed import HashStore
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from synapse.launch import NODE_RANK_KEY, node_ordered_rank
    from synapse.rundir import Refusals, SealedStore, run_key

    def sealed(store):
        store.set_timeout(timedelta(seconds=2))
        return SealedStore(store, run_key(tmp_path), Refusals(tmp_path, "rendezvous"))

    records = sealed(HashStore())
    records.put(NODE_RANK_KEY.format(0), 1)  # torch's rank 0 is trainer.node_rank 1 (it sorted by pid)
    assert node_ordered_rank(records, rank=1, world_size=2, node_rank=0, timeout_s=5) == 0
    twice = sealed(HashStore())
    twice.put(NODE_RANK_KEY.format(0), 0)
    with pytest.raises(RendezvousError, match=r"claim trainer.node_rank \[0, 0\]"):
        node_ordered_rank(twice, rank=1, world_size=2, node_rank=0, timeout_s=5)
    forged = sealed(HashStore())
    forged.store.set(NODE_RANK_KEY.format(0), "1")  # not sealed: refused, waited past until the timeout
    with pytest.raises(RendezvousError, match=r"node\(s\) \[0\] of this round did not say"):
        node_ordered_rank(forged, rank=1, world_size=2, node_rank=0, timeout_s=0.3)
    assert any("refused the value under 'synapse/node_rank/0'" in r.getMessage() for r in caplog.records)


def test_stop_requests_cross_nodes_through_the_deciders_store(tmp_path, caplog):
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
    decider = NodeChannel.host(endpoint, timeout_s=10, run_dir=tmp_path)  # its store: served while referenced
    groups = lambda nodes, failover=True: (  # noqa: E731  (the trainer and failover groups control_endpoint reads)
        OmegaConf.create({"nodes": nodes, "rdzv_endpoint": endpoint}), OmegaConf.create({"enabled": failover}))
    assert control_endpoint(*groups(2)) == endpoint and control_endpoint(*groups(1)) is None
    assert control_endpoint(*groups(2, failover=False)) is None
    supervisor, worker = (open_channel(tmp_path, control_endpoint(*groups(2)), 10, launch=3) for _ in range(2))
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
    store = supervisor.records.store
    # #33 item 9: garbage, a crafted pickle, a well-formed request nobody sealed, and a sealed request of
    # another launch (replayed) are each refused and logged; rank 0 reads "no request" and stops nothing
    foreign = [b"{torn", b"\x80\x04\x95crafted pickle", json.dumps(request.to_dict()).encode()]
    other_launch = open_channel(tmp_path, control_endpoint(*groups(2)), 10, launch=2)
    other_launch.send(request)
    foreign.append(store.get(StoreControlChannel.STOP_KEY))
    for value in foreign:
        store.set(StoreControlChannel.STOP_KEY, value)
        store.check([StoreControlChannel.STOP_KEY])  # the set is processed before the worker reads
        assert worker.poll() is None
    refusals = [r.getMessage() for r in caplog.records if "under 'synapse/control/stop'" in r.getMessage()]
    assert len(refusals) == len(foreign), refusals
    supervisor.send(request)
    store.set(StoreControlChannel.STOP_KEY, "overwritten")
    supervisor.keep()  # the supervisor's watcher puts its request back
    assert worker.poll() == request
    with pytest.raises(ControlRecordError):
        StopRequest.from_dict({"id": "x"})
    del decider


def test_the_decider_leaves_once_every_agent_acknowledged_its_exit(pair):
    """Issue #36, item 3: the decider serves the store, so it must not leave before the agents read
    their exit orders. It waits for each one's acknowledgement (not a fixed sleep, as before), and
    names the nodes that stayed silent once the timeout has passed."""
    decider, agent = pair
    decider.order(1, ExitOrder())
    def agent_reads_it_and_acknowledges():
        if agent.next_order(1, 0, timeout_s=1) == ExitOrder():
            agent.acknowledge_exit(1, 0)

    acknowledging = threading.Timer(0.5, agent_reads_it_and_acknowledges)
    acknowledging.start()
    started = time.monotonic()
    assert decider.await_exit_acks({1: 0}, timeout_s=5) == []
    assert 0.4 < time.monotonic() - started < 4, "left when the agent acknowledged, not before, not at the timeout"
    acknowledging.join()
    decider.order(1, ExitOrder("a second run end"))
    started = time.monotonic()
    assert decider.await_exit_acks({1: 1}, timeout_s=0.5) == [1], "order 0's acknowledgement is not order 1's"
    assert time.monotonic() - started >= 0.5
