"""failover.replica_engine=torchft: what is refused before any worker starts, and how a step's batch is cut
among the replicas of a quorum."""
from __future__ import annotations

import fcntl
import importlib.util
import ipaddress
import socket
import struct
import threading
import time
import urllib.error
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from synapse.config import ConfigError, typed_config, validate
from synapse.launch import (
    ReplicaLayoutError,
    UnreachableNodeError,
    free_port,
    node_address,
    replicas_by_node,
    serve_replica_meeting,
)
from synapse.partitioning import NodeTopology, Placement
from synapse.pipeline import quorum_share
from synapse.pipeline.quorum import SealedStateTransport, _replica_group_store, respawn_store
from synapse.rundir import ForeignRecordError
from tests.conftest import compose_config

TORCHFT = ["trainer=cpu", "injection=none", "partition=even", "failover.replica_engine=torchft", "trainer.devices=2",
           "data.batch_size=32", "pipeline.microbatches=2"]


@pytest.mark.parametrize("devices", [2, 4, 6])
def test_two_replicas_cut_alike_are_accepted(tmp_path, devices):
    """Replicas of one stage, and pipelines of 2 and 3 stages (R x K, K > 1: a lost rank costs only its replica)."""
    validate(compose_config([*TORCHFT, f"trainer.devices={devices}", "trainer.replicas=2",
                             "pipeline.microbatches=4"], tmp_path))  # 1F1B: at least one per stage


@pytest.mark.parametrize("overrides, says", [
    (["trainer.replicas=1"], r"torchft carries a run of several replicas, but trainer.replicas=1"),
    (["trainer.devices=3", "trainer.replicas=2", "partition.replica_stages=[2,1]"],
     r"torchft needs replicas cut alike .*partition.replica_stages=\[2, 1\]"),
    (["trainer.replicas=2", "trainer.replica_shares=[24,8]"], r"trainer.replica_shares=\[24, 8\] cannot be kept"),
    (["trainer.replicas=2", "failover.enabled=false"], r"not mode=kd with failover.enabled=False"),
])
def test_what_torchft_cannot_carry_is_refused_naming_the_fix(tmp_path, overrides, says):
    with pytest.raises(ConfigError, match=rf"^failover\.replica_engine: .*{says}.*Fix: "):
        validate(compose_config([*TORCHFT, *overrides], tmp_path))


# (devices per node, replicas): one replica of one stage per node, one pipeline of two per node, two replicas
# of one stage per node
ACROSS_NODES = [(1, 2), (2, 2), (2, 4)]


@pytest.mark.parametrize("devices, replicas", ACROSS_NODES)
def test_replicas_each_on_one_node_are_accepted_across_nodes(tmp_path, devices, replicas):
    """Two nodes: each replica is launched by the node that holds its devices."""
    validate(compose_config([*TORCHFT, f"trainer.devices={devices}", f"trainer.replicas={replicas}",
                             "trainer.nodes=2", "trainer.rdzv_endpoint=127.0.0.1:29400"], tmp_path))


def test_a_replica_on_two_nodes_is_refused_naming_the_replica_counts_that_fit(tmp_path):
    """2 nodes of 3 devices as 3 replicas of 2 stages: replica 1 would be run-wide devices 2 and 3, one on each
    node; its stages could not be one launch, nor respawned by one agent."""
    with pytest.raises(ConfigError, match=r"^failover\.replica_engine: torchft runs each replica on one node, .*"
                                          r"replicas of 2 stages, and replica 1 \(run-wide devices 2-3\) would lie on "
                                          r"nodes \[0, 1\]\. Fix: choose trainer.replicas so that each node's devices "
                                          r"are a whole number of replicas \(2 or 6: trainer.replicas=2 is one "
                                          r"pipeline per node\)"):
        validate(compose_config([*TORCHFT, "trainer.devices=3", "trainer.replicas=3", "trainer.nodes=2",
                                 "trainer.rdzv_endpoint=127.0.0.1:29400", "data.batch_size=48"], tmp_path))


def test_torchft_not_installed_names_the_pip_command(tmp_path, monkeypatch):
    """An environment without torchft (the import machinery finds no such module)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torchft" else find_spec(name, *args))
    with pytest.raises(ConfigError, match=r"torchft is not installed .*Fix: pip install torchft"):
        validate(compose_config([*TORCHFT, "trainer.replicas=2"], tmp_path))


def test_equal_shares_of_a_restarted_segment_are_kept(tmp_path):
    """A segment's composed config names the placement's shares; equal ones are what the quorum gives."""
    validate(compose_config([*TORCHFT, "trainer.replicas=2", "trainer.replica_shares=[16,16]"], tmp_path))


@pytest.mark.parametrize("participants", [1, 2, 3, 4])
def test_a_quorum_cuts_the_batch_into_whole_micro_batches_in_order(participants):
    shares = [quorum_share(i, participants, 32, 2) for i in range(participants)]
    assert [i for share in shares for i in share] == list(range(32))
    assert all(len(share) % 2 == 0 for share in shares)
    assert max(map(len, shares)) - min(map(len, shares)) <= 2


def test_a_quorum_larger_than_the_micro_batches_is_refused():
    with pytest.raises(ValueError, match="gives 4 micro-batches to share out"):
        quorum_share(0, 5, 32, 8)


def test_a_respawned_worker_meets_its_group_under_a_prefix_of_its_attempt(monkeypatch):
    """The elastic agent's store outlives its workers: a respawned replica's ranks must not read the dead
    ones' keys there (a gloo address of a dead rank), so a respawned worker's group uses its attempt's prefix."""
    agent_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent_store.port), "RANK": "1",
                        "WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True",
                        "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    assert respawn_store(timedelta(seconds=10)) == {}, "a first worker: torch's env:// as usual"
    agent_store.set("rank_1", "the dead rank's address")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    given = respawn_store(timedelta(seconds=10))
    assert (given["rank"], given["world_size"]) == (1, 2)
    given["store"].set("rank_1", "its own address")
    assert given["store"].get("rank_1") == b"its own address"
    assert agent_store.get("rank_1") == b"the dead rank's address"
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # each attempt's rank 0 serves a store of its own
    assert respawn_store(timedelta(seconds=10)) == {}


def test_a_later_segment_stays_on_torchft_while_its_replicas_are_cut_alike_with_equal_shares(tmp_path):
    """After a decision's restart the next segment's layout decides: replicas of one stage or pipelines of K
    stages stay under torchft; one replica left, replicas cut differently (a SHRINK) or unequal shares (a
    REBALANCE) go on the restart path."""
    from synapse.failover.segments import replica_engine_for
    from synapse.partitioning import Placement

    cfg = compose_config([*TORCHFT, "trainer.devices=4", "trainer.replicas=2"], tmp_path)
    assert replica_engine_for(cfg, Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (16, 16))) == "torchft"
    assert replica_engine_for(cfg, Placement((0, 1, 2, 3), (8,), (8,), 4, (8, 8, 8, 8))) == "torchft"
    assert replica_engine_for(cfg, Placement((0, 1), (4, 4), (4, 4))) == "restart"
    assert replica_engine_for(cfg, Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (24, 8))) == "restart"
    assert replica_engine_for(cfg, Placement((0, 1, 2), (4, 4, 8), (4, 4, 8), 2, (16, 16), (2, 1))) == "restart"


def test_a_later_segment_whose_replica_would_span_two_nodes_goes_on_the_restart_path(tmp_path):
    """2 nodes of 3 devices (run-wide 0-2 and 3-5): after a DEGRADE, 2 pipelines of 2 on devices 0, 1 | 3, 4 stay
    under torchft (one per node); on devices 0, 1 | 2, 3 replica 1 would lie on both nodes."""
    from synapse.failover.segments import replica_engine_for

    cfg = compose_config([*TORCHFT, "trainer.devices=3", "trainer.replicas=2", "trainer.nodes=2",
                          "trainer.rdzv_endpoint=127.0.0.1:29400", "pipeline.microbatches=4"], tmp_path)
    assert replica_engine_for(cfg, Placement((0, 1, 3, 4), (4, 4), (4, 4), 2, (16, 16))) == "torchft"
    assert replica_engine_for(cfg, Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (16, 16))) == "restart"


# ---------------------------------------------------------------- what listens where (docs/multinode.md)
def listening_on(port: int) -> set[str]:
    """The addresses a TCP socket of this machine listens on at ``port`` (the kernel's tables: IPv4 and IPv6)."""
    addresses = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word host-ordered
                addresses.add(str(ipaddress.ip_address(words if width == 32 else raw[::-1])))
    return addresses


def outward_address() -> str | None:
    """An IPv4 address of this machine that is not the loopback (None: it has none)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        address = socket.inet_ntoa(packed[20:24])
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return None


def test_a_node_s_address_is_the_one_on_its_route_to_the_rendezvous_host():
    assert node_address(None) == "127.0.0.1"
    assert node_address("127.0.0.1:29400") == "127.0.0.1" == node_address("localhost:29400")
    outward = outward_address()
    if outward is not None:  # the rendezvous host is this machine, reached at its own outward address
        assert node_address(f"{outward}:29400") == outward


def test_a_host_name_that_resolves_to_the_loopback_here_is_refused_naming_the_fix():
    """/etc/hosts often names a host 127.0.1.1 (or 127.0.0.1, as on this machine): a rendezvous host given by such
    a name would put this node's lighthouse and replicas where no other node reaches them."""
    name = socket.gethostname()
    if not ipaddress.ip_address(socket.gethostbyname(name)).is_loopback:
        pytest.skip(f"{name} resolves to an outward address on this machine")
    with pytest.raises(UnreachableNodeError, match=rf"trainer.rdzv_endpoint={name}:29400: {name} resolves to 127\..*, "
                                                   r"a loopback address, on this host.*Fix: give trainer.rdzv_endpoint "
                                                   r"as the rendezvous host's IP address"):
        node_address(f"{name}:29400")


@pytest.mark.parametrize("across", [False, True])
def test_the_lighthouse_listens_on_the_rendezvous_host_s_address_only(tmp_path, across):
    """One node: the lighthouse and the first quorum's store on the loopback. Across nodes (the decider): the
    lighthouse on the address of the run's rendezvous host (the address the nodes reach already), at a port
    the system picked, never on every interface; the meeting on the run's store under the segment's prefix."""
    host = outward_address() if across else "127.0.0.1"
    if host is None:
        pytest.skip("this machine has no address but the loopback")
    endpoint = f"{host}:{free_port()}"
    cfg = typed_config(compose_config([*TORCHFT, "trainer.replicas=2", *(
        ["trainer.nodes=2", f"trainer.rdzv_endpoint={endpoint}"] if across else [])], tmp_path))
    with serve_replica_meeting(cfg.trainer, 1.0, tmp_path, "segment 0") as meeting:
        lighthouse_host, _, port = meeting.lighthouse.removeprefix("http://").rpartition(":")
        assert lighthouse_host == host and listening_on(int(port)) == {host}
        if across:
            assert (meeting.start_store, meeting.replicas) == (endpoint, ())
            assert meeting.start_prefix.startswith("synapse/replicas/") and len(meeting.start_prefix) > 20
        else:
            store_host, _, store_port = meeting.start_store.rpartition(":")
            assert store_host == "127.0.0.1" and listening_on(int(store_port)) == {"127.0.0.1"}
    assert listening_on(int(port)) == set(), "the lighthouse ends with its segment"


def test_a_replica_group_s_store_listens_on_its_node_s_address_only(tmp_path):
    """Stage 0 of each replica serves its group's store (torchft's managers and the cross-replica group meet
    there): on the node's address only. torch's own server listened on every interface."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        host, port = _replica_group_store(0, "127.0.0.1")
        assert host == "127.0.0.1" and listening_on(port) == {"127.0.0.1"}
    finally:
        dist.destroy_process_group()


def test_replicas_are_placed_on_the_nodes_that_hold_their_devices():
    """2 nodes of 2 devices: 2 pipelines of 2 (one per node), 4 replicas of one stage (two per node); 4 x 1 on
    nodes of 3 devices as 2 x 3 would put replica 1 on both nodes."""
    two_nodes = NodeTopology(2, (0, 1))
    assert replicas_by_node(two_nodes, Placement((0, 1, 2, 3), (3, 3), (3, 3), replicas=2)) == {0: [0], 1: [1]}
    assert replicas_by_node(two_nodes, Placement((0, 1, 2, 3), (6,), (6,), replicas=4)) == {0: [0, 1], 1: [2, 3]}
    # run-wide ids of 2 nodes of 3 devices: 0-2 and 3-5
    with pytest.raises(ReplicaLayoutError, match=r"replica 1 runs on devices \[2, 3\], which lie on nodes \[0, 1\]"):
        replicas_by_node(NodeTopology(2, (0, 1, 2)), Placement((0, 1, 2, 3, 4, 5), (3, 3), (3, 3), replicas=3))


# ---------------------------------------------------------------- a heal's state, sealed with the run's key
class Planted:
    """What a forged state would carry: unpickling it creates a file (code run in the healing worker)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_a_heal_s_state_travels_sealed_on_the_node_s_address_only():
    """A peer's state (what torchft's checkpoint transport sends a returning replica) comes back whole; the
    sender listens on its node's address only; a request made before the state is put out waits for it."""
    timeout = timedelta(seconds=20)
    # the sender waits 3 s for a step's state to be put out
    sender, receiver = (SealedStateTransport("127.0.0.1", b"k" * 32, t) for t in (timedelta(seconds=3), timeout))
    try:
        assert listening_on(int(sender.metadata().rsplit(":", 1)[1].split("/")[0])) == {"127.0.0.1"}
        state = {"user": {"tensors": {"w": torch.arange(6.0)}, "scheduler": {"last_epoch": 7}},
                 "torchft": {"step": 8, "batches_committed": 16}}
        received: list = []
        early = threading.Thread(target=lambda: received.append(receiver.recv_checkpoint(0, sender.metadata(), 8,
                                                                                         timeout)))
        early.start()
        time.sleep(0.3)  # the receiver asks first, as when it leaves the quorum before the sender
        sender.send_checkpoint([1], 8, state, timeout)
        early.join(timeout=20)
        assert torch.equal(received[0]["user"]["tensors"]["w"], state["user"]["tensors"]["w"])
        assert received[0]["torchft"] == state["torchft"]
        sender.disallow_checkpoint()
        with pytest.raises(urllib.error.HTTPError, match="404"):  # the step is over: nothing served
            receiver.recv_checkpoint(0, sender.metadata(), 8, timeout)
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_a_state_not_sealed_with_the_run_s_key_is_refused_before_it_is_loaded(tmp_path):
    """Anyone who reaches a node, or tells a quorum a forged address, could serve a returning replica a state
    of their own; torchft's transport unpickles it (code run in the worker). One sealed with another key is
    refused, and nothing in it runs."""
    timeout = timedelta(seconds=20)
    planted = tmp_path / "ran"
    forger, receiver = SealedStateTransport("127.0.0.1", b"f" * 32, timeout), SealedStateTransport(
        "127.0.0.1", b"k" * 32, timeout)
    try:
        forger.send_checkpoint([1], 3, {"user": Planted(planted)}, timeout)
        with pytest.raises(ForeignRecordError, match=r"state of step 3 from replica rank 0 .* is not sealed with "
                                                     r"this run's key: refused, not loaded"):
            receiver.recv_checkpoint(0, forger.metadata(), 3, timeout)
        assert not planted.exists()
    finally:
        forger.shutdown()
        receiver.shutdown()
