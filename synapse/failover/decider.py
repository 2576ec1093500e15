"""The decider's side of a run across nodes: meet the agents, launch each segment on every node
that holds some of its devices, watch the agents, and turn what each node saw into one failure.

The decider is the run's supervisor, in a process of its own beside the store (``keeper.py``): it
owns the controller, the segment history and the composed segment configs, exactly as on one node,
and no worker: every node, node 0 included, runs an agent that starts and tears down its own workers
on order. Its ``launch`` is a ``NodeDecider`` instead of ``launch_pipeline``, so it can run on a
host with no device at all, and its death costs no worker: the next decider adopts the segment the
agents still run (``adoptable``). A segment's placement lists run-wide device ids (``partitioning/topology.py``);
each node gets the segment config with its own local devices and its place among the segment's
nodes, and starts its workers with the same elastic launcher. Node 0's launcher hosts the run's
store (``node_channel.py``): every segment's workers rendezvous there under a run id of their own.

How a segment across nodes ends:
* every node's workers finished (or stopped on a request): the last rank's summary.
* a worker failed: each node reports what its own elastic agent and health monitor saw; the
  failure a node reports about one of its *own* ranks is the root cause (the others only lost a
  peer). The decider tears down the rest at once, so no node waits for a collective timeout.
* a node's agent stopped beating for ``failover.node_timeout_s`` (node 0's as any other): the node is
  lost, and every rank it ran is dropped with it (``WorkerFailure.lost_ranks``: DEGRADE of all its
  devices).
"""
from __future__ import annotations

import contextlib
import dataclasses
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from synapse.config import (
    FailoverConfig,
    NodeDevices,
    SynapseConfig,
    TrainerConfig,
    config_yaml,
    decides_elsewhere,
    resolve_accelerator,
    run_topology,
    with_settings,
)
from synapse.failover.epoch import admit_workers, close_commits
from synapse.failover.node_channel import (
    BEAT_S,
    POLL_S,
    RUN_SCOPE,
    ExitOrder,
    LaunchOrder,
    NodeChannel,
    NodeInterrupt,
    NodeReport,
    NodeSetupError,
    ProfileOrder,
    StopOrder,
    Welcome,
)
from synapse.launch import (
    REPLICAS_LOST,
    WorkerFailure,
    carried_by_torchft,
    relay,
    replicas_by_node,
    serve_replica_meeting,
)
from synapse.partitioning import NodeTopology
from synapse.pipeline import LaunchTask, ReplicaMeeting
from synapse.profiling import PROFILES_SUBDIR, ProfileRequest
from synapse.rundir import (
    NODE_SUPERVISOR_LOCK,
    SUPERVISOR_LOCK,
    EventLog,
    derived_id,
    events_path,
    read_events,
    run_key,
)


def segment_node_settings(topology: NodeTopology, devices: Sequence[int], endpoint: str | None,
                        node: int | None = None) -> dict[str, Any]:
    """What makes a segment's config one node's: its local devices, its spares the segment leaves idle (a
    spare a REPLACE swapped in is no longer spare; the device it replaced is bad, not spare) and its place
    among the segment's nodes (default: the first node of the segment, whose config the supervisor saves)."""
    if topology.nodes == 1:
        return {"trainer.devices": list(devices),
                "trainer.spare_devices": [d for d in topology.local_spares if d not in devices]}
    nodes = topology.nodes_of(devices)
    node = nodes[0] if node is None else node
    idle_spares = [topology.local_id(d) for d in topology.spares_on(node) if d not in devices]
    # a segment's config is its workers': they take no launcher's role (trainer.role=decider names the
    # decider's host, and is refused for a one-node config)
    if len(nodes) == 1:  # the segment runs on one node: a one-node launch there (its own loopback rendezvous)
        return {"trainer.devices": topology.local_devices_of(node, devices), "trainer.node_devices": None,
                "trainer.spare_devices": idle_spares, "trainer.nodes": 1, "trainer.node_rank": 0,
                "trainer.rdzv_endpoint": None, "trainer.role": "auto"}
    return {"trainer.node_devices": [topology.local_devices_of(n, devices) for n in nodes], "trainer.nodes": len(nodes),
            "trainer.spare_devices": idle_spares, "trainer.node_rank": nodes.index(node),
            "trainer.rdzv_endpoint": endpoint, "trainer.role": "auto"}


class NodeDecider:
    """The decider's view of the nodes; called like ``launch_pipeline`` to run one segment on all of them
    (with the segment's whole config, of which each node gets its own copy: ``node_config``)."""

    def __init__(self, trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path,
                 log: Callable[[str], None] = print, channel: NodeChannel | None = None, epoch: int = 0,
                 lost: set[int] | None = None):
        """``channel``: the run's store served by node 0's launcher (None: this process serves it);
        ``epoch``: this decider's (``epoch.py``); ``lost``: the nodes an earlier decider of the run
        declared lost (they stay out: a restarted decider does not wait for them)."""
        self.topology, self.run_dir, self.log = run_topology(trainer), Path(run_dir), log
        self.run_trainer = trainer  # where the run's store is: a torchft segment's lighthouse listens there too
        self.endpoint, self.timeout_s = str(trainer.rdzv_endpoint), float(trainer.rdzv_timeout_s)
        self.node_timeout_s = float(failover.node_timeout_s)
        # a restarted decider waits for the agents to notice and re-attach, as long as they wait for it
        self.meeting_s = self.timeout_s if epoch <= 1 else max(self.timeout_s, float(failover.decider_grace_s))
        # derived from the run's key (launch/rendezvous.py: not guessable; the seal is what protects)
        self.rdzv_base = trainer.rdzv_id or derived_id(run_key(self.run_dir), "segments", 12)
        self.channel = channel or NodeChannel.host(self.endpoint, self.timeout_s, self.run_dir, log)
        self.epoch = self.channel.epoch = epoch
        self.lost: set[int] = set(lost or ())
        self.joined: set[int] = set()  # the nodes welcomed into the run (set once the meeting succeeded)
        # A restarted decider's: node -> the segment whose workers it still runs (said in its hello). When every
        # node of the run's last segment still runs it, this decider adopts it rather than relaunch it
        self.adoptable: dict[int, int] = {}
        self.incarnations: dict[int, str] = {}  # node -> the incarnation welcomed last
        self.interrupts_seen: dict[int, int] = {}  # node -> the epoch of the interrupt it said, once acted on
        self.local_devices: list[int] = []  # trainer.devices of every node (set by the meeting)
        # trainer.role=decider: this host has none of the run's devices; each node's agent says what its host
        # has (in its hello), which is checked against the config and is what the planner knows of the devices
        self.elsewhere, self.accelerator = decides_elsewhere(trainer), resolve_accelerator(trainer)
        self.host_devices: dict[int, NodeDevices] = {}
        # told the devices of a node that came back after it was declared lost: spares for the controller
        self.on_spares: Callable[[list[int]], None] | None = None
        self.events = EventLog(events_path(self.run_dir), source="decider")

    # ------------------------------------------------------------------ meeting the agents
    def meet_agents(self, local_devices: Sequence[int]) -> None:
        """Wait (``trainer.rdzv_timeout_s``) for every node's hello; refuse a mismatch on both sides."""
        self.local_devices = list(local_devices)
        expected = set(range(self.topology.nodes)) - self.lost
        deadline = time.monotonic() + self.meeting_s
        while True:
            # only hellos to this epoch: an agent still attached to an earlier decider has not re-attached yet
            hellos = {n: h for n, h in self.channel.hellos().items() if h.epoch == self.epoch}
            problems = {n: self._mismatch(h, local_devices) for n, h in hellos.items()}
            problems = {n: p for n, p in problems.items() if p}
            if problems or expected <= set(hellos) or time.monotonic() > deadline:
                break
            time.sleep(POLL_S * 4)
        for node, hello in hellos.items():
            if (facts := NodeDevices.of(hello.host_devices)) is not None:
                self.host_devices[node] = facts
            self.channel.continue_orders(node, hello.orders_seen)
            if hello.running_segment >= 0:
                self.adoptable[node] = hello.running_segment
            self.incarnations[node] = hello.incarnation
            self.channel.welcome(node, Welcome(problems.get(node), hello_nonce=hello.nonce, instance=RUN_SCOPE,
                                               epoch=self.epoch))
        self.channel.join(RUN_SCOPE)
        if problems:
            raise NodeSetupError("; ".join(f"node_rank {n}: {p}" for n, p in sorted(problems.items())))
        missing = sorted(expected - set(hellos))
        if missing:
            # A node that started but writes elsewhere left no lock here (and its hello, sealed with
            # another run key, was refused above)
            elsewhere = [n for n in missing if not (NODE_SUPERVISOR_LOCK.path(self.run_dir, node=n) if n else
                                                    SUPERVISOR_LOCK.path(self.run_dir)).exists()]
            hint = (f" Node(s) {elsewhere} left nothing in this run directory ({self.run_dir}): if they were "
                    f"started, their hydra.run.dir is another directory; it must be on a filesystem every node "
                    f"sees, at the same path on every node." if elsewhere else "")
            raise NodeSetupError(f"the rendezvous at {self.endpoint} timed out after {self.meeting_s:g} s "
                                 f"(trainer.rdzv_timeout_s, failover.decider_grace_s for a restarted decider): "
                                 f"trainer.nodes={self.topology.nodes} nodes were expected and node(s) {missing} "
                                 f"did not join.{hint} Fix: start python "
                                 f"train.py on every node with the same trainer.rdzv_endpoint and trainer.nodes "
                                 f"(node_rank 0..{self.topology.nodes - 1}) and run directory, within the timeout, "
                                 f"or raise trainer.rdzv_timeout_s")
        self.log(f"decider: nodes {sorted(hellos)} joined ({', '.join(h.host for h in hellos.values())})"
                 f"{f' under epoch {self.epoch}' if self.epoch else ''}")
        for node, facts in sorted(self.host_devices.items()) if self.elsewhere else ():
            self.log(f"decider: node {node}'s agent says its host has {facts.describe()}")
        self.joined = set(hellos)

    def take_back(self, node: int) -> bool:
        """A node declared lost that said hello again as a new incarnation under this epoch (it was stalled,
        not dead, and stopped on the lost node's stop order): welcome it back as a spare. Whether it was."""
        hello = self.channel.hello_of(node)
        if hello is None or hello.epoch != self.epoch or not hello.incarnation \
                or hello.incarnation == self.incarnations.get(node):
            return False
        problem = self._mismatch(hello, self.local_devices)
        if not problem and (facts := NodeDevices.of(hello.host_devices)) is not None:
            self.host_devices[node] = facts
        self.channel.continue_orders(node, hello.orders_seen)
        self.channel.welcome_back(node, Welcome(problem, hello_nonce=hello.nonce, instance=RUN_SCOPE, epoch=self.epoch))
        self.incarnations[node] = hello.incarnation
        if problem:
            return False
        spares = [*self.topology.devices_on(node), *self.topology.spares_on(node)]  # its configured spares too
        self.lost.discard(node)
        self.joined.add(node)
        self.events.append("node_rejoined", node=node, incarnation=hello.incarnation, spares=spares, epoch=self.epoch)
        self.log(f"decider: node {node} is back (incarnation {hello.incarnation}); its devices {spares} are spares")
        if self.on_spares is not None:
            self.on_spares(spares)
        return True

    def _mismatch(self, hello, local_devices: Sequence[int]) -> str | None:
        if hello.nodes != self.topology.nodes:
            return (f"it has trainer.nodes={hello.nodes}, the decider has trainer.nodes={self.topology.nodes}. "
                    f"Fix: the same trainer.nodes on every node")
        if list(hello.devices) != list(local_devices):
            return (f"it has trainer.devices={hello.devices}, the decider has {list(local_devices)}. Fix: the same "
                    f"trainer.devices on every node")
        told = NodeDevices.of(hello.host_devices)
        if told is not None and list(told.spares) != list(self.topology.local_spares):
            return (f"it has trainer.spare_devices={list(told.spares)}, the decider has "
                    f"{list(self.topology.local_spares)}. Fix: the same trainer.spare_devices on every node (each "
                    f"node's local ids)")
        if self.elsewhere:  # this host has none of the run's devices: the node's own facts decide
            facts = NodeDevices.of(hello.host_devices)
            if facts is None:
                return ("its agent said nothing of its host's devices, which a decider on a host of its own "
                        "(trainer.role=decider) plans with. Fix: the same Synapse version on every node and on the "
                        "decider's host")
            return facts.unfit(self.accelerator)
        return None

    def device_memory(self, device: int) -> float:
        """The memory of run-wide device ``device`` as its node's agent said it (``NodeDevices``): what a decider
        on a host of its own plans with (``planning.device_facts``), never its own host's."""
        node = self.topology.node_of(device)
        facts = self.host_devices.get(node)
        if facts is None:
            raise NodeSetupError(f"node {node}'s agent said nothing of its devices, and device {device} is one of "
                                 f"them. Fix: the same Synapse version on every node and the decider")
        return facts.memory_of(self.topology.local_id(device))

    def interrupted(self, interrupt: NodeInterrupt) -> None:
        """A node's launcher got a Ctrl-C, SIGTERM or hangup: the decider stops the run as for an interrupt of its
        own (its supervisor's handler, in this process's main thread: after the step in flight, with a
        checkpoint), told as the node's (``relay``), which never counts toward the abort of a second interrupt:
        a ``scancel`` signals every node, each reporting it, and the decider's own host, and must still stop
        with the checkpoint (passed on as the node's own signal, the second node's report aborted the run).
        Each node's interrupt is acted on once."""
        if self.interrupts_seen.get(interrupt.node_rank) == interrupt.epoch:
            return
        self.interrupts_seen[interrupt.node_rank] = interrupt.epoch
        self.log(f"decider: node {interrupt.node_rank} got {interrupt.signal}: stopping the run as for this host's own")
        self.events.append("interrupt_from_node", node=interrupt.node_rank, signal=interrupt.signal, epoch=self.epoch)
        relay(f"{interrupt.signal} on node {interrupt.node_rank}")

    # ------------------------------------------------------------------ profiles, taken where the devices are
    def take_profile(self, request: ProfileRequest, cache_dir: str, refresh: bool) -> tuple[str, str]:
        """A profile measured (or found in its cache) by the first node that answers, node 0's agent unless it
        went silent: the name of its cache file there and its CSV text (``profiling.profiles_taken_by``).
        A decider on a host of its own has none of the run's devices, or other ones. A profile this run was
        handed before (its event, and the file in this host's cache) is not asked for again: a restarted
        decider plans while the agents' workers still run the segment it adopts, and their main threads read
        no order until it ends."""
        fields = asdict(request)
        if not refresh:
            for earlier in reversed(read_events(events_path(self.run_dir), "profile_taken")):
                kept = Path(cache_dir) / PROFILES_SUBDIR / Path(str(earlier.get("name", ""))).name
                if earlier.get("request") == fields and kept.is_file():
                    return kept.name, kept.read_text()
        for node in sorted(self.joined - self.lost):
            answer_key = secrets.token_hex(8)
            self.channel.order(node, ProfileOrder([fields], cache_dir, answer_key, refresh))
            beats, since = self.channel.beats(node), time.monotonic()
            while (answer := self.channel.profile_answer(answer_key)) is None or answer.epoch != self.epoch:
                now, current = time.monotonic(), self.channel.beats(node)
                if current > beats:
                    beats, since = current, now
                elif now - since > self.node_timeout_s:
                    break
                time.sleep(POLL_S * 4)
            if answer is None or answer.epoch != self.epoch:
                self.log(f"decider: node {node} went silent while profiling {request.model_name} ({request.role}); "
                         f"asking the next node")
                continue
            if answer.error or len(answer.profiles) != 1:
                raise RuntimeError(f"node {node} could not profile {request.model_name} ({request.role}) at "
                                   f"micro-batch {request.micro_batch} on {request.device}: "
                                   f"{answer.error or 'no profile in its answer'}")
            profile = answer.profiles[0]
            self.log(f"decider: {request.model_name} ({request.role}, micro-batch {request.micro_batch}) profiled by "
                     f"node {node}'s agent ({answer.host}, pid {answer.pid}) on {request.device}: {profile['name']}")
            self.events.append("profile_taken", node=node, host=answer.host, pid=answer.pid,
                               model=request.model_name, role=request.role, micro_batch=request.micro_batch,
                               device=request.device, name=profile["name"], epoch=self.epoch, request=fields)
            return profile["name"], profile["csv"]
        raise NodeSetupError(f"no node could profile {request.model_name} ({request.role}): every node went silent "
                             f"for failover.node_timeout_s={self.node_timeout_s:g} s. Fix: check the nodes' logs and "
                             f"rerun with resume=auto")

    def close(self, error: BaseException | None = None) -> None:
        """The run is over: tell every agent still there, so it exits (with the error, if any)."""
        message = None if error is None else f"{type(error).__name__}: {error}"[:2000]
        exits = {node: self.channel.orders_sent(node) for node in range(self.topology.nodes)
                 if node not in self.lost}
        for node in exits:
            self.channel.order(node, ExitOrder(message))
        for node in sorted(self.lost):  # best effort: a lost node that still waits to come back leaves too
            with contextlib.suppress(RuntimeError, OSError):
                self.channel.order(node, ExitOrder(message))
        # This process serves the store: it stays until every agent that joined acknowledged (a live
        # agent reads its orders every BEAT_S), or a node timeout has passed for the silent ones. A
        # meeting that failed has no agent serving: nothing to wait for.
        with contextlib.suppress(RuntimeError, OSError):
            silent = self.channel.await_exit_acks({n: seq for n, seq in exits.items() if n in self.joined},
                                                  max(4 * BEAT_S, self.node_timeout_s))
            if silent:
                self.log(f"decider: node(s) {silent} did not acknowledge the end of the run; leaving anyway")

    # ------------------------------------------------------------------ one segment on all its nodes
    def __call__(self, task: LaunchTask, run_dir: Path, attempt: str = "0", log: Callable[[str], None] = print
                 ) -> dict[str, Any]:
        devices, segment = list(task.placement.devices), task.segment
        self.topology.check_node_ordered(devices)
        nodes = self.topology.nodes_of(devices)
        first_orders = {n: self.channel.orders_sent(n) for n in nodes}
        if nodes and all(self.adoptable.get(n) == segment for n in nodes):
            # A restarted decider: the agents' workers of this segment train on; watch them to their end
            self.log(f"decider: epoch {self.epoch}: adopting segment {segment}, still running on nodes {nodes}")
            self.events.append("segment_adopted", segment=segment, nodes=nodes, epoch=self.epoch)
            return self._watch(devices, nodes, segment, first_orders)
        self._stop_unadopted()
        # from here on only this launch's workers commit: not an earlier decider's, nor a lost node's
        admit_workers(self.run_dir, self.epoch, self.launch_id(segment))
        if not carried_by_torchft(task):
            self._order_launch(task, devices, nodes, {})
            return self._watch(devices, nodes, segment, first_orders)
        # torchft: the segment's lighthouse lives in this process (the rendezvous host) while it runs, and each
        # node launches the replicas whose devices it holds
        replicas = replicas_by_node(self.topology, task.placement)
        with serve_replica_meeting(self.run_trainer, task.config.failover.replica_heartbeat_timeout_s, self.run_dir,
                                   self.launch_id(segment)) as meeting:
            self._order_launch(task, devices, nodes, {n: dataclasses.replace(meeting, replicas=tuple(replicas[n]))
                                                      for n in nodes})
            return self._watch(devices, nodes, segment, first_orders)

    def _order_launch(self, task: LaunchTask, devices: list[int], nodes: list[int],
                      meetings: dict[int, ReplicaMeeting]) -> None:
        multi = len(nodes) > 1
        for node in nodes:
            config = self.node_config(task.config, devices, node, task.segment)
            meeting = meetings.get(node)
            self.channel.order(node, LaunchOrder(task.segment, config_yaml(config), task.placement.to_dict(),
                                                 task.microbatches, task.resume, task.teacher_weights,
                                                 store_hosted=multi,
                                                 replica_meeting=None if meeting is None else asdict(meeting)))

    def _watch(self, devices: list[int], nodes: list[int], segment: int, first_orders: dict[int, int]
               ) -> dict[str, Any]:
        self.adoptable.clear()
        watch = RemoteNodesWatch(self, segment, nodes, time.time(), first_orders)
        watch.start()
        try:
            watch.wait_done()
        finally:
            watch.stop()
        return self._outcome(devices, nodes, watch)

    def adopts(self, segment: int, devices: Sequence[int]) -> bool:
        """Whether every node of segment number ``segment`` (on ``devices``) still runs it (said when it
        re-attached to this decider)."""
        nodes = self.topology.nodes_of(list(devices))
        return bool(nodes) and all(self.adoptable.get(n) == segment for n in nodes)

    def _stop_unadopted(self) -> None:
        """Workers an earlier decider started that this one does not adopt (some node of their segment no
        longer runs it): told to stop before anything new starts; their commits are refused from now on."""
        for node, segment in sorted(self.adoptable.items()):
            self.log(f"decider: epoch {self.epoch}: node {node} still runs segment {segment}, which not every node of "
                     f"it runs any more; stopping it")
            self.channel.order(node, StopOrder(segment, "a restarted decider relaunches from the newest checkpoint"))

    def node_config(self, segment_cfg: SynapseConfig, devices: Sequence[int], node: int, segment: int
                    ) -> SynapseConfig:
        return with_settings(segment_cfg, {**segment_node_settings(self.topology, devices, self.endpoint, node),
                                           # one rendezvous per segment, every node: the launch's id
                                           "trainer.rdzv_id": self.launch_id(segment),
                                           # its checkpoint commits carry it, refused once a newer decider exists
                                           "trainer.decider_epoch": self.epoch})

    def launch_id(self, segment: int) -> str:
        """Segment ``segment``'s launch: its rendezvous run id, which torch gives each of its workers (the commit
        fence names the launch whose workers may commit, ``epoch.py``)."""
        return f"{self.rdzv_base}-segment{segment}"

    def _outcome(self, devices: list[int], nodes: list[int], watch: RemoteNodesWatch) -> dict[str, Any]:
        ranks_of = {n: [r for r, d in enumerate(devices) if self.topology.node_of(d) == n] for n in nodes}
        if watch.lost:
            node = min(watch.lost)
            ranks = ranks_of[node]
            raise WorkerFailure(f"node {node} was lost: its agent did not beat for failover.node_timeout_s="
                                f"{self.node_timeout_s:g} s; its ranks {ranks} (devices "
                                f"{[devices[r] for r in ranks]}) leave the run", ranks[0], "node_lost",
                                device_failure=True, lost_ranks=tuple(ranks))
        reports = dict(watch.reports)
        failures = [(n, r) for n, r in sorted(reports.items()) if r.outcome in ("failed", "error")]
        if all(r.cause == REPLICAS_LOST for _, r in failures) and any(r.outcome == "finished"
                                                                      for r in reports.values()):
            failures = []  # torchft: some node's replicas trained to the end, carrying the lost ones' share
        if not failures:
            return next((r.summary for r in reports.values() if r.summary), {})
        # The root cause: a device failure a node saw on one of its own ranks, then any device failure; of the
        # rest, a failure that blames something (an error in the code ends the run) before one that blames
        # nothing (retried on the same devices: one node's ranks may all have waited on another node's)
        def rank(item) -> tuple:
            node, report = item
            own = report.rank is not None and report.rank in ranks_of[node]
            return (not report.device_failure, not own, report.retry_same_devices, node)
        node, root = min(failures, key=rank)
        # the one supervisor path decides what follows, as for a launch on one node (supervisor.py)
        raise WorkerFailure(f"node {node}: {root.message}", root.rank, root.cause or root.outcome,
                            device_failure=root.device_failure, retry_same_devices=root.retry_same_devices)


class RemoteNodesWatch:
    """While a segment runs (its own thread): the nodes' beats and reports; on the first trouble it tells
    every node still running to stop, so nobody waits for a collective timeout."""

    def __init__(self, decider: NodeDecider, segment: int, remote: list[int], started: float,
                 first_orders: dict[int, int] | None = None):
        self.decider, self.segment, self.remote, self.started = decider, segment, remote, started
        self.first_orders = first_orders or {}  # per node, the number of this segment's first order
        self.reports: dict[int, NodeReport] = {}
        self.lost: set[int] = set()
        self._refused_reports: set[int] = set()
        self._troubled = threading.Event()
        self._done = threading.Event()
        self._halt = threading.Event()
        self._last_beat = {n: (decider.channel.beats(n), time.monotonic()) for n in remote}
        self._thread = threading.Thread(target=self._run, name="synapse-segment-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)

    def wait_done(self) -> None:
        """Until every node reported or was found lost."""
        while not self._done.is_set():
            self._done.wait(POLL_S * 4)

    def trouble(self, reason: str) -> None:
        if self._troubled.is_set():
            return
        self._troubled.set()
        for node in self.remote:
            if node not in self.reports and node not in self.lost:
                self.decider.channel.order(node, StopOrder(self.segment, reason))

    def _run(self) -> None:
        while not self._halt.is_set() and not self._done.is_set():
            try:
                self._poll()
            except Exception as exc:  # noqa: BLE001  (a dead watch thread would leave both nodes waiting forever)
                self.decider.log(f"decider: watching segment {self.segment} failed once ({type(exc).__name__}: "
                                 f"{exc}); watching on")
            if set(self.remote) <= set(self.reports) | self.lost:
                self._done.set()
            self._halt.wait(POLL_S * 2)

    def _poll(self) -> None:
        channel, now = self.decider.channel, time.monotonic()
        for node in sorted(self.decider.lost - self.lost):  # declared lost in an earlier segment: back?
            self.decider.take_back(node)
        for node in self.remote:
            if node in self.reports or node in self.lost:
                continue
            if (interrupt := channel.interrupt_of(node)) is not None:
                self.decider.interrupted(interrupt)
            report = channel.report_of(self.segment, node)  # None also for a value this run did not seal
            if report is not None and report.epoch != self.decider.epoch:
                self._refuse_report(node, report)
                report = None
            if report is not None:
                self.reports[node] = report
                if report.outcome not in ("finished", "stopped") and not self._others_train_on(report):
                    self.trouble(f"node {node} reported {report.outcome}: {report.cause}")
                continue
            channel.keep_orders(node, self.first_orders.get(node, 0))  # this segment's, until the node reports
            beats, since = self._last_beat[node]
            current = channel.beats(node)
            if current > beats:  # a count that grew: an older sealed beat replayed does not keep a node alive
                self._last_beat[node] = (current, now)
            elif now - since > self.decider.node_timeout_s:
                self.lost.add(node)
                self.decider.lost.add(node)
                # first: its workers may train on (a stalled agent), and must not commit from now on
                close_commits(self.decider.run_dir, self.decider.epoch)
                self.decider.events.append("node_lost", hard=True, node=node, segment=self.segment,
                                           silent_s=round(now - since, 2))
                self.decider.log(f"decider: node {node} lost (no beat for {now - since:.1f} s)")
                # Best effort: an agent that was only stalled reads this when it wakes and tears its
                # workers down, rather than train on beside the launch that replaces them.
                with contextlib.suppress(RuntimeError, OSError):
                    channel.order(node, StopOrder(self.segment, f"node {node} was declared lost (no beat for "
                                                                f"{now - since:.1f} s); the run goes on without it",
                                                  lost=True))
                self.trouble(f"node {node} was lost")

    def _others_train_on(self, report: NodeReport) -> bool:
        """Under torchft: this node's replicas are all gone (their respawns spent), and another node's still
        train, carrying their share; it stops no one (as on one node, the segment fails when every replica has)."""
        return report.cause == REPLICAS_LOST and any(
            self.reports[n].outcome == "finished" if n in self.reports else n not in self.lost for n in self.remote)

    def _refuse_report(self, node: int, report: NodeReport) -> None:
        """A report of another epoch (an agent still following a decider that was replaced): not this
        decider's segment, whatever it says; said once per node."""
        if node in self._refused_reports:
            return
        self._refused_reports.add(node)
        self.decider.log(f"decider: refused node {node}'s report of segment {self.segment}: it is of epoch "
                         f"{report.epoch}, this decider's is {self.decider.epoch}")
        self.decider.events.append("stale_epoch_refused", record="report", node=node, segment=self.segment,
                                   record_epoch=report.epoch, epoch=self.decider.epoch)
