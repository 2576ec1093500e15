"""The roles across nodes: serve the run's store and keep a decider running beside it; run the agents.

The decider's launcher (node 0's ``train.py`` with ``trainer.role=auto``, or a host of its own with
``trainer.role=decider``, which needs no device) serves the run's store (the node channel and every
segment's rendezvous) for the whole run and starts the decider (the supervisor with its controller;
it owns no worker) as a process of its own. Every node runs an agent that owns its workers; node 0's,
under ``role=auto``, is another child of the same launcher, so losing it (with its workers) is an
ordinary node lost. When the decider dies (a kill, the OOM killer, a crash of the interpreter), the
store lives on, so do the agents and their workers: the launcher announces the decider lost on the
store, raises the epoch (``epoch.py``) and starts a new decider. That one rebuilds its state from the
run directory like a ``resume=auto`` run (the segment history in ``segments/``, the controller's
state), meets the agents again under the new epoch and adopts the segment they still run; it
relaunches from the newest checkpoint only when that segment no longer runs on every node of it.

Why a process beside the store rather than a standby on another node: the store must outlive the
decider (the agents and the next decider meet there), and the process that serves it is the one
that sees the decider die at once (its child's exit) without any timeout to tune; a standby would
need a store of its own that every node finds, which TCPStore cannot give. What it does not cover:
the launcher itself lost (the store goes with it: the agents stop and say to rerun with ``resume=auto``),
and a decider whose interpreter runs but whose main thread is stuck (its beat thread still beats;
a decider frozen whole, as by SIGSTOP, stops beating and is killed and restarted: ``DeciderWatch``).

A decider that ends with an error (no device left, a bad config) is not restarted: a restart would
fail the same way. Only a death is: the process ended without handing back a result.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from synapse.config import FailoverConfig, TrainerConfig, decides_elsewhere, resolve_devices
from synapse.failover.agent import run_agent
from synapse.failover.decider import NodeDecider
from synapse.failover.epoch import next_epoch, record_decider
from synapse.failover.node_channel import BEAT_S, DECIDER_KEY, DeciderAnnouncement, NodeChannel
from synapse.planning import device_memory_told_by
from synapse.profiling import profiles_taken_by
from synapse.rundir import LOG, EventLog, events_path, read_events

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class DeciderJob(Protocol):
    """What the decider runs (picklable: it crosses into the decider's own process). ``restarted``: an
    earlier decider of this run died; continue its run from the run directory (resume=auto)."""

    def __call__(self, nodes: NodeDecider, restarted: bool) -> dict[str, Any]: ...


class DeciderLostError(RuntimeError):
    """The decider died more often than ``failover.decider_restarts`` allows; the message says how to go on."""


def keeps_the_decider(trainer: TrainerConfig) -> bool:
    """Whether this launcher serves the run's store and keeps its decider (``trainer.role``)."""
    return trainer.role == "decider" or (trainer.role == "auto" and trainer.node_rank == 0)


def run_across_nodes(trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path, log: Callable[[str], None],
                     job: DeciderJob) -> dict[str, Any]:
    """By ``trainer.role``: serve the run's store and keep a decider running ``job`` (``keep_decider``;
    under ``auto`` node 0 runs its agent beside it), or serve as this node's agent."""
    if not keeps_the_decider(trainer):
        return run_agent(trainer, failover, run_dir, log)
    return keep_decider(trainer, failover, run_dir, log, job, with_agent=trainer.role == "auto")


def keep_decider(trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path, log: Callable[[str], None],
                 job: DeciderJob, with_agent: bool = False) -> dict[str, Any]:
    """Serve the run's store and run ``job`` as the decider in a process of its own until it hands back
    the run's summary (or its error); restart it under a new epoch each time it dies. ``with_agent``:
    also run this node's agent (node 0's) in a process of its own, which owns this node's workers."""
    channel = NodeChannel.host(str(trainer.rdzv_endpoint), float(trainer.rdzv_timeout_s), run_dir, log)
    events = EventLog(events_path(run_dir), source="launcher")
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: this one serves a store from a thread
    restarts = 0
    with _forwarded_signals() as forward, _node_agent(spawn, trainer, failover, run_dir, with_agent, log):
        while True:
            epoch = next_epoch(run_dir)  # durable before anyone hears of it
            channel.epoch = epoch
            channel.announce_decider(DeciderAnnouncement(epoch, "starting"))
            results, result_end = spawn.Pipe(duplex=False)
            beats = spawn.Value("Q", 0, lock=False)  # the decider's beat count (one writer: its beat thread)
            process = spawn.Process(target=serve_as_decider, name=f"synapse-decider-epoch{epoch}",
                                    args=(job, trainer, failover, Path(run_dir), epoch, restarts > 0, result_end,
                                          beats))
            process.start()
            result_end.close()  # the child's end only: its death reads as the end of the pipe here
            forward.pid = process.pid
            record_decider(run_dir, epoch, process.pid or 0)
            events.append("decider_started", epoch=epoch, pid=process.pid, restarts=restarts)
            log(f"launcher: decider of epoch {epoch} started (pid {process.pid})")
            watch = DeciderWatch(process, beats, float(failover.node_timeout_s), epoch, events, log,
                                 start_s=float(failover.decider_grace_s))
            result = _result_of(results, channel, watch)
            process.join()
            forward.pid = None
            if result is not None:
                channel.announce_decider(DeciderAnnouncement(epoch, "gone", process.pid or 0))
                kind, payload = result
                if kind == "summary":
                    return payload
                raise payload
            events.append("decider_lost", epoch=epoch, pid=process.pid, exitcode=process.exitcode)
            if restarts >= failover.decider_restarts:
                channel.announce_decider(DeciderAnnouncement(epoch, "gone", process.pid or 0))
                raise DeciderLostError(
                    f"the decider (pid {process.pid}, epoch {epoch}) died (exit code {process.exitcode}) after "
                    f"{restarts} restart(s), failover.decider_restarts={failover.decider_restarts}; everything "
                    f"finished is saved in the run directory {run_dir}. Fix: rerun the same command on every node "
                    f"with resume=auto (and raise failover.decider_restarts if deciders die this often)")
            channel.announce_decider(DeciderAnnouncement(epoch, "lost", process.pid or 0))
            restarts += 1
            log(f"launcher: the decider of epoch {epoch} (pid {process.pid}) died (exit code {process.exitcode}); "
                f"starting a new one from the run directory (restart {restarts} of "
                f"failover.decider_restarts={failover.decider_restarts})")


class DeciderWatch:
    """A decider that stops beating for ``failover.node_timeout_s`` (frozen: SIGSTOP, a machine that swaps,
    a deadlock of the whole interpreter) is killed, so that it counts as dead and is restarted; a frozen
    decider would otherwise hold the run forever, and could wake to steer it beside its successor."""

    def __init__(self, process, beats, timeout_s: float, epoch: int, events: EventLog, log: Callable[[str], None],
                 start_s: float = 60.0):
        self.process, self.beats, self.timeout_s, self.epoch, self.events, self.log = \
            process, beats, timeout_s, epoch, events, log
        # Its first beat comes only once a fresh interpreter has imported torch and the run's code (seconds
        # to tens of seconds on a loaded machine): until then it has failover.decider_grace_s more, as long
        # as the agents wait for a new decider (one that has not started by then is of no use to them)
        self.seen, self.since, self.start_s = beats.value, time.monotonic(), start_s

    def check(self) -> None:
        now, count = time.monotonic(), self.beats.value
        allowed = self.timeout_s if count else self.timeout_s + self.start_s
        if count != self.seen:
            self.seen, self.since = count, now
        elif now - self.since > allowed and self.process.is_alive():
            self.log(f"launcher: the decider of epoch {self.epoch} (pid {self.process.pid}) has not beaten for "
                     f"{now - self.since:.1f} s (failover.node_timeout_s={self.timeout_s:g}); killing it so that a "
                     f"new one takes over")
            self.events.append("decider_hung", epoch=self.epoch, pid=self.process.pid,
                               silent_s=round(now - self.since, 2))
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.since = float("inf")  # killed once; its end reads as a death


def _result_of(results, channel: NodeChannel, watch: DeciderWatch) -> tuple[str, Any] | None:
    """What the decider handed back, or None if it died first (the pipe ended without a result). Meanwhile
    the announcement is put back whenever someone else overwrote it: the agents must find it when it
    matters (a value not sealed with the run's key is refused by them, but it would hide this one)."""
    try:
        while not results.poll(BEAT_S):
            with contextlib.suppress(RuntimeError, OSError):
                channel.announcements.keep(DECIDER_KEY)
            watch.check()
        return results.recv()
    except (EOFError, OSError):
        return None
    except Exception as exc:  # noqa: BLE001  (an error that pickled but does not unpickle: said as what it was)
        return "error", RuntimeError(f"the decider ended with an error that could not be handed over to its "
                                     f"launcher ({type(exc).__name__}: {exc}); see {LOG.template}")
    finally:
        results.close()


class _Forward:
    pid: int | None = None


@contextlib.contextmanager
def _forwarded_signals() -> Iterator[_Forward]:
    """SIGTERM and SIGHUP to this launcher go on to the decider, which stops the run with a checkpoint
    as on one node (and the launcher then ends with it). SIGINT is ignored here: a Ctrl-C at the
    terminal reaches the decider itself (the same process group), and a launcher ended by it would
    take the store from under the run."""
    forward = _Forward()

    def on_signal(signum: int, frame: Any) -> None:
        if forward.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(forward.pid, signum)

    kept: dict[signal.Signals, Any] = {}
    try:
        for signum, handler in ((signal.SIGTERM, on_signal), (signal.SIGHUP, on_signal),
                                (signal.SIGINT, signal.SIG_IGN)):
            kept[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread (a program calling this from a thread): signals stay as they are
        pass
    try:
        yield forward
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _node_agent(spawn, trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path, wanted: bool,
                log: Callable[[str], None]) -> Iterator[None]:
    """Node 0's agent beside the decider (``trainer.role=auto``): a process of its own, like any node's, so
    that neither outlives nor takes down the other; it ends once the decider's exit order reached it."""
    if not wanted:
        yield
        return
    agent = spawn.Process(target=serve_as_agent, name="synapse-agent-node0", args=(trainer, failover, Path(run_dir)))
    agent.start()
    log(f"launcher: node 0's agent started (pid {agent.pid})")
    try:
        yield
    finally:
        agent.join(timeout=max(4 * BEAT_S, float(failover.node_timeout_s)))  # it acknowledged the exit already
        if agent.is_alive():
            agent.kill()
            agent.join()


def serve_as_agent(trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path) -> None:
    """Node 0's agent process under ``trainer.role=auto`` (any other node runs ``run_agent`` in its launcher).

    A terminal's Ctrl-C (and its hangup) reaches the launcher's whole process group: the decider stops the run
    after the step in flight with a checkpoint, and this agent leaves them to it (its workers stop on the
    decider's request and it reports them stopped; torch's agent, had it handled them, would have killed the
    workers first)."""
    _die_with_the_launcher()
    for terminal_signal in (signal.SIGINT, signal.SIGHUP):
        signal.signal(terminal_signal, signal.SIG_IGN)
    log = _child_log(run_dir)
    try:
        run_agent(trainer, failover, run_dir, log, passes_interrupts=False)
    except Exception as exc:  # noqa: BLE001  (said; the launcher's decider owns the run's outcome)
        log(f"agent: node 0: {type(exc).__name__}: {exc}")
        sys.exit(1)


# ------------------------------------------------------------------------------------------ the decider's process
def serve_as_decider(job: DeciderJob, trainer: TrainerConfig, failover: FailoverConfig, run_dir: Path, epoch: int,
                     restarted: bool, results, beats=None) -> None:
    """The decider's process: meet the agents under ``epoch``, run the job, release the agents, hand back
    the summary (or the error) to the launcher."""
    _die_with_the_launcher()
    if beats is not None:
        threading.Thread(target=_beat, args=(beats,), name="synapse-decider-beat", daemon=True).start()
    log = _child_log(run_dir)
    try:
        channel = NodeChannel.attach(str(trainer.rdzv_endpoint), float(trainer.rdzv_timeout_s), run_dir, log)
        channel.epoch = epoch
        lost: set[int] = set()  # declared lost and not back (node_rejoined) since
        for event in read_events(events_path(run_dir)):
            if event.get("event") in ("node_lost", "node_rejoined") and isinstance(event.get("node"), int):
                (lost.add if event["event"] == "node_lost" else lost.discard)(event["node"])
        decider = NodeDecider(trainer, failover, run_dir, log, channel=channel, epoch=epoch, lost=lost)
        if lost:
            log(f"decider: epoch {epoch}: node(s) {sorted(lost)} were declared lost earlier in this run; they stay out")
        error: BaseException | None = None
        try:
            decider.meet_agents(resolve_devices(trainer))
            # A host of its own has no device of the run (or others): the nodes' agents profile for it, and the
            # planner sizes the devices as their agents described them at the meeting
            elsewhere = decides_elsewhere(trainer)
            with profiles_taken_by(decider.take_profile if elsewhere else None), \
                    device_memory_told_by(decider.device_memory if elsewhere else None):
                summary = job(decider, restarted)
        except BaseException as exc:
            error = exc
            raise
        finally:
            decider.close(error)
        results.send(("summary", summary))
    except BaseException as exc:  # noqa: BLE001  (handed to the launcher, which raises it as the run's error)
        results.send(("error", _portable(exc)))
    finally:
        results.close()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross to the launcher (over the pipe from its own child, the one channel
    pickled here): itself if it pickles, else a RuntimeError that names it."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001  (any pickling failure)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _beat(beats) -> None:
    """The decider's sign of life to its launcher: a count in shared memory, every ``BEAT_S``."""
    while True:
        beats.value += 1
        time.sleep(BEAT_S)


def _die_with_the_launcher() -> None:
    """The decider must not outlive its launcher: without the store it cannot steer anyone, and its
    workers would train on into a directory a resumed run may use. The kernel kills it when the
    launcher dies (its workers follow it, pipeline/worker.py)."""
    launcher = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _child_log(run_dir: Path) -> Callable[[str], None]:
    """The decider's lines go where the launcher's go: the console and the run's train.log."""
    logger = logging.getLogger("synapse")
    if not logger.handlers and not logging.getLogger().handlers:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        file = logging.FileHandler(LOG.path(run_dir))
        file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
        root = logging.getLogger()
        root.setLevel(logging.INFO)
        root.addHandler(console)
        root.addHandler(file)
    return logger.info
