"""``failover.replica_engine=torchft``: a segment of R replicas as R elastic launches under torchft's lighthouse.

The supervisor runs the lighthouse (torchft's quorum server) for the segment and one elastic launch per
replica, each on its own rendezvous with its own restart budget (``failover.replica_respawns``): a
replica's dead worker is respawned by its agent and heals from a peer (``synapse.pipeline.quorum``) while
the other replicas go on; nothing of theirs restarts. Inside a replica the K stages are a launch as
``launch_pipeline`` makes them (its pipeline, its control exchange). A replica whose budget is spent
is gone for the segment; the segment fails only when every replica has (then the supervisor's restart
path takes over from the newest checkpoint).

No health monitor tears these launches down: a dead worker is its agent's to respawn, and a rank that
hangs fails its replica's collectives (``trainer.collective_timeout_s``).

Across nodes the decider serves the segment's ``ReplicaMeeting`` (``serve_replica_meeting``: the lighthouse
on the rendezvous host's address, at a port the system picks, told to the agents in their sealed launch
orders; the first quorum's meeting on the run's store) and each node's agent launches the replicas whose
devices it holds (``replicas_by_node``: a replica never spans nodes). Each replica group's own store and
torchft's cross-replica process group then listen on the node's address on the route to the rendezvous
host (``node_address``), which the other nodes reach; on one node everything Synapse binds is loopback.
"""
from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch.distributed.launcher.api import elastic_launch

from synapse.config import TrainerConfig, resolve_devices
from synapse.launch.elastic import launch_config, launch_pipeline, preload_worker_modules, start_fork_server
from synapse.launch.rendezvous import LOOPBACK, store_on
from synapse.launch.root_cause import WorkerFailure
from synapse.partitioning import NodeTopology, Placement
from synapse.pipeline import LaunchTask, ReplicaGroupSpec, ReplicaMeeting, worker_main
from synapse.rundir import FAILURES, derived_id, run_key


class ReplicaLayoutError(ValueError):
    """A layout whose replicas torchft cannot carry across nodes (a replica on two nodes); names the fix."""


class UnreachableNodeError(ValueError):
    """This node's address for the other nodes would be a loopback one (a rendezvous host name resolved so
    here); names the fix."""


def replicas_by_node(topology: NodeTopology, placement: Placement) -> dict[int, list[int]]:
    """Each node's replicas (those whose devices it holds), nodes ascending. A replica's stages are one
    elastic launch on one node (its pipeline's group, its agent that respawns it): one that spans nodes is
    refused."""
    nodes: dict[int, list[int]] = {}
    for replica in range(placement.replicas):
        devices = list(placement.pipeline(replica).devices)
        held_by = topology.nodes_of(devices)
        if len(held_by) != 1:
            raise ReplicaLayoutError(
                f"replica {replica} runs on devices {devices}, which lie on nodes {held_by}: under torchft a "
                f"replica's stages are one launch on one node. Fix: choose trainer.replicas so that each replica's "
                f"stages fit on one node (devices per node a multiple of the stages per replica), or use "
                f"failover.replica_engine=restart")
        nodes.setdefault(held_by[0], []).append(replica)
    return dict(sorted(nodes.items()))


def node_address(endpoint: str | None) -> str:
    """This node's address on its route to the rendezvous host ``endpoint`` (host:port): what the other
    nodes reach it at, and the one address its replica groups listen on. Loopback for one node."""
    if not endpoint:
        return LOOPBACK
    host, _, port = endpoint.rpartition(":")
    address = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    if ipaddress.ip_address(address).is_loopback:
        if host != "localhost" and not _is_address(host):
            # e.g. /etc/hosts naming this host 127.0.1.1: its replicas would listen where no other node reaches
            raise UnreachableNodeError(
                f"trainer.rdzv_endpoint={endpoint}: {host} resolves to {address}, a loopback address, on this host, "
                f"so under torchft the other nodes could not reach its lighthouse or replicas. Fix: give "
                f"trainer.rdzv_endpoint as the rendezvous host's IP address, the same on every node")
        return LOOPBACK
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, int(port)))  # no packet is sent: the kernel only picks the route's source address
        return str(probe.getsockname()[0])


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def serve_replica_meeting(trainer: TrainerConfig, heartbeat_timeout_s: float, run_dir: Path, attempt: str
                          ) -> Iterator[ReplicaMeeting]:
    """For one segment under torchft: the lighthouse, and the store where the replicas meet before their first
    quorum. One node: both on the loopback, the store this process's own. Across nodes (the decider): the
    lighthouse on the rendezvous host's address, at a port the system picks; the meeting on the run's store
    (which the nodes reach already) under a prefix derived from the run's key and the segment."""
    from torchft._torchft import LighthouseServer  # type: ignore[import-untyped]

    across = trainer.nodes > 1 and trainer.rdzv_endpoint is not None
    host = node_address(trainer.rdzv_endpoint) if across else LOOPBACK
    lighthouse = LighthouseServer(bind=f"{host}:0", min_replicas=1, join_timeout_ms=1000,
                                  heartbeat_timeout_ms=int(heartbeat_timeout_s * 1000))
    own_store = None
    try:
        address = f"http://{host}:" + lighthouse.address().rsplit(":", 1)[1]  # it names the host: say the address
        if across:
            prefix = "synapse/replicas/" + derived_id(run_key(run_dir), f"replica meeting {attempt}", 12)
            yield ReplicaMeeting(address, str(trainer.rdzv_endpoint), prefix)
        else:
            own_store = store_on(LOOPBACK, LOOPBACK, 0, timedelta(seconds=float(trainer.rdzv_timeout_s)))
            yield ReplicaMeeting(address, f"{LOOPBACK}:{own_store.port}")
    finally:
        lighthouse.shutdown()
        del own_store


# The cause of a launch whose every replica is gone (each spent its respawns). Across nodes one node's replicas
# may all be gone while another node's train on: that node's report of it stops no one (failover/decider.py)
REPLICAS_LOST = "replicas_lost"


def carried_by_torchft(task: LaunchTask) -> bool:
    """Whether ``task``'s segment runs under torchft (its config says so, and it has replicas to carry)."""
    return str(task.config.failover.replica_engine) == "torchft" and task.placement.replicas > 1


def _launch_replica(task: LaunchTask, run_dir: Path, name: str, replica: int, meeting: ReplicaMeeting,
                    local: dict[int, int], address: str) -> dict[str, Any]:
    """Replica ``replica``'s launch (its logs under ``name``) to its end: its last rank's summary."""
    placement, cfg = task.placement, task.config
    pipeline = placement.pipeline(replica)
    # the console shows replica 0's ranks (trainer.local_ranks_filter); every replica's are in its logs. The
    # workers keep the segment's nodes (the stop requests on the run's store, gloo on the node's address)
    trainer = dataclasses.replace(cfg.trainer, devices=[local[d] for d in pipeline.devices], node_devices=None,
                                  local_ranks_filter=cfg.trainer.local_ranks_filter if replica == 0 else ())
    spec = ReplicaGroupSpec(replica, placement.replicas, meeting, float(cfg.trainer.collective_timeout_s),
                            tuple(placement.devices), address)
    replica_task = dataclasses.replace(task, config=dataclasses.replace(cfg, trainer=trainer), placement=pipeline,
                                       replica_group=spec)
    # each replica's own launch on this node: a loopback rendezvous (its launch id kept: the commit fence's)
    config = launch_config(dataclasses.replace(trainer, nodes=1, node_rank=0, rdzv_endpoint=None), run_dir, name)
    config.max_restarts = cfg.failover.replica_respawns  # the replica's agent respawns its dead workers
    results = elastic_launch(config, worker_main)(replica_task, str(run_dir), str(FAILURES.path(run_dir, attempt=name)))
    return next((r for r in results.values() if r), {})


def replica_attempt(attempt: str, replica: int) -> str:
    """The launch name (logs/launch_<name>/) of one replica's launch in segment ``attempt`` (across nodes too:
    a replica is launched by one node only)."""
    return f"{attempt}_replica{replica}"


def launch_replica_groups(task: LaunchTask, run_dir: Path, attempt: str = "0", log: Callable[[str], None] = print,
                          store_hosted: bool = False, meeting: ReplicaMeeting | None = None) -> dict[str, Any]:
    """Run ``task``'s replicas (``meeting.replicas``, or all), each a launch of its own under one lighthouse, to
    the end of the segment; return replica 0's summary (or a surviving replica's). Without ``meeting`` this
    process serves the lighthouse (one node). One pipeline is ``launch_pipeline``'s."""
    cfg = task.config
    if not carried_by_torchft(task):
        return launch_pipeline(task, run_dir, attempt, log, store_hosted)
    if meeting is None:
        with serve_replica_meeting(cfg.trainer, cfg.failover.replica_heartbeat_timeout_s, run_dir, attempt) as own:
            return _launch_replicas(task, run_dir, attempt, log, own)
    return _launch_replicas(task, run_dir, attempt, log, meeting)


def _launch_replicas(task: LaunchTask, run_dir: Path, attempt: str, log: Callable[[str], None],
                     meeting: ReplicaMeeting) -> dict[str, Any]:
    placement, cfg = task.placement, task.config
    preload_worker_modules(cfg.data.name)
    start_fork_server()
    replicas = list(meeting.replicas) or list(range(placement.replicas))
    # this node's devices, replica after replica: their run-wide ids in the placement, their local ids here
    run_wide = [d for r in replicas for d in placement.pipeline(r).devices]
    local = dict(zip(run_wide, resolve_devices(cfg.trainer), strict=True))
    address = node_address(cfg.trainer.rdzv_endpoint if cfg.trainer.nodes > 1 else None)
    if meeting.replicas:  # across nodes: said on this node's console
        log(f"torchft: launching replica(s) {replicas} on this node's devices "
            f"{list(local.values())} (lighthouse {meeting.lighthouse}, this node at {address})")
    summaries: dict[int, dict[str, Any]] = {}
    failures: dict[int, BaseException] = {}

    def run_replica(replica: int) -> None:
        try:
            summaries[replica] = _launch_replica(task, run_dir, replica_attempt(attempt, replica), replica, meeting,
                                                 local, address)
        except Exception as exc:  # noqa: BLE001 - told below, with the other replicas' (ChildFailedError too)
            failures[replica] = exc

    threads = [threading.Thread(target=run_replica, args=(r,), name=f"synapse-replica-{r}", daemon=True)
               for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for replica, exc in sorted(failures.items()):
        log(f"replica {replica}: its launch ended after failover.replica_respawns={cfg.failover.replica_respawns} "
            f"respawns: {type(exc).__name__}: {str(exc)[:300]}")
    if not summaries:
        kinds = ", ".join(sorted({type(e).__name__ for e in failures.values()}))
        raise WorkerFailure(f"every replica's launch failed ({kinds}); the segment goes on from the newest "
                            f"checkpoint", None, REPLICAS_LOST, retry_same_devices=True)
    written = [summaries[r] for r in sorted(summaries) if summaries[r]]  # replica 0's last rank writes it
    return written[0] if written else {}
