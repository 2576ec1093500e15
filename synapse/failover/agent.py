"""The agent: what ``python train.py`` runs on every node but node 0 of a multi-node failover run.

It owns no decision. It says hello to the decider (node 0), then follows its orders: launch
this node's workers of segment n with the config the decider composed, tear them down, exit.
It reports how each launch ended (the failed rank and cause, from this node's own elastic
agent and health monitor) and beats, so the decider can tell a lost node from a slow one.

Node 0 runs an agent too: the decider owns no worker. If the decider dies, its launcher (which
serves the store) says so on the store and starts a new one under the next epoch (``keeper.py``):
the agent's workers train on; its beat thread waits for the new decider for
``failover.decider_grace_s`` and attaches to it again, with the number of orders it has read and the
segment its workers still run, which the new decider adopts; the launch's report waits for it. From
then on the agent refuses, and says, any order of an older epoch. If the store itself is lost, or no
new decider comes, the agent tears its workers down and exits with the documented outcome: the newest
checkpoint on the shared run directory holds everything finished; rerun the same command on the
surviving nodes with ``resume=auto``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from synapse.config import FailoverConfig, TrainerConfig, config_from_yaml, local_devices, resolve_devices
from synapse.failover.node_channel import (
    BEAT_S,
    MEETING,
    POLL_S,
    ExitOrder,
    LaunchOrder,
    NodeChannel,
    NodeChannelError,
    NodeHello,
    NodeInterrupt,
    NodeReport,
    NodeSetupError,
    ProfileAnswer,
    ProfileOrder,
    StopOrder,
)
from synapse.health import kill_live_workers, read_heartbeats
from synapse.launch import InterruptToStop, WorkerFailure, launch_pipeline, launch_replica_groups, newest_checkpoint
from synapse.partitioning import Placement
from synapse.pipeline import LaunchTask, ReplicaMeeting
from synapse.profiling import ProfileRequest, get_or_profile
from synapse.rundir import RUN_KEY, EventLog, events_path


class DeciderLost(RuntimeError):
    """Node 0 stopped answering; the message says what is saved and how to continue."""


def run_agent(trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path, log: Callable[[str], None] = print,
              passes_interrupts: bool = True) -> dict[str, Any]:
    """Serve the decider's orders until it says the run is over; return its last launch's summary.
    Each order carries the whole config of the segment it launches. ``passes_interrupts``: a Ctrl-C, SIGTERM
    or hangup of this launcher goes to the decider, which stops the run with a checkpoint (False: node 0's
    agent beside the decider, whose terminal's signals reach the decider itself)."""
    endpoint = trainer.rdzv_endpoint
    if endpoint is None:  # validation requires it of a run on several nodes
        raise NodeSetupError(f"node_rank {trainer.node_rank}: trainer.rdzv_endpoint is not set. Fix: set "
                             f"trainer.rdzv_endpoint=host:port, the same as node 0's")
    channel = NodeChannel.connect(endpoint, trainer.node_rank, trainer.rdzv_timeout_s, run_dir, log)
    node = int(trainer.node_rank)
    nonce = secrets.token_hex(8)  # the welcome must echo it: no welcome of an earlier run is taken for this one's
    # node 0's launcher announces its decider's epoch as soon as its store serves (none: epoch 0, which a
    # decider of a later epoch does not welcome, and the meeting times out naming the fix)
    announced = channel.wait_decider(min(float(trainer.rdzv_timeout_s), 10.0))
    hello = NodeHello(node, int(trainer.nodes), resolve_devices(trainer), socket.getfqdn(), os.getpid(), nonce,
                      epoch=announced.epoch if announced else 0, incarnation=secrets.token_hex(8),
                      host_devices=dataclasses.asdict(local_devices(trainer)))
    channel.say_hello(hello)
    another_key = channel.holds_another_run_key()  # read now: when that fails the meeting, node 0's store goes
    try:
        welcome = channel.wait_welcome(node, 2 * trainer.rdzv_timeout_s, nonce)
    except RuntimeError:  # node 0's store went away (it gave up on this node)
        if not another_key:
            raise
        welcome = None
    if welcome is None and another_key:
        raise NodeSetupError(
            f"node_rank {node}: this node's run directory {run_dir} is not node 0's: it holds another run key "
            f"({RUN_KEY.template}), so node 0 cannot read this node's records. Fix: put hydra.run.dir on a "
            f"filesystem every node sees, at the same path on every node (the checkpoints and records of all "
            f"nodes live there)")
    if welcome is None:
        raise NodeSetupError(f"node_rank {node}: node 0 at {endpoint} did not answer within "
                             f"{2 * trainer.rdzv_timeout_s:g} s. Fix: start node 0 with the same trainer.rdzv_endpoint")
    if welcome.error:
        raise NodeSetupError(f"node_rank {node}: node 0 refused this node: {welcome.error}")
    channel.join(welcome.instance)
    channel.epoch = welcome.epoch
    log(f"agent: node {node} joined the run at {endpoint}; waiting for the decider's orders")
    agent = Agent(channel, node, run_dir, log, endpoint, trainer.rdzv_timeout_s, welcome.instance, hello=hello,
                  grace_s=float(failover.decider_grace_s))
    if not passes_interrupts:
        return agent.serve()
    # Handled here, not by torch's agent, which would abort this node's launch and kill its workers before
    # they could write the checkpoint (launch/interrupt.py: torch is handed none of these while this is active)
    with InterruptToStop(agent.interrupted):
        return agent.serve()


class Agent:
    def __init__(self, channel: NodeChannel, node: int, run_dir: Path, log: Callable[[str], None], endpoint: str,
                 timeout_s: float, instance: str, hello: NodeHello | None = None, grace_s: float = 0.0):
        self.channel, self.node, self.run_dir, self.log = channel, node, Path(run_dir), log
        # the beating thread has its own connection: a main thread blocked in a launch never delays a beat
        self._beats = NodeChannel.connect(endpoint, node, timeout_s, run_dir, log)
        self._beats.records.refused = channel.records.refused  # one refusal said once, whichever thread met it
        self._beats.join(instance)
        self.epoch = self._beats.epoch = channel.epoch  # the decider epoch this agent follows
        self.hello, self.grace_s = hello, grace_s  # what it says again to a restarted decider, and how long it waits
        self._claim_nonce = hello.nonce if hello is not None else ""  # its first hello's: its claim of node_rank
        self.events = EventLog(events_path(self.run_dir), source=f"agent of node {node}")
        self.decider_lost = threading.Event()  # the store is gone (node 0 lost), or no decider will come: exit
        self.decider_replaced = threading.Event()  # the decider this agent follows died: re-attach to the next
        self._refused_orders: set[tuple[int, int]] = set()  # (order number, epoch) said once
        self.stop_segment: int | None = None  # a StopOrder for this segment arrived
        self.launch: tuple[int, float] | None = None  # (segment, started) while workers run
        self.unreported = -1  # the segment whose workers run or whose report is not delivered yet (-1: none)
        self.orders_seen = 0
        self.interrupt: str | None = None  # the signal this launcher got, until the beat thread said it

    def serve(self) -> dict[str, Any]:
        beating = threading.Thread(target=self._beat, name="synapse-agent-beat", daemon=True)
        beating.start()
        summary: dict[str, Any] = {}
        while True:
            order = self._next_order()
            if isinstance(order, ExitOrder):
                self.decider_lost.set()  # stops the beat thread; the decider is leaving
                with contextlib.suppress(RuntimeError, OSError):  # it waits for this before it leaves
                    self.channel.acknowledge_exit(self.node, self.orders_seen - 1)
                if order.error:
                    raise RuntimeError(f"node {self.node}: the decider ended the run with an error: {order.error}")
                self.log(f"agent: node {self.node}: the run is over")
                return summary
            if isinstance(order, LaunchOrder):
                summary = self._run_launch(order) or summary
            if isinstance(order, ProfileOrder):
                self._profile(order)

    def _next_order(self):
        while True:
            try:
                order = self.channel.next_order(self.node, self.orders_seen, timeout_s=BEAT_S) \
                    if not self.decider_lost.is_set() else None
            except (RuntimeError, OSError):  # the store's server (node 0's launcher) is gone
                self.decider_lost.set()
                order = None
            if order is None and self.decider_lost.is_set():
                raise DeciderLost(decider_lost_message(self.node, self.run_dir))
            if order is not None and order.epoch != self.epoch:
                # older: a decider that was replaced (refused, said); newer: one this agent has not attached
                # to yet (the beat thread sees its announcement). Either way not followed, and the number is
                # not consumed: the current decider's order under it is read once it is put back.
                if order.epoch < self.epoch:
                    self._refuse_order(order)
                time.sleep(POLL_S * 4)
                continue
            if order is None:
                try:
                    self.channel.keep_report()  # put back if someone overwrote it before the decider read it
                except (RuntimeError, OSError):
                    self.decider_lost.set()
                continue
            self.orders_seen += 1
            if isinstance(order, StopOrder) and order.lost:
                self._rejoin(order)
            elif not isinstance(order, StopOrder):  # a stop for a launch already over needs nothing
                return order

    def _rejoin(self, order: StopOrder) -> None:
        """The decider declared this node lost (it was silent past ``failover.node_timeout_s``: stalled, not
        dead) and the run went on without it; its workers are torn down (``_check_stop``). Come back as a
        new incarnation: the decider welcomes it as a spare, which a later decision may take (REPLACE)."""
        assert self.hello is not None
        self.hello = dataclasses.replace(self.hello, nonce=secrets.token_hex(8), incarnation=secrets.token_hex(8),
                                         epoch=self.epoch, orders_seen=self.orders_seen, running_segment=-1)
        self.log(f"agent: node {self.node}: declared lost by the decider ({order.reason}); rejoining as incarnation "
                 f"{self.hello.incarnation}")
        with contextlib.suppress(OSError):
            self.events.append("node_rejoining", node=self.node, incarnation=self.hello.incarnation,
                               epoch=self.epoch)
        scope = self.channel.records.scope
        self.channel.join(MEETING)  # this thread's connection: the beat thread beats on in the run's scope
        try:
            self.channel.say_hello(self.hello, claim_nonce=self._claim_nonce)
            while (welcome := self.channel.wait_welcome(self.node, BEAT_S, self.hello.nonce)) is None:
                if self.decider_lost.is_set() or self.decider_replaced.is_set():
                    return  # the store is gone, or a new decider: the beat thread deals with it
                if self._beats.next_order(self.node, self.orders_seen, timeout_s=0) is not None:
                    return  # the run ended (an exit order) before the decider took this node back
        finally:
            self.channel.join(scope)
        if welcome.error:
            raise NodeSetupError(f"node_rank {self.node}: the decider refused this node's return: {welcome.error}")
        self.log(f"agent: node {self.node}: back in the run as a spare")

    def _refuse_order(self, order) -> None:
        said = (self.orders_seen, order.epoch)
        if said in self._refused_orders:
            return
        self._refused_orders.add(said)
        self.log(f"agent: node {self.node}: refused order number {self.orders_seen} ({order.kind}) of decider epoch "
                 f"{order.epoch}: this node follows epoch {self.epoch}; a decider that was replaced no longer "
                 f"gives orders")
        with contextlib.suppress(OSError):
            self.events.append("stale_epoch_refused", record="order", kind=order.kind, node=self.node,
                               order=self.orders_seen, record_epoch=order.epoch, epoch=self.epoch)

    def _reattach(self) -> None:
        """The decider this agent followed died (the beat thread's, while the workers train on): wait
        (``failover.decider_grace_s``) for its launcher to announce the next epoch, say hello to its decider
        with the segment still running here, and follow it from the next order on. On its own connection:
        the main thread's stays in the run's scope, where it reads orders and reports."""
        old, deadline = self.epoch, time.monotonic() + self.grace_s
        self.log(f"agent: node {self.node}: the decider of epoch {old} was lost; waiting up to "
                 f"failover.decider_grace_s={self.grace_s:g} s for the next one")
        target, nonce, welcome = old, "", None
        try:
            while welcome is None:
                if time.monotonic() > deadline:
                    raise DeciderLost(decider_lost_message(self.node, self.run_dir))
                announced = self._beats.decider()
                if announced is not None and announced.state == "gone":  # the launcher gave up restarting it
                    raise DeciderLost(decider_lost_message(self.node, self.run_dir))
                if announced is not None and announced.epoch > target and announced.state == "starting" \
                        and self.hello is not None:
                    # a newer decider (also when the one this agent said hello to died before its welcome)
                    target, nonce = announced.epoch, secrets.token_hex(8)
                    self._beats.join(MEETING)
                    self._beats.say_hello(dataclasses.replace(self.hello, nonce=nonce, epoch=target,
                                                              orders_seen=self.orders_seen,
                                                              running_segment=self.unreported),
                                          claim_nonce=self._claim_nonce)
                if target > old:
                    welcome = self._beats.wait_welcome(self.node, 1.0, nonce)
                else:
                    time.sleep(POLL_S * 4)
        except (RuntimeError, OSError) as exc:  # the store is gone: node 0 itself was lost
            self.decider_lost.set()
            if isinstance(exc, DeciderLost):
                raise
            raise DeciderLost(decider_lost_message(self.node, self.run_dir)) from exc
        if welcome.error:
            raise NodeSetupError(f"node_rank {self.node}: the decider of epoch {target} refused this node: "
                                 f"{welcome.error}")
        self.channel.join(welcome.instance)
        self._beats.join(welcome.instance)
        self.channel.epoch = self._beats.epoch = self.epoch = welcome.epoch
        self.decider_replaced.clear()
        self.log(f"agent: node {self.node}: attached to the decider of epoch {self.epoch}")
        with contextlib.suppress(OSError):
            self.events.append("decider_reattached", node=self.node, epoch=self.epoch, previous_epoch=old,
                               orders_seen=self.orders_seen)

    def _profile(self, order: ProfileOrder) -> None:
        """Profile on this node's devices what a decider without them plans with (or find it in this node's
        cache), and answer with the profiles' text."""
        profiles, error = [], ""
        try:
            for fields in order.requests:
                _, path = get_or_profile(ProfileRequest(**fields), order.cache_dir, refresh=order.refresh,
                                         log=self.log)
                profiles.append({"name": path.name, "csv": path.read_text()})
        except Exception as exc:  # noqa: BLE001  (said to the decider, which ends the run with it)
            error = f"{type(exc).__name__}: {exc}"[:2000]
        with contextlib.suppress(OSError):
            self.events.append("profiled_for_decider", node=self.node, pid=os.getpid(),
                               profiles=[p["name"] for p in profiles], error=error or None)
        try:
            self.channel.answer_profile(ProfileAnswer(self.node, order.answer, profiles, error, socket.getfqdn(),
                                                      os.getpid()))
        except (RuntimeError, OSError):  # the store's server is gone
            self.decider_lost.set()

    def interrupted(self, signal_name: str) -> None:
        """The first Ctrl-C, SIGTERM or hangup of this launcher (its signal handler, in the main thread, which
        may hold the channel: the beat thread says it to the decider on its next turn). A second SIGINT or
        SIGTERM aborts this node's launch at once (``InterruptToStop``)."""
        self.interrupt = signal_name
        self.log(f"agent: node {self.node}: {signal_name}: asking the decider to stop the run after the current "
                 f"step with a checkpoint (Ctrl-C again to abort this node's launch now)")

    def _run_launch(self, order: LaunchOrder) -> dict[str, Any] | None:
        cfg = config_from_yaml(order.cfg_yaml)
        task = LaunchTask(cfg, Placement.from_dict(order.partition), order.microbatches, order.segment,
                          order.teacher_weights, order.resume)
        self.stop_segment, self.launch, self.unreported = None, (order.segment, time.time()), order.segment
        self.log(f"agent: node {self.node}: segment {order.segment} on local devices "
                 f"{list(resolve_devices(cfg.trainer))}")
        report = NodeReport(self.node, order.segment, "finished")
        try:
            if order.replica_meeting is not None:  # torchft: this node's replicas, each a launch of its own
                summary = launch_replica_groups(task, self.run_dir, str(order.segment), self.log,
                                                meeting=ReplicaMeeting(**order.replica_meeting))
            else:
                summary = launch_pipeline(task, self.run_dir, attempt=f"{order.segment}_node{self.node}",
                                          log=self.log, store_hosted=order.store_hosted)
            report = NodeReport(self.node, order.segment, "finished", summary=summary or {})
        except WorkerFailure as exc:  # "stopped": torn down on the decider's order, a consequence
            outcome = "stopped" if self.stop_segment == order.segment else "failed"
            report = NodeReport(self.node, order.segment, outcome, rank=exc.rank, cause=exc.cause,
                                message=str(exc)[:4000], device_failure=exc.device_failure,
                                retry_same_devices=exc.retry_same_devices)
        except Exception as exc:  # noqa: BLE001  (the rendezvous or the launch itself failed: the decider decides)
            report = NodeReport(self.node, order.segment, "error", cause=type(exc).__name__, message=str(exc)[:4000])
        finally:
            self.launch = None
        # The decider that ordered it died meanwhile: the report is for its successor, which adopted (or
        # will adopt) this segment; it goes once the beat thread has attached to it
        while self.decider_replaced.is_set() and not self.decider_lost.is_set():
            time.sleep(POLL_S * 4)
        try:
            if not self.decider_lost.is_set():
                self.channel.report(report)
                self.unreported = -1
        except (RuntimeError, OSError):  # the store's server is gone
            self.decider_lost.set()
        if self.decider_lost.is_set():
            raise DeciderLost(decider_lost_message(self.node, self.run_dir))
        return report.summary

    def _beat(self) -> None:
        """Beat, and watch for a StopOrder or a lost decider while the main thread runs a launch."""
        while not self.decider_lost.is_set():
            try:
                if self.decider_replaced.is_set():
                    self._reattach()
                self._beats.beat(self.node)
                if (signal_name := self.interrupt) is not None:
                    self._beats.interrupted(NodeInterrupt(self.node, signal_name))
                    self.interrupt = None
                    with contextlib.suppress(OSError):
                        self.events.append("node_interrupted", node=self.node, signal=signal_name, epoch=self.epoch)
                self._check_decider()
                self._check_stop()
            except DeciderLost:  # no new decider came in time, or its launcher gave up
                self.decider_lost.set()
                self._tear_down("no decider took the run over")
                return
            except (RuntimeError, OSError, NodeChannelError):  # the store is gone
                self.decider_lost.set()
                self._tear_down("the run's store stopped answering")
                return
            time.sleep(BEAT_S)

    def _check_decider(self) -> None:
        """Whether the decider this agent follows is still the run's (node 0's launcher announces each one)."""
        announced = self._beats.decider()
        if announced is None or self.decider_replaced.is_set():
            return
        if announced.epoch > self.epoch or (announced.epoch == self.epoch and announced.state in ("lost", "gone")):
            # the workers train on: the next decider adopts them (``_reattach``, from this thread's next turn)
            self.decider_replaced.set()

    def _check_stop(self) -> None:
        launch = self.launch
        if launch is None:
            return
        seq = self.orders_seen
        while (order := self._beats.next_order(self.node, seq, timeout_s=0)) is not None:
            seq += 1
            if isinstance(order, StopOrder) and order.segment == launch[0] and self.stop_segment != launch[0] \
                    and order.epoch == self.epoch:
                self.stop_segment = launch[0]
                self._tear_down(order.reason)

    def _tear_down(self, reason: str) -> None:
        launch = self.launch
        if launch is not None:
            self.log(f"agent: node {self.node}: tearing down segment {launch[0]}: {reason}")
            kill_live_workers(read_heartbeats(self.run_dir), since=launch[1])


def decider_lost_message(node: int, run_dir: Path) -> str:
    saved = newest_checkpoint(run_dir)
    at = f"the newest checkpoint is {saved}" if saved else "no checkpoint was written yet"
    return (f"node {node}: the decider's launcher (the run's store) was lost, or no decider took the run over, so "
            f"this node's workers were stopped; {at} on the shared run directory, nothing finished is lost. Fix: "
            f"rerun the same command on the surviving nodes with resume=auto (one of them as trainer.node_rank=0 "
            f"with its address in trainer.rdzv_endpoint, and trainer.nodes set to how many are left)")
