"""The channel between the decider (node 0's supervisor) and the agents of the other nodes.

It runs over the network the job already has: a ``TCPStore`` that the decider hosts at
``trainer.rdzv_endpoint`` for the whole run (the workers' c10d rendezvous of every segment uses the
same store, under a run id per segment). Every message is one typed record, JSON under its own key:

* ``NodeHello``  agent -> decider, once: who I am (node_rank, nodes, devices); answered by a
  ``Welcome`` (ok, or the mismatch that stops both sides).
* ``LaunchOrder`` decider -> agent: start your workers of segment n with this config;
  ``StopOrder``: tear your segment's workers down now; ``ExitOrder``: the run is over.
* ``NodeReport`` agent -> decider: how its workers of segment n ended (finished, failed with the
  rank and cause, or an error).
* beats: each agent adds 1 to its counter every ``BEAT_S``; the decider judges liveness by its
  own clock (no clock is compared across machines).

Reads never block: a key is checked before it is read, so every wait has its own timeout.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from synapse.config import ConfigError
from synapse.launch import RendezvousSetupError, rendezvous_bind_address, store_on

PREFIX = "synapse/nodes"
BEAT_S = 0.5
POLL_S = 0.05


class NodeChannelError(RuntimeError):
    """The channel cannot be used (a record Synapse did not write); the message names the fix."""


class NodeSetupError(RendezvousSetupError, ConfigError):
    """The nodes cannot meet: node 0 unreachable or not listening, a mismatched trainer.nodes or
    trainer.devices, a node_rank taken twice. Named with the fix, before any worker starts."""


@dataclass(frozen=True)
class NodeHello:
    node_rank: int
    nodes: int
    devices: list[int]
    host: str
    pid: int


@dataclass(frozen=True)
class Welcome:
    error: str | None = None  # None: accepted


@dataclass(frozen=True)
class LaunchOrder:
    segment: int
    cfg_yaml: str  # this node's config of the segment (its devices, its node_rank in the segment)
    partition: dict[str, Any]  # the segment's placement (Placement.to_dict)
    microbatches: int  # per step: the run's plan
    resume: str | None
    teacher_weights: str
    store_hosted: bool  # the segment's rendezvous uses the decider's store
    kind: str = "launch"


@dataclass(frozen=True)
class StopOrder:
    segment: int
    reason: str
    kind: str = "stop"


@dataclass(frozen=True)
class ExitOrder:
    error: str | None = None  # None: the run finished
    kind: str = "exit"


@dataclass(frozen=True)
class NodeReport:
    node_rank: int
    segment: int
    outcome: str  # finished | failed (a worker failed) | error (the launch itself failed)
    summary: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None  # the failed rank (run-wide), when known
    cause: str = ""
    message: str = ""
    device_failure: bool = False


ORDERS = {"launch": LaunchOrder, "stop": StopOrder, "exit": ExitOrder}


def _encode(record: Any) -> str:
    return json.dumps(asdict(record), default=str)


def _decode(cls, text: bytes | str):
    try:
        data = json.loads(text)
        return cls(**data)
    except (TypeError, ValueError) as exc:
        raise NodeChannelError(f"a {cls.__name__} record that Synapse did not write ({exc}): {text[:200]!r}. "
                               f"Fix: give every run its own trainer.rdzv_endpoint port") from None


class NodeChannel:
    """One side of the channel; ``store`` is the decider's ``TCPStore`` (its server or a client)."""

    def __init__(self, store: TCPStore, endpoint: str):
        self.store, self.endpoint = store, endpoint
        self._lock = threading.Lock()  # one connection, used by a process's main thread and its watcher

    # ------------------------------------------------------------------ opening
    @classmethod
    def host(cls, endpoint: str, timeout_s: float) -> NodeChannel:
        """The decider's side: serve the store at ``endpoint`` (its address when it is an IP)."""
        host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
        try:
            store = store_on(host, rendezvous_bind_address(host, single_node=False), port,
                             timedelta(seconds=timeout_s))
        except (OSError, RuntimeError) as exc:
            raise NodeSetupError(f"trainer.rdzv_endpoint={endpoint}: node 0 cannot listen there ({exc}). Fix: "
                                   f"choose a free port of this machine's address") from exc
        return cls(store, endpoint)

    @classmethod
    def connect(cls, endpoint: str, node_rank: int, timeout_s: float) -> NodeChannel:
        """An agent's side: reach the decider's store within ``timeout_s`` or say why not."""
        host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
        try:
            store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise NodeSetupError(
                f"the rendezvous at {endpoint} failed for node_rank {node_rank}: node 0 could not be reached within "
                f"trainer.rdzv_timeout_s={timeout_s:g} s ({type(exc).__name__}: {str(exc)[:200]}). Fix: start "
                f"node_rank 0 first (it serves the run's store), use the same trainer.rdzv_endpoint on every node, "
                f"check that {endpoint} is reachable from this machine, or raise trainer.rdzv_timeout_s") from exc
        return cls(store, endpoint)

    def _key(self, *parts: Any) -> str:
        return "/".join([PREFIX, *map(str, parts)])

    def _get(self, key: str) -> bytes | None:
        with self._lock:
            return self.store.get(key) if self.store.check([key]) else None

    def _set(self, key: str, value: str) -> None:
        with self._lock:
            self.store.set(key, value)
            self.store.check([key])  # a set is not answered; a round trip makes it visible to every client

    def _add(self, key: str, amount: int) -> int:
        with self._lock:
            return self.store.add(key, amount)

    def _wait(self, key: str, timeout_s: float | None, alive: Callable[[], bool] = lambda: True) -> bytes | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:  # checked at least once, even with timeout_s=0
            value = self._get(key)
            if value is not None or not alive() or (deadline is not None and time.monotonic() >= deadline):
                return value
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ meeting
    def say_hello(self, hello: NodeHello) -> None:
        claims = self._add(self._key("claims", hello.node_rank), 1)
        if claims > 1:
            raise NodeSetupError(f"trainer.node_rank={hello.node_rank} is already taken by another node of this "
                                   f"run. Fix: number the nodes 0..trainer.nodes-1, each once")
        self._set(self._key("hello", hello.node_rank), _encode(hello))

    def hellos(self, max_nodes: int = 64) -> dict[int, NodeHello]:
        """Every hello so far (node ranks 1..max_nodes-1: also those beyond this run's trainer.nodes)."""
        found = {}
        for node in range(1, max_nodes):
            text = self._get(self._key("hello", node))
            if text is not None:
                found[node] = _decode(NodeHello, text)
        return found

    def welcome(self, node_rank: int, welcome: Welcome) -> None:
        self._set(self._key("welcome", node_rank), _encode(welcome))

    def wait_welcome(self, node_rank: int, timeout_s: float) -> Welcome | None:
        text = self._wait(self._key("welcome", node_rank), timeout_s)
        return None if text is None else _decode(Welcome, text)

    # ------------------------------------------------------------------ orders
    def order(self, node_rank: int, order: LaunchOrder | StopOrder | ExitOrder) -> None:
        seq = self._add(self._key("orders", node_rank), 1) - 1
        self._set(self._key("order", node_rank, seq), _encode(order))

    def next_order(self, node_rank: int, seq: int, timeout_s: float | None = None):
        text = self._wait(self._key("order", node_rank, seq), timeout_s)
        if text is None:
            return None
        kind = json.loads(text).get("kind")
        if kind not in ORDERS:
            raise NodeChannelError(f"order {seq} to node {node_rank} has unknown kind {kind!r}")
        return _decode(ORDERS[kind], text)

    # ------------------------------------------------------------------ reports and beats
    def report(self, report: NodeReport) -> None:
        self._set(self._key("report", report.segment, report.node_rank), _encode(report))

    def report_of(self, segment: int, node_rank: int) -> NodeReport | None:
        text = self._get(self._key("report", segment, node_rank))
        return None if text is None else _decode(NodeReport, text)

    def beat(self, node_rank: int) -> int:
        return self._add(self._key("beat", node_rank), 1)

    def beats(self, node_rank: int) -> int:
        return self._add(self._key("beat", node_rank), 0)
