"""The channel between the decider (node 0's supervisor) and the agents of the other nodes.

It runs over the network the job already has: a ``TCPStore`` that node 0's launcher hosts at
``trainer.rdzv_endpoint`` for the whole run (the workers' c10d rendezvous of every segment uses the
same store, under a run id per segment). Every message is one typed record, JSON under its own key:

* the decider's announcement, put by node 0's launcher (``DeciderAnnouncement``): the epoch of the
  decider that speaks for the run now (``epoch.py``), and whether it runs, was lost, or is gone.
* ``NodeHello``  agent -> decider, once per epoch: who I am (node_rank, nodes, devices and what
  its host has of them: GPU count, names, memory; a fresh nonce, the epoch it attaches to and how
  many orders it has read); answered by a ``Welcome`` (ok, or the mismatch that stops both sides)
  that echoes the nonce and carries the epoch.
* ``LaunchOrder`` decider -> agent: start your workers of segment n with this config;
  ``StopOrder``: tear your segment's workers down now; ``ExitOrder``: the run is over.
* ``NodeReport`` agent -> decider: how its workers of segment n ended (finished, failed with the
  rank and cause, or an error).
* ``ProfileOrder`` decider -> agent: profile these blocks on your devices (or find them in your cache);
  answered by a ``ProfileAnswer`` with the profiles' text. A decider on a host of its own
  (``trainer.role=decider``) plans with profiles taken where the devices are, never on its own host.
* ``NodeInterrupt`` agent -> decider: a Ctrl-C, SIGTERM or hangup reached this node's launcher; the
  decider stops the run as if it had reached its own (after the step in flight, with a checkpoint).
* beats: each agent puts its beat count every ``BEAT_S``; the decider judges liveness by its own
  clock (no clock is compared across machines) and counts only a count that grew.

Every order, report, beat and exit acknowledgement carries the epoch of the decider it belongs to.
A decider that died is restarted under the next epoch; the agents re-attach to it (a hello of the
new epoch, with the number of orders they have read, so its orders continue that numbering) and
refuse, and say, any order of an older epoch: a decider that was replaced cannot steer the run.

Anyone who reaches the store can write under these keys (torch's stores have no authentication).
Every record is sealed with the run's key (``synapse.rundir.run_key``), under the meeting's scope
or the decider's instance: a value someone else wrote, or one replayed from another run, is
refused, said once and read as absent; it never raises in the decider's watch thread or an
agent's beat thread. No key is incremented with the store's ``add`` (an ``add`` on a value that is
no number makes the store drop the connection that asked); the writers put a record back when
someone overwrote it (orders until the agent reports, the report until the next order).

Reads never block: a key is read with a compare-and-set that leaves it as it is, so every wait has
its own timeout.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from synapse.config import ConfigError
from synapse.launch import RendezvousSetupError, rendezvous_bind_address, store_on
from synapse.rundir import Refusals, SealedStore, derived_id, run_key

PREFIX = "synapse/nodes"
BEAT_S = 0.5
POLL_S = 0.05
MEETING = "nodes meeting"  # the scope of the records before the decider's instance is known
# The scope of every record after the meeting. One for the whole run: the epoch inside each record,
# not a scope per decider, is what tells an older decider's order from the current one's, so an
# older order opens, is refused for its epoch and is said as such.
RUN_SCOPE = "nodes"
DECIDER_SCOPE = "decider announcement"
DECIDER_KEY = f"{PREFIX}/decider"
# Not sealed: a name derived from node 0's run key (it reveals nothing of the key). An agent whose
# own key gives another name holds another run directory: it explains a meeting that never
# happens; a forged value changes only the words of that error, never whether a node joins.
KEY_ID = f"{PREFIX}/run_key_id"


class NodeChannelError(RuntimeError):
    """The channel cannot be used; the message names the fix."""


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
    nonce: str = ""  # fresh per hello: the welcome that echoes it answers this hello, no earlier one
    epoch: int = 0  # the decider epoch this hello attaches to (an older decider's meeting ignores it)
    orders_seen: int = 0  # orders read so far: a restarted decider numbers its orders on from here
    # the segment whose workers this node still runs (or whose report it holds) when it re-attaches to a
    # restarted decider, which then adopts them instead of relaunching; -1: none
    running_segment: int = -1
    # fresh each time the agent (re)joins: a node declared lost comes back as a new incarnation, a spare
    incarnation: str = ""
    # what this node's host has (synapse.config.NodeDevices' fields): its GPU count, each device's name and
    # memory. A decider on a host of its own checks the node's devices and plans with them, never with its own
    host_devices: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Welcome:
    error: str | None = None  # None: accepted
    hello_nonce: str = ""  # the nonce of the hello it answers
    instance: str = ""  # the decider's: the scope of every record after the meeting
    epoch: int = 0  # the epoch of the decider that welcomes


@dataclass(frozen=True)
class LaunchOrder:
    segment: int
    cfg_yaml: str  # this node's config of the segment (its devices, its node_rank in the segment)
    partition: dict[str, Any]  # the segment's placement (Placement.to_dict)
    microbatches: int  # per step: the run's plan
    resume: str | None
    teacher_weights: str
    store_hosted: bool  # the segment's rendezvous uses the decider's store
    # failover.replica_engine=torchft: the segment's lighthouse and meeting, and this node's replicas
    # (pipeline.ReplicaMeeting's fields); None: the segment's ranks are one launch
    replica_meeting: dict[str, Any] | None = None
    kind: str = "launch"
    epoch: int = 0  # set by the channel: the epoch of the decider that ordered it


@dataclass(frozen=True)
class StopOrder:
    segment: int
    reason: str
    kind: str = "stop"
    epoch: int = 0
    lost: bool = False  # the node was declared lost: stop, then rejoin as a new incarnation (a spare)


@dataclass(frozen=True)
class ExitOrder:
    error: str | None = None  # None: the run finished
    kind: str = "exit"
    epoch: int = 0


@dataclass(frozen=True)
class ProfileOrder:
    requests: list[dict[str, Any]]  # ProfileRequest fields, each measured on the node's devices or found in its cache
    cache_dir: str  # the run's cache_dir, as the node resolves it
    answer: str  # the key of the answer: fresh per order
    refresh: bool = False
    kind: str = "profile"
    epoch: int = 0


@dataclass(frozen=True)
class ProfileAnswer:
    node_rank: int
    answer: str
    profiles: list[dict[str, str]] = field(default_factory=list)  # {"name": its cache file's name, "csv": its text}
    error: str = ""  # the profile could not be taken there: why
    host: str = ""
    pid: int = 0
    epoch: int = 0  # set by the channel


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
    # no device can be blamed and nothing says the code is wrong (a stall whose culprit this node could not
    # tell, a process group that did not form): the decider retries on the same devices (WorkerFailure's flag)
    retry_same_devices: bool = False
    epoch: int = 0  # set by the channel: the epoch of the decider the agent followed


@dataclass(frozen=True)
class NodeInterrupt:
    node_rank: int
    signal: str  # SIGINT | SIGTERM | SIGHUP
    epoch: int = 0  # set by the channel


@dataclass(frozen=True)
class DeciderAnnouncement:
    """Put by node 0's launcher: which decider epoch speaks for the run, and in what state."""

    epoch: int
    # starting (the decider of this epoch runs or is about to) | lost (it died; the launcher restarts it under
    # the next epoch) | gone (the run is over, or the launcher gave up restarting). Only the launcher writes it.
    state: str
    pid: int = 0


ORDERS = {"launch": LaunchOrder, "stop": StopOrder, "exit": ExitOrder, "profile": ProfileOrder}


def _typed(cls, data: Any):
    """A sealed record's dataclass (sealed records are this run's own, so a mismatch is a bug: None)."""
    try:
        return cls(**data) if isinstance(data, dict) else None
    except TypeError:
        return None


class NodeChannel:
    """One side of the channel; ``store`` is the decider's ``TCPStore`` (its server or a client)."""

    def __init__(self, store: TCPStore, endpoint: str, key: bytes, refused: Callable[[str, bytes | str, str], None]):
        self.store, self.endpoint = store, endpoint
        # one connection, used by a process's main thread and its watcher (the records' lock)
        self.records = SealedStore(store, key, refused, scope=MEETING)
        self.key_id = derived_id(key, "run key id")
        self._orders_sent: dict[int, int] = {}  # the decider's: orders sent to each node (the next one's number)
        self._beats_sent = 0  # an agent's beat thread's: its beat count
        self._last_report: str | None = None  # an agent's: the key of its last report
        self.epoch = 0  # the decider epoch this side speaks in (stamped on every order, report and beat)
        self.announcements = SealedStore(store, key, refused, scope=DECIDER_SCOPE)
        # the meeting's scope, for a node that comes back after the meeting (``hello_of``, ``welcome_back``)
        self.meetings = SealedStore(store, key, refused, scope=MEETING)

    # ------------------------------------------------------------------ opening
    @classmethod
    def host(cls, endpoint: str, timeout_s: float, run_dir: Path | str, log: Callable[[str], None] | None = None
             ) -> NodeChannel:
        """The decider's side: serve the store at ``endpoint`` (its address when it is an IP)."""
        host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
        key = run_key(run_dir)  # made before the store serves: an agent that reached the store finds it
        try:
            store = store_on(host, rendezvous_bind_address(host, single_node=False), port,
                             timedelta(seconds=timeout_s))
        except (OSError, RuntimeError) as exc:
            raise NodeSetupError(f"trainer.rdzv_endpoint={endpoint}: node 0 cannot listen there ({exc}). Fix: "
                                   f"choose a free port of this machine's address") from exc
        channel = cls(store, endpoint, key, Refusals(run_dir, source="decider", log=log))
        store.set(KEY_ID, channel.key_id)
        return channel

    @classmethod
    def connect(cls, endpoint: str, node_rank: int, timeout_s: float, run_dir: Path | str,
                log: Callable[[str], None] | None = None) -> NodeChannel:
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
        # read once the store answers: node 0 made the key (if the run had none) before it served
        return cls(store, endpoint, run_key(run_dir), Refusals(run_dir, source=f"agent of node {node_rank}", log=log))

    @classmethod
    def attach(cls, endpoint: str, timeout_s: float, run_dir: Path | str, log: Callable[[str], None] | None = None
               ) -> NodeChannel:
        """A decider's side when node 0's launcher serves the store (the decider runs in a process of its own)."""
        host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
        try:
            store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise NodeSetupError(f"the decider cannot reach the run's store at {endpoint}, which node 0's launcher "
                                 f"serves ({type(exc).__name__}: {str(exc)[:200]}). Fix: rerun with resume=auto"
                                 ) from exc
        return cls(store, endpoint, run_key(run_dir), Refusals(run_dir, source="decider", log=log))

    # ------------------------------------------------------------------ the decider's announcement
    def announce_decider(self, announcement: DeciderAnnouncement) -> None:
        self.announcements.put(DECIDER_KEY, asdict(announcement))

    def decider(self) -> DeciderAnnouncement | None:
        """The launcher's latest announcement (None: none yet, or only a value this run did not seal)."""
        return _typed(DeciderAnnouncement, self.announcements.get(DECIDER_KEY))

    def wait_decider(self, timeout_s: float, newer_than: int = -1) -> DeciderAnnouncement | None:
        """The announcement of a decider epoch above ``newer_than`` that is not lost, within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            announced = self.decider()
            if announced is not None and announced.epoch > newer_than and announced.state == "starting":
                return announced
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S * 4)

    def holds_another_run_key(self) -> bool:
        """Whether node 0 published a run key id unlike this node's (its run directory is another)."""
        try:
            deadline = time.monotonic() + 1.0  # node 0 sets it as soon as its store serves
            while not self.store.check([KEY_ID]):
                if time.monotonic() > deadline:
                    return False  # (removed by someone: no explanation, and no delay either)
                time.sleep(POLL_S)
            return self.store.get(KEY_ID).decode(errors="replace") != self.key_id
        except (RuntimeError, OSError):
            return False

    def _key(self, *parts: Any) -> str:
        return "/".join([PREFIX, *map(str, parts)])

    def _wait(self, key: str, cls, timeout_s: float | None, accept: Callable[[Any], bool] = lambda record: True):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:  # checked at least once, even with timeout_s=0
            record = _typed(cls, self.records.get(key))
            if record is not None and accept(record):
                return record
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ meeting
    def say_hello(self, hello: NodeHello, claim_nonce: str | None = None) -> None:
        """``claim_nonce``: the nonce this agent first claimed its node_rank with (a re-attaching agent's hello
        has a fresh nonce of its own, but the node_rank is still its own claim)."""
        claim_nonce = hello.nonce if claim_nonce is None else claim_nonce
        claim = self.records.claim(self._key("claims", hello.node_rank), {"nonce": claim_nonce})
        if claim is None:
            raise NodeSetupError(f"trainer.node_rank={hello.node_rank} cannot be claimed: its key on the run's store "
                                 f"holds a value this run did not write (refused, see the log above). Fix: find who "
                                 f"else reaches {self.endpoint}, or use another port in trainer.rdzv_endpoint")
        if claim.get("nonce") != claim_nonce:
            raise NodeSetupError(f"trainer.node_rank={hello.node_rank} is already taken by another node of this "
                                   f"run. Fix: number the nodes 0..trainer.nodes-1, each once")
        self.records.put(self._key("hello", hello.node_rank), asdict(hello))

    def hellos(self, max_nodes: int = 64) -> dict[int, NodeHello]:
        """Every hello so far (node ranks 0..max_nodes-1: also those beyond this run's trainer.nodes)."""
        found = {}
        for node in range(max_nodes):
            hello = _typed(NodeHello, self.records.get(self._key("hello", node)))
            if hello is not None:
                found[node] = hello
        return found

    def hello_of(self, node_rank: int) -> NodeHello | None:
        """The node's latest hello, read after the meeting (a node declared lost that comes back)."""
        return _typed(NodeHello, self.meetings.get(self._key("hello", node_rank)))

    def welcome_back(self, node_rank: int, welcome: Welcome) -> None:
        self.meetings.put(self._key("welcome", node_rank), asdict(welcome))

    def welcome(self, node_rank: int, welcome: Welcome) -> None:
        self.records.put(self._key("welcome", node_rank), asdict(welcome))

    def wait_welcome(self, node_rank: int, timeout_s: float, nonce: str = "") -> Welcome | None:
        """The welcome that answers the hello with ``nonce`` (an older one, replayed, is not waited for)."""
        return self._wait(self._key("welcome", node_rank), Welcome, timeout_s,
                          accept=lambda welcome: welcome.hello_nonce == nonce)

    def join(self, instance: str) -> None:
        """After the meeting: every record from here on is sealed for the decider's ``instance``."""
        self.records.scope = instance

    # ------------------------------------------------------------------ orders
    def order(self, node_rank: int, order: LaunchOrder | StopOrder | ExitOrder | ProfileOrder) -> None:
        seq = self._orders_sent.get(node_rank, 0)  # only the decider writes orders: its count is the truth
        self._orders_sent[node_rank] = seq + 1
        self.records.put(self._key("order", node_rank, seq), {**asdict(order), "epoch": self.epoch})

    def continue_orders(self, node_rank: int, seq: int) -> None:
        """A restarted decider's: the node has read ``seq`` orders (of earlier epochs); the next is number ``seq``."""
        self._orders_sent[node_rank] = seq

    def orders_sent(self, node_rank: int) -> int:
        return self._orders_sent.get(node_rank, 0)

    def keep_orders(self, node_rank: int, since: int) -> None:
        """Put back any order from number ``since`` on that someone overwrote before the agent read it."""
        for seq in range(since, self.orders_sent(node_rank)):
            self.records.keep(self._key("order", node_rank, seq))

    def next_order(self, node_rank: int, seq: int, timeout_s: float | None = None):
        key = self._key("order", node_rank, seq)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            data = self.records.get(key)
            kind = data.get("kind") if isinstance(data, dict) else None
            if kind in ORDERS and (order := _typed(ORDERS[kind], data)) is not None:
                return order
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ reports and beats
    def acknowledge_exit(self, node_rank: int, order_seq: int) -> None:
        """An agent's: it read the exit order numbered ``order_seq`` and is leaving."""
        self.records.put(self._key("exit_ack", node_rank), {"order": order_seq, "epoch": self.epoch})

    def await_exit_acks(self, orders: Mapping[int, int], timeout_s: float) -> list[int]:
        """The decider's, after its exit orders (``orders``: node -> that order's number): wait until
        each node acknowledged its order, putting back any order someone overwrote meanwhile; the
        nodes that did not within ``timeout_s``, in order. The store's server is this process: it
        must not leave before the agents have read their orders."""
        deadline = time.monotonic() + timeout_s
        waiting = dict(orders)
        while waiting:
            for node, seq in list(waiting.items()):
                ack = self.records.get(self._key("exit_ack", node))
                if isinstance(ack, dict) and ack.get("order") == seq and ack.get("epoch", 0) == self.epoch:
                    del waiting[node]
                else:
                    self.keep_orders(node, seq)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        return sorted(waiting)

    def report(self, report: NodeReport) -> None:
        self._last_report = self._key("report", report.segment, report.node_rank)
        self.records.put(self._last_report, {**asdict(report), "epoch": self.epoch})

    def keep_report(self) -> None:
        """Put this agent's last report back if someone overwrote it before the decider read it."""
        if self._last_report is not None:
            self.records.keep(self._last_report)

    def report_of(self, segment: int, node_rank: int) -> NodeReport | None:
        return _typed(NodeReport, self.records.get(self._key("report", segment, node_rank)))

    def answer_profile(self, answer: ProfileAnswer) -> None:
        self.records.put(self._key("profile", answer.answer), {**asdict(answer), "epoch": self.epoch})

    def profile_answer(self, answer: str) -> ProfileAnswer | None:
        return _typed(ProfileAnswer, self.records.get(self._key("profile", answer)))

    def interrupted(self, interrupt: NodeInterrupt) -> None:
        self.records.put(self._key("interrupt", interrupt.node_rank), {**asdict(interrupt), "epoch": self.epoch})

    def interrupt_of(self, node_rank: int) -> NodeInterrupt | None:
        """The node's interrupt said to this decider (None: none, of another epoch, or one this run did not seal)."""
        interrupt = _typed(NodeInterrupt, self.records.get(self._key("interrupt", node_rank)))
        return interrupt if interrupt is not None and interrupt.epoch == self.epoch else None

    def beat(self, node_rank: int) -> int:
        self._beats_sent += 1
        self.records.put(self._key("beat", node_rank), {"beats": self._beats_sent, "epoch": self.epoch})
        return self._beats_sent

    def beats(self, node_rank: int) -> int:
        """The node's beat count so far (0: none yet, or none this run sealed)."""
        data = self.records.get(self._key("beat", node_rank))
        if isinstance(data, dict) and data.get("epoch", 0) != self.epoch:
            return 0  # a beat of another decider's epoch: the node has not attached to this one (yet)
        count = data.get("beats") if isinstance(data, dict) else None
        return count if isinstance(count, int) else 0
