"""The workers' rendezvous, with its stores bound to the narrowest address that works.

torch's c10d rendezvous keeps its state in a ``TCPStore`` (pickled, under a key derived from the
run id), and after the rendezvous the agent hosts a second ``TCPStore`` the workers bootstrap
their process group from. torch binds both to *every* interface, whatever host the endpoint
names, so a process on another machine that reaches the port could write a pickle the
supervisor later loads: remote code execution. Here the stores listen on a socket we bind
ourselves (``master_listen_fd``):

* one node (``trainer.nodes=1``): both stores on 127.0.0.1; nothing is reachable from outside.
* several nodes: the rendezvous store on the endpoint's address when it is a literal IP (else on
  every interface, as the other nodes resolve the name themselves); the workers' bootstrap store
  on every interface (its address is agent rank 0's host name, which only the other nodes
  resolve). docs/multinode.md ("What listens where") says what that exposes.

Ranks follow the nodes: torch numbers the nodes of a rendezvous by host name and pid, so which
node ran rank 0 was an accident; here node ``trainer.node_rank`` = n runs the ranks after those of
nodes 0..n-1 (parameter ``node_rank``), which is what a placement across nodes assumes
(``synapse.partitioning.topology``). Two nodes claiming one node_rank fail the rendezvous, named.

Registered as the rendezvous backend ``synapse-c10d``; same parameters as torch's ``c10d``.
"""
from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError, RendezvousInfo
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

BACKEND = "synapse-c10d"
LOOPBACK = "127.0.0.1"
ALL_INTERFACES = ""  # bind(("", port)): what torch does for every store


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``host`` "" = every IPv4 interface)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted run may reuse a TIME_WAIT port
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def store_on(host: str, bind: str, port: int, timeout: timedelta) -> TCPStore:
    """A TCPStore server listening on ``bind:port`` only; clients reach it at ``host:port``."""
    sock = listening_socket(bind, port)
    # The store owns the descriptor from here on (detach: Python must not close it too).
    return TCPStore(host, sock.getsockname()[1], is_master=True, multi_tenant=False, timeout=timeout,
                    master_listen_fd=sock.detach())


def rendezvous_bind_address(host: str, single_node: bool) -> str:
    if single_node:
        return LOOPBACK
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:  # a host name: other nodes resolve it themselves, maybe to another address
        return ALL_INTERFACES


class BoundRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic rendezvous whose workers' bootstrap store listens on loopback for one node."""

    single_node: bool = False
    node_rank: int | None = None  # trainer.node_rank of this node: its rank among the nodes

    def next_rendezvous(self) -> RendezvousInfo:
        info = super().next_rendezvous()
        if self.node_rank is None:
            return info
        rank = node_ordered_rank(info.store, info.rank, info.world_size, self.node_rank)
        return RendezvousInfo(info.store, rank, info.world_size, info.bootstrap_store_info)

    def get_backend(self) -> str:
        return BACKEND  # torch's registry checks that the handler is the backend it asked for

    def _create_tcp_store_server(self, master_addr, master_port) -> TCPStore:
        bind = LOOPBACK if self.single_node else ALL_INTERFACES
        return store_on(master_addr, bind, master_port, timedelta(seconds=300))


def create_handler(params: RendezvousParameters) -> BoundRendezvousHandler:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    single_node = params.max_nodes == 1
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    try:
        if params.get_as_bool("is_host", True):
            store = store_on(host, rendezvous_bind_address(host, single_node), port, timeout)
        else:
            store = TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)
    except (OSError, ValueError, RuntimeError, TimeoutError) as exc:
        raise RendezvousConnectionError("The connection to the C10d store has failed. See inner exception for "
                                        "details.") from exc
    handler = BoundRendezvousHandler.from_backend(
        params.run_id, store, C10dRendezvousBackend(store, params.run_id), params.min_nodes, params.max_nodes,
        params.local_addr, RendezvousTimeout(*(_seconds(params, key) for key in ("join", "last_call", "close",
                                                                                   "heartbeat"))))
    handler.single_node = single_node
    handler.node_rank = params.get_as_int("node_rank")
    return handler


NODE_RANK_KEY = "synapse/node_rank/{}"


def node_ordered_rank(store, rank: int, world_size: int, node_rank: int) -> int:
    """This node's rank when the nodes are numbered by their ``trainer.node_rank`` (every node of the
    round publishes its node_rank under torch's rank, then each reads all of them)."""
    store.set(NODE_RANK_KEY.format(rank), str(node_rank))
    claimed = [int(store.get(NODE_RANK_KEY.format(r))) for r in range(world_size)]
    if sorted(claimed) != list(range(world_size)):
        raise RendezvousError(f"the {world_size} nodes that met claim trainer.node_rank {sorted(claimed)}; each of "
                              f"0..{world_size - 1} must be claimed once. Fix: give every node its own "
                              f"trainer.node_rank (and the same trainer.nodes on every node)")
    return node_rank


def _seconds(params: RendezvousParameters, key: str) -> timedelta | None:
    value = params.get_as_int(f"{key}_timeout")
    return None if value is None else timedelta(seconds=value)


def register() -> None:
    """Make ``rdzv_backend="synapse-c10d"`` known to torch's launcher (idempotent)."""
    rendezvous_handler_registry.register(BACKEND, create_handler)
