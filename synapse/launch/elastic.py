"""Start the K pipeline workers with torch.distributed's elastic launcher.

Programmatic ``elastic_launch`` with a c10d rendezvous: on one machine on a free local port
(never a hard-coded one); across machines every node runs the same config with
``trainer.nodes`` and ``trainer.rdzv_endpoint``. Each rank's stdout/stderr go to
``<run_dir>/logs/``. A worker that raises fails the whole launch with that rank's error.

A rendezvous that cannot happen (the configured port is taken, nodes that never join, a store
that cannot be reached) raises ``RendezvousSetupError`` naming the endpoint and the fix; a free
port taken by another process between picking and binding it is picked again. A hard failure the
health monitor sees (a rank dead or hung) tears the launch down at once; which rank failed first
is judged in root_cause.py.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import pickle
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousStateError, RendezvousTimeoutError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from synapse.config import TrainerConfig, cuda_index, resolve_accelerator, resolve_devices
from synapse.data import dataset_lazy_imports
from synapse.health import FINISHED_PHASE, build_health_monitor, kill_live_workers, read_heartbeats, written_here
from synapse.launch import interrupt, rendezvous
from synapse.launch.root_cause import WorkerFailure, failure_of
from synapse.pipeline import LaunchTask, progress_path, read_progress, worker_main
from synapse.rundir import FAILURES, LAUNCH_LOGS, filesystem_full

# Workers are forked from a fork server that has torch and the worker code imported already:
# a relaunch costs a fork instead of a fresh interpreter importing torch (seconds per rank),
# and, unlike a plain fork of the supervisor, the server never saw CUDA or the monitor threads.
START_METHOD = "forkserver"
WORKER_MODULES = ("torch", "torch.distributed.pipelining", "synapse.pipeline.worker")
multiprocessing.set_forkserver_preload(list(WORKER_MODULES))  # a launch adds its data set's (below)


def preload_worker_modules(data_set: str) -> None:
    """What the fork server imports when it starts (at this process's first launch): the worker
    code and what this run's data set imports lazily. Without the latter, every rank of every launch
    imported scikit-learn for the digits on its own: 3-4 s of CPU per rank, most of a tiny launch."""
    multiprocessing.set_forkserver_preload([*WORKER_MODULES, *dataset_lazy_imports(data_set)])


def start_fork_server() -> None:
    """Start the fork server (if it is not running) with SIGHUP ignored, which it keeps: an ignored
    signal stays ignored across exec, and the workers it forks inherit that too. A closed terminal's
    SIGHUP reaches every process of the job; the server dying of it would make torch's agent read
    every worker as exited (their status pipes close with it) instead of letting the supervisor stop
    them with a checkpoint (launch/interrupt.py). Its sibling, multiprocessing's resource tracker,
    is started with it and ignores SIGHUP as well."""
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()  # a handler can only be changed in the main thread
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


rendezvous.register()  # the c10d rendezvous with its stores on loopback for one node (launch/rendezvous.py)


class RendezvousSetupError(ValueError):
    """The workers could not meet: the rendezvous port is taken, nodes never joined, or the store
    cannot be reached. The message names the endpoint and what to change."""


PORT_ATTEMPTS = 3  # free ports tried in a row when another process takes the picked one first


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_config(trainer: TrainerConfig, run_dir: Path, attempt: str = "0", store_hosted: bool = False
                  ) -> LaunchConfig:
    endpoint = trainer.rdzv_endpoint or f"127.0.0.1:{free_port()}"  # nodes > 1 requires an explicit one
    # Derived from the run's key, not from run_dir: not guessable (the key's seal is what protects the state)
    run_id = trainer.rdzv_id or rendezvous.rendezvous_id(run_dir, attempt)
    logs = worker_logs_spec(LAUNCH_LOGS.path(run_dir, attempt=attempt), trainer.local_ranks_filter)
    return LaunchConfig(
        min_nodes=trainer.nodes, max_nodes=trainer.nodes, nproc_per_node=len(resolve_devices(trainer)),
        run_id=run_id, rdzv_backend=rendezvous.BACKEND, rdzv_endpoint=endpoint,
        # MASTER_ADDR of the workers: on one node, loopback (not the host name, which may resolve outward)
        local_addr=rendezvous.LOOPBACK if trainer.nodes == 1 else None,
        rdzv_configs={"timeout": trainer.rdzv_timeout_s, "join_timeout": trainer.rdzv_timeout_s,
                      # connecting to the store: torch's default is 60 s, whatever rdzv_timeout_s says
                      "read_timeout": trainer.rdzv_timeout_s,
                      # Node 0 hosts the c10d store; on one machine the others must not try to. A
                      # multi-node failover run's store is hosted by its decider for the whole run.
                      "is_host": trainer.node_rank == 0 and not store_hosted,
                      "node_rank": trainer.node_rank,  # ranks follow the nodes (launch/rendezvous.py)
                      "run_dir": str(run_dir)},  # its run.key seals the rendezvous state (launch/rendezvous.py)
        max_restarts=0,  # failover is Synapse's decision, made by the supervisor, not a blind restart
        # Under the supervisor, Ctrl-C, SIGTERM and a closed terminal's SIGHUP mean "checkpoint and stop"
        # (launch/interrupt.py), not torch's "abort the launch now".
        signals_to_handle=interrupt.signals_for_torch(),
        monitor_interval=0.1, start_method=START_METHOD, logs_specs=logs,
        log_line_prefix_template=RANK_PREFIX if trainer.nodes == 1 else f"[node {trainer.node_rank}] {RANK_PREFIX}",
    )


RANK_PREFIX = "[rank ${rank}] "  # what a worker's line shown on the console starts with (torch's Template)


def worker_logs_spec(log_dir: Path, shown_ranks) -> DefaultLogsSpecs:
    """Every rank's stdout and stderr go to ``<log_dir>/<id>/attempt_0/<local rank>/``; only the ranks of
    ``trainer.local_ranks_filter`` are also shown on the console (None: all of them, []: none)."""
    if shown_ranks is not None and len(shown_ranks) == 0:  # torch reads an empty filter as "all"
        return DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.NONE)
    return DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.ALL,
                            local_ranks_filter=None if shown_ranks is None else {int(r) for r in shown_ranks})


def launch_pipeline(task: LaunchTask, run_dir: Path, attempt: str = "0", log: Callable[[str], None] = print,
                    store_hosted: bool = False) -> dict[str, Any]:
    """Run ``task`` on this node's workers to the end of this launch; return the summary of the last
    rank. ``store_hosted``: the rendezvous store at ``trainer.rdzv_endpoint`` is already served (by
    a multi-node run's decider, ``synapse.failover.node_channel``), so no node hosts one."""
    cfg = task.config
    preload_worker_modules(cfg.data.name)
    start_fork_server()
    for tries_left in reversed(range(PORT_ATTEMPTS)):
        config = launch_config(cfg.trainer, run_dir, attempt, store_hosted)
        try:
            return _launch_once(config, task, run_dir, attempt, log)
        except WorkerFailure as failure:
            if failure.device_failure or failure.retry_same_devices:  # the supervisor restarts the launch
                _release_frames(failure)
            raise
        except (rendezvous.ForeignRoundValueError, RendezvousStateError) as exc:
            # Another process's values on the store failed this round (each one refused and logged as it
            # was read): no device is to blame and the code is not wrong, so the launch is retried.
            _release_frames(exc)
            raise WorkerFailure(f"the launch's rendezvous failed on values another process wrote on its store: "
                                f"{exc}", None, "store_tampered", retry_same_devices=True) from exc
        except RendezvousError as exc:
            if _port_in_use(exc) and not cfg.trainer.rdzv_endpoint and tries_left:
                log(f"launch: port {config.rdzv_endpoint} was taken before the rendezvous could use it; "
                    f"picking another")
                continue
            raise rendezvous_error(cfg.trainer, config, exc) from exc
    raise AssertionError("unreachable")


class TearDown:
    """The health monitor's ``on_hard_failure`` during one launch: a dead or hung rank ends the launch
    now (every live worker SIGKILLed). ``failures`` keeps the events that caused a teardown; a rank
    found dead afterwards whose pid the teardown killed is its consequence, not a cause, and would
    otherwise be blamed for a failure that a rank reported itself (its own exit does not count)."""

    def __init__(self, run_dir: Path, since: float):
        self.run_dir, self.since = run_dir, since
        self.failures: list[dict] = []
        self.killed: set[int] = set()

    def __call__(self, event: dict) -> None:  # on the monitor's thread
        if event["event"] == "rank_dead" and event.get("pid") in self.killed:
            return
        self.failures.append(event)
        self.killed.update(kill_live_workers(read_heartbeats(self.run_dir), since=self.since))


def _launch_once(config: LaunchConfig, task: LaunchTask, run_dir: Path, attempt: str, log: Callable[[str], None]
                 ) -> dict[str, Any]:
    cfg = task.config
    log_dir = LAUNCH_LOGS.path(run_dir, attempt=attempt)
    failure_dir = FAILURES.path(run_dir, attempt=attempt)
    launched_at = time.time()
    tear_down = TearDown(run_dir, since=launched_at)
    hard_failures = tear_down.failures

    def judged(reaped: dict) -> WorkerFailure:
        # this node's ranks of this launch: their pids mean something here
        beats = {r: b for r, b in read_heartbeats(run_dir).items()
                 if b.get("time", 0.0) >= launched_at and written_here(b)}
        progress = read_progress_boards(run_dir, beats, since=launched_at)
        return failure_of(failure_dir, reaped, log_dir, hard_failures, beats, progress, killed=tear_down.killed)

    # the GPUs the ranks run on (one, shared, under trainer.shared_gpu)
    gpus = (sorted({cuda_index(cfg.trainer, d) for d in resolve_devices(cfg.trainer)})
            if resolve_accelerator(cfg.trainer) == "cuda" else ())
    try:
        with build_health_monitor(run_dir, cfg.monitor, on_hard_failure=tear_down, log=log, gpu_devices=gpus):
            results = elastic_launch(config, worker_main)(task, str(run_dir), str(failure_dir))
    except ChildFailedError as exc:
        raise judged(exc.failures) from exc
    except (ValueError, EOFError, pickle.UnpicklingError) as exc:
        # torch's agent reads what each failed worker wrote as it died (a JSON error record, a pickled
        # traceback). On a full disk that is empty; a worker SIGKILLed mid-write (by the teardown after
        # a peer died or hung: found by the long random fault sequences) leaves it truncated. Either
        # way the agent dies of the read instead of reporting the failure; the launch's own evidence
        # (failure_of: the disk first) tells what failed.
        if not (filesystem_full(log_dir) or unreadable_worker_report(exc)):
            raise
        raise judged({}) from exc
    summaries = [r for r in results.values() if r]
    return summaries[0] if summaries else {}


# Where torch's launcher reads a failed worker's report: torch.multiprocessing's ProcessContext.join
# unpickles its traceback, elastic's ProcessFailure parses its JSON error record.
_WORKER_REPORT_READS = ((("torch", "multiprocessing", "spawn.py"), "join"),
                        (("multiprocessing", "errors", "__init__.py"), "__post_init__"))


def unreadable_worker_report(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's launcher failing to read a report a failed worker was writing as it died."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(Path(f.filename).parts[-3:] == parts and f.name == name
               for f in frames for parts, name in _WORKER_REPORT_READS)


def _release_frames(failure: BaseException) -> None:
    """Drop the tracebacks of a failed launch's exceptions before a restart: their frames hold the launch's
    agent and rendezvous store, whose server would keep ``trainer.rdzv_endpoint``'s port bound, so the
    restart could not bind it again. The messages stay."""
    for exc in _chain(failure):
        exc.__traceback__ = None


def _port_in_use(exc: BaseException) -> bool:
    text = " ".join(str(e) for e in _chain(exc))
    return "EADDRINUSE" in text or "ddress already in use" in text


def _chain(exc: BaseException | None) -> list[BaseException]:
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def rendezvous_error(trainer: TrainerConfig, config: LaunchConfig, exc: RendezvousError) -> RendezvousSetupError:
    """What went wrong in the rendezvous, for a person: the endpoint, the cause and the fix."""
    endpoint = config.rdzv_endpoint
    cause = "; ".join(f"{type(e).__name__}: {e}" for e in _chain(exc) if str(e).strip())[:400] or type(exc).__name__
    if _port_in_use(exc):
        if not trainer.rdzv_endpoint:
            return RendezvousSetupError(
                f"the rendezvous store could not start: {PORT_ATTEMPTS} free ports in a row were taken by other "
                f"processes before it could bind them (last {endpoint}). Fix: retry; if it persists, set "
                f"trainer.rdzv_endpoint=127.0.0.1:PORT to a port reserved for this run")
        return RendezvousSetupError(
            f"trainer.rdzv_endpoint={endpoint}: the port is already in use on this machine (another process "
            f"listens on it, e.g. an earlier run that is still alive), so the rendezvous store cannot start there "
            f"({cause}). Fix: choose a free port, or leave trainer.rdzv_endpoint unset on one machine (a free port "
            f"is picked)")
    if isinstance(exc, RendezvousTimeoutError):
        return RendezvousSetupError(
            f"the rendezvous at {endpoint} timed out after trainer.rdzv_timeout_s={trainer.rdzv_timeout_s} s: "
            f"trainer.nodes={trainer.nodes} nodes were expected (this is node_rank {trainer.node_rank}) and not all "
            f"joined. Fix: start python train.py on every node with the same trainer.rdzv_endpoint, trainer.nodes "
            f"and trainer.rdzv_id, within the timeout, or raise trainer.rdzv_timeout_s")
    return RendezvousSetupError(
        f"the rendezvous at {endpoint} failed for node_rank {trainer.node_rank} ({cause}). Fix: start node_rank 0 "
        f"first (it hosts the store), check that {endpoint} is reachable from this machine, or raise "
        f"trainer.rdzv_timeout_s (now {trainer.rdzv_timeout_s} s)")


def read_progress_boards(run_dir: Path, beats: dict[int, dict], since: float) -> dict[int, dict]:
    """The progress board of every rank of this launch that had not finished (rank -> last entry)."""
    boards = {}
    for rank, beat in beats.items():
        if beat.get("time", 0.0) < since or beat.get("phase") == FINISHED_PHASE:
            continue
        board = read_progress(progress_path(run_dir, rank))
        if board is not None and board["pid"] == beat.get("pid"):
            boards[rank] = board
    return boards
