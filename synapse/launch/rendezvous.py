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

Binding narrowly does not keep out a process of the same machine (any user reaches 127.0.0.1),
nor one of the network for several nodes. torch's state is therefore sealed with the run's key
(``synapse.rundir.run_key``): ``SealedRendezvousBackend`` stores it with an HMAC and checks the
HMAC of what it reads back before torch unpickles it. A value another process put there (a crafted
pickle, garbage, torch's "no state yet" marker, a deletion) is refused, said once, and replaced by
the last state this node verified, so torch never sees it. The run id is derived from the key as
well (not guessable, but ``list_keys`` shows it: the seal is what protects). The node-rank records
below are sealed too, and so are the few keys torch itself writes and reads once per round (the
bootstrap store's address, the agents' rank assignment, the exit barrier): torch's agent is handed a
``SealedRoundStore``. A foreign value there is refused; one that cannot be waited past fails the
launch as no device's fault (``ForeignRoundValueError``), and the supervisor retries it on the same
devices. The workers' bootstrap store stays unsealed (gloo reads it in C++ while the group forms); a
group that does not form is judged no device's fault as well (``root_cause``).

Registered as the rendezvous backend ``synapse-c10d``; same parameters as torch's ``c10d``, plus
``run_dir`` (where the run's key is; required).
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
import time
from datetime import timedelta
from pathlib import Path

from torch.distributed import Store, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousInfo,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from synapse.rundir import (
    ABSENT,
    RUN_KEY,
    ForeignRecordError,
    Refusals,
    SealedStore,
    derived_id,
    open_bytes,
    run_key,
    seal_bytes,
)

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


class SealedRendezvousBackend(C10dRendezvousBackend):
    """torch's c10d backend with its state sealed by the run's key: what torch would unpickle is
    first checked to be what one of the run's agents wrote (module docstring)."""

    def __init__(self, store, run_id: str, key: bytes, refused):
        super().__init__(store, run_id)
        self._mac_key, self._refused = key, refused
        self._last: tuple[bytes, bytes] | None = None  # (state, store value) this node last verified

    def get_state(self):
        # compare_set(k, ABSENT, ABSENT) reads without blocking: torch's get would wait for a deleted key
        # for the whole read timeout.
        raw = self._call_store("compare_set", self._key, ABSENT, ABSENT)
        return self._decode_state(None if raw == ABSENT.encode() else raw)

    def set_state(self, state: bytes, token=None):
        result = super().set_state(seal_bytes(self._mac_key, self._key, "", state), token)
        if result is None:
            return None
        new_state, new_token, _ = result  # opened by _decode_state; torch compares it with what it asked for
        return new_state, new_token, new_state == state

    def _decode_state(self, base64_state: bytes | None):
        for _ in range(8):  # each pass: a foreign value found and the last verified state put back
            if base64_state == self._NULL_SENTINEL.encode() and self._last is None:
                return None  # no state yet: torch's own marker, the key's first value
            try:
                if base64_state is None or base64_state == self._NULL_SENTINEL.encode():
                    # a state once verified does not go away: a deletion, or the "no state" marker written
                    # over it, is someone's reset of the rendezvous
                    raise ForeignRecordError("the state this node verified was deleted or reset")
                state = open_bytes(self._mac_key, self._key, "", base64.b64decode(base64_state, validate=True))
            except (ForeignRecordError, binascii.Error, ValueError) as exc:
                self._refused(self._key, base64_state or b"", f"torch's rendezvous state: {exc}")
                base64_state = self._put_back(base64_state)
                continue
            self._last = (state, base64_state)
            return state, base64_state
        raise RendezvousStateError(f"the rendezvous state under {self._key} was replaced by a foreign value 8 times "
                                   f"in a row; someone who can reach the store is fighting the run for it")

    def _put_back(self, found: bytes | None) -> bytes:
        """Put the last verified state (or torch's "no state yet" marker) back where ``found`` is, unless
        the key changed meanwhile; returns what the key holds now."""
        desired = self._last[1] if self._last is not None else self._NULL_SENTINEL.encode()
        return self._call_store("compare_set", self._key, found or "", desired)


class ForeignRoundValueError(RendezvousError):
    """A key torch reads once per round holds a value this run did not seal, and its writer (another node's
    agent) will not write it again: the round cannot complete. No device is to blame; the launch is retried."""


class SealedRoundStore(Store):
    """The round's store as torch's agent sees it, with every value it sets sealed with the run's key.

    torch writes and reads a few keys once per round (under ``torch.rendezvous.<id>.<round>/``): the
    workers' bootstrap store address (``MASTER_ADDR``, ``MASTER_PORT``: parsed with ``int``), the agents'
    role infos and rank assignment (``torchelastic/role_info/<n>``, ``torchelastic/assigned_ranks/<n>``:
    JSON) and the exit barrier (``torchelastic/agent/terminal_state/...``). None is unpickled, but a value
    another process wrote there made the agent raise (a failed launch) or start its workers on a forged
    address or rank. Here ``set`` seals and ``get`` opens: a foreign value is refused and logged; for a key
    this process wrote, its own value is put back and used; for another agent's key, it is waited past
    until the store's timeout, then ``ForeignRoundValueError``. Counters (``add``: the exit barrier's member
    count) and existence checks (``wait``, ``check``) carry no value torch parses and stay as they are; a
    counter made unusable fails only the exit barrier, which torch logs and passes.
    """

    def __init__(self, inner: Store, key: bytes, refused):
        super().__init__()
        self.inner, self._mac_key, self._refused = inner, key, refused
        self._written: dict[str, tuple[bytes, bytes]] = {}  # key -> (value, sealed value) set by this process

    def set(self, key: str, value) -> None:
        plain = value.encode() if isinstance(value, str) else bytes(value)
        sealed = seal_bytes(self._mac_key, key, "round", plain)
        self.inner.set(key, sealed)
        self._written[key] = (plain, sealed)

    def get(self, key: str) -> bytes:
        if key in self._written:  # ours: never waited for, even when someone deleted it
            raw = self.inner.compare_set(key, ABSENT, ABSENT)
            if raw == ABSENT.encode():
                self._refused(key, b"", "torch's once-per-round key: deleted by another process")
                self.inner.set(key, self._written[key][1])
                return self._written[key][0]
        else:
            raw = self.inner.get(key)  # torch's semantics: wait until the key exists (up to the store's timeout)
        deadline = time.monotonic() + self.inner.timeout.total_seconds()
        while True:
            try:
                return open_bytes(self._mac_key, key, "round", raw)
            except ForeignRecordError as exc:
                self._refused(key, raw, f"torch's once-per-round key: {exc}")
            if key in self._written:  # ours: put it back (for the other agents) and use it
                plain, sealed = self._written[key]
                self.inner.compare_set(key, raw, sealed)
                return plain
            if time.monotonic() > deadline:
                raise ForeignRoundValueError(
                    f"the rendezvous key {key!r} holds a value this run did not seal (another process wrote it) "
                    f"and its writer will not write it again; this round cannot complete. No device is to blame")
            time.sleep(0.05)
            now = self.inner.compare_set(key, ABSENT, ABSENT)
            raw = b"" if now == ABSENT.encode() else now

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def multi_set(self, keys: list[str], values: list) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        self._written.pop(key, None)
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:  # type: ignore[override]
        return self.inner.timeout


class BoundRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic rendezvous whose workers' bootstrap store listens on loopback for one node."""

    single_node: bool = False
    node_rank: int | None = None  # trainer.node_rank of this node: its rank among the nodes
    records: SealedStore | None = None  # this run's sealed records on the rendezvous store

    def next_rendezvous(self) -> RendezvousInfo:
        info = super().next_rendezvous()
        if self.node_rank is None or self.records is None:
            return info
        records = SealedStore(getattr(info.store, "inner", info.store), self.records.key, self.records.refused)
        rank = node_ordered_rank(records, info.rank, info.world_size, self.node_rank,
                                 self._settings.timeout.join.total_seconds())
        return RendezvousInfo(info.store, rank, info.world_size, info.bootstrap_store_info)

    def _get_store(self) -> Store:
        """The round's store: torch's once-per-round keys on it sealed (``SealedRoundStore``)."""
        store = super()._get_store()
        return store if self.records is None else SealedRoundStore(store, self.records.key, self.records.refused)

    def get_backend(self) -> str:
        return BACKEND  # torch's registry checks that the handler is the backend it asked for

    def _create_tcp_store_server(self, master_addr, master_port) -> TCPStore:
        bind = LOOPBACK if self.single_node else ALL_INTERFACES
        return store_on(master_addr, bind, master_port, timedelta(seconds=300))


def create_handler(params: RendezvousParameters) -> BoundRendezvousHandler:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    single_node = params.max_nodes == 1
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    run_dir = params.get("run_dir")
    if not run_dir:
        raise ValueError(f"the {BACKEND} rendezvous needs rdzv_configs['run_dir']: the run directory whose "
                         f"{RUN_KEY.shown} seals the rendezvous state (synapse.launch.elastic.launch_config passes it)")
    try:
        if params.get_as_bool("is_host", True):
            store = store_on(host, rendezvous_bind_address(host, single_node), port, timeout)
        else:
            store = TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)
    except (OSError, ValueError, RuntimeError, TimeoutError) as exc:
        raise RendezvousConnectionError("The connection to the C10d store has failed. See inner exception for "
                                        "details.") from exc
    key = run_key(Path(run_dir))  # after the store is reached: every node reads the key its run made
    refused = Refusals(run_dir, source="rendezvous")
    handler = BoundRendezvousHandler.from_backend(
        params.run_id, store, SealedRendezvousBackend(store, params.run_id, key, refused), params.min_nodes,
        params.max_nodes, params.local_addr, RendezvousTimeout(*(_seconds(params, key) for key in (
            "join", "last_call", "close", "heartbeat"))))
    handler.single_node = single_node
    handler.node_rank = params.get_as_int("node_rank")
    handler.records = SealedStore(store, key, refused)
    return handler


NODE_RANK_KEY = "synapse/node_rank/{}"


def node_ordered_rank(records: SealedStore, rank: int, world_size: int, node_rank: int, timeout_s: float) -> int:
    """This node's rank when the nodes are numbered by their ``trainer.node_rank`` (every node of the
    round publishes its node_rank under torch's rank, then each reads all of them). A value another
    process wrote is refused and waited past (this node puts its own back meanwhile)."""
    if world_size == 1:
        return node_rank  # one node: nothing to order, nothing to publish
    mine = NODE_RANK_KEY.format(rank)
    records.put(mine, node_rank)
    deadline = time.monotonic() + timeout_s
    claimed: dict[int, int] = {}
    while len(claimed) < world_size:
        for r in range(world_size):
            if r not in claimed and isinstance(value := records.get(NODE_RANK_KEY.format(r)), int):
                claimed[r] = value
        if len(claimed) < world_size:
            if time.monotonic() > deadline:
                raise RendezvousError(f"torch's node(s) {sorted(set(range(world_size)) - set(claimed))} of this round "
                                      f"did not say their trainer.node_rank within {timeout_s:g} s. Fix: start every "
                                      f"node with the same trainer.nodes and trainer.rdzv_endpoint")
            records.keep(mine)
            time.sleep(0.05)
    if sorted(claimed.values()) != list(range(world_size)):
        raise RendezvousError(f"the {world_size} nodes that met claim trainer.node_rank {sorted(claimed.values())}; "
                              f"each of 0..{world_size - 1} must be claimed once. Fix: give every node its own "
                              f"trainer.node_rank (and the same trainer.nodes on every node)")
    return node_rank


def rendezvous_id(run_dir: Path | str, attempt: str) -> str:
    """The run id of a launch's rendezvous: derived from the run's key, so it is the same on every node of the
    run and guessed by no one else (module docstring: the seal is what protects, not the name)."""
    return derived_id(run_key(run_dir), f"rendezvous {attempt}", 12)


def _seconds(params: RendezvousParameters, key: str) -> timedelta | None:
    value = params.get_as_int(f"{key}_timeout")
    return None if value is None else timedelta(seconds=value)


def register() -> None:
    """Make ``rdzv_backend="synapse-c10d"`` known to torch's launcher (idempotent)."""
    rendezvous_handler_registry.register(BACKEND, create_handler)
