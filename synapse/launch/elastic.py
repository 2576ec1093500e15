"""Start the K pipeline workers with torch.distributed's elastic launcher.

Programmatic ``elastic_launch`` with a c10d rendezvous: on one machine on a free local port
(never a hard-coded one); across machines every node runs the same config with
``trainer.nodes`` and ``trainer.rdzv_endpoint``. Each rank's stdout/stderr go to
``<run_dir>/logs/``. A worker that raises fails the whole launch with that rank's error.

A rendezvous that cannot happen (the configured port is taken, nodes that never join, a store
that cannot be reached) raises ``RendezvousSetupError`` naming the endpoint and the fix; a free
port taken by another process between picking and binding it is picked again. When the health
monitor finds the pipeline hung, the rank blamed is the one its progress board shows busy in
its own work, not one of the peers waiting for it; of ranks found dead together, the one that died first.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import time
import socket
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ..checkpoint import latest_valid_checkpoint
from ..config import resolve_accelerator, resolve_devices
from ..monitor.health import build_health_monitor
from ..monitor.heartbeat import read_heartbeats
from ..monitor.liveness import FINISHED_PHASE, kill_live_workers
from ..pipeline.runtime import WAIT_PHASES, progress_path, read_progress
from ..pipeline.worker import worker_main
from ..storage import disk_full_error, filesystem_full, read_json_record
from . import interrupt, rendezvous


# Workers are forked from a fork server that has torch and the worker code imported already:
# a relaunch costs a fork instead of a fresh interpreter importing torch (seconds per rank),
# and, unlike a plain fork of the supervisor, the server never saw CUDA or the monitor threads.
START_METHOD = "forkserver"
multiprocessing.set_forkserver_preload(["torch", "torch.distributed.pipelining", "synapse.pipeline.worker"])
rendezvous.register()  # the c10d rendezvous with its stores on loopback for one node (launch/rendezvous.py)


class WorkerFailure(RuntimeError):
    """A pipeline worker failed; the message names the rank and its error.

    ``rank`` is the root-cause rank (None when unknown); ``device_failure`` says whether the
    failure is the device's or its process's (killed, hung, CUDA error, probe/XID) rather than
    an error in the code, which no restart would fix. ``lost_ranks``: every rank gone with it (a
    node lost with all its ranks; empty: only ``rank``).
    """

    def __init__(self, message: str, rank: int | None = None, cause: str = "error", device_failure: bool = False,
                 lost_ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.rank, self.cause, self.device_failure, self.lost_ranks = rank, cause, device_failure, tuple(lost_ranks)


class RendezvousSetupError(ValueError):
    """The workers could not meet: the rendezvous port is taken, nodes never joined, or the store
    cannot be reached. The message names the endpoint and what to change."""


PORT_ATTEMPTS = 3  # free ports tried in a row when another process takes the picked one first


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_config(cfg: DictConfig, run_dir: Path, attempt: str = "0", store_hosted: bool = False) -> LaunchConfig:
    trainer = cfg.trainer
    endpoint = trainer.rdzv_endpoint or f"127.0.0.1:{free_port()}"  # nodes > 1 requires an explicit one
    run_id = trainer.rdzv_id or hashlib.sha1(f"{run_dir}:{attempt}".encode()).hexdigest()[:12]
    logs = worker_logs_spec(run_dir / "logs" / f"launch_{attempt}", trainer.local_ranks_filter)
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
                      "node_rank": trainer.node_rank},  # ranks follow the nodes (launch/rendezvous.py)
        max_restarts=0,  # failover is Synapse's decision, made by the supervisor, not a blind restart
        # Under the supervisor, Ctrl-C and SIGTERM mean "checkpoint and stop" (launch/interrupt.py), not
        # torch's "abort the launch now".
        signals_to_handle="SIGHUP,SIGQUIT" if interrupt.active() else "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
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


def launch_pipeline(cfg: DictConfig, run_dir: Path, teacher_weights: str, partition: dict[str, list[int]],
                    resume: str | None, attempt: str = "0", log: Callable[[str], None] = print,
                    stage: int = 0, store_hosted: bool = False) -> dict[str, Any]:
    """Run the pipeline to the end of this launch; return the summary of the last rank.
    ``store_hosted``: the rendezvous store at ``trainer.rdzv_endpoint`` is already served (by a
    multi-node run's decider, ``synapse.failover.node_channel``), so no node hosts one."""
    for tries_left in reversed(range(PORT_ATTEMPTS)):
        config = launch_config(cfg, run_dir, attempt, store_hosted)
        try:
            return _launch_once(config, cfg, run_dir, teacher_weights, partition, resume, attempt, log, stage)
        except RendezvousError as exc:
            if _port_in_use(exc) and not cfg.trainer.rdzv_endpoint and tries_left:
                log(f"launch: port {config.rdzv_endpoint} was taken before the rendezvous could use it; "
                    f"picking another")
                continue
            raise rendezvous_error(cfg, config, exc) from exc
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


def _launch_once(config: LaunchConfig, cfg: DictConfig, run_dir: Path, teacher_weights: str,
                 partition: dict[str, list[int]], resume: str | None, attempt: str, log: Callable[[str], None],
                 stage: int) -> dict[str, Any]:
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    log_dir = run_dir / "logs" / f"launch_{attempt}"
    failure_dir = log_dir / "failures"
    launched_at = time.time()
    tear_down = TearDown(run_dir, since=launched_at)
    hard_failures = tear_down.failures

    gpus = resolve_devices(cfg.trainer) if resolve_accelerator(cfg.trainer) == "cuda" else ()
    try:
        with build_health_monitor(run_dir, cfg.monitor, on_hard_failure=tear_down, log=log, gpu_devices=gpus):
            results = elastic_launch(config, worker_main)(cfg_yaml, str(run_dir), teacher_weights, partition,
                                                          resume, str(failure_dir), stage)
    except ValueError as exc:
        # torch's agent parses each failed worker's error file; on a full disk that file is empty
        # and the agent dies of a JSONDecodeError that says nothing of the disk.
        if not filesystem_full(log_dir):
            raise
        raise _disk_full_failure(log_dir) from exc
    except ChildFailedError as exc:
        beats = {r: b for r, b in read_heartbeats(run_dir).items() if b.get("time", 0.0) >= launched_at}
        progress = read_progress_boards(run_dir, beats, since=launched_at)
        raise failure_of(failure_dir, exc, log_dir, hard_failures, beats, progress) from exc
    summaries = [r for r in results.values() if r]
    return summaries[0] if summaries else {}


def _port_in_use(exc: BaseException) -> bool:
    text = " ".join(str(e) for e in _chain(exc))
    return "EADDRINUSE" in text or "ddress already in use" in text


def _chain(exc: BaseException | None) -> list[BaseException]:
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def rendezvous_error(cfg: DictConfig, config: LaunchConfig, exc: RendezvousError) -> RendezvousSetupError:
    """What went wrong in the rendezvous, for a person: the endpoint, the cause and the fix."""
    trainer, endpoint = cfg.trainer, config.rdzv_endpoint
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


def hang_culprit(progress: dict[int, dict]) -> int | None:
    """In a stalled pipeline every rank stops; the hung one is busy in its own work, the others wait
    for it (recv, send, sync). Of the busy ones, the one busy longest; None if all of them wait
    (a hang in the network itself: no rank can be told from the others)."""
    busy = [(board["time"], rank) for rank, board in progress.items() if board["phase"] not in WAIT_PHASES]
    return min(busy)[1] if busy else None


# Errors a rank raises because *another* rank died: never the root cause.
_PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Read error",
              "NCCL communicator was aborted", "Socket Timeout", "timed out", "TCPStore")


def read_failures(failure_dir: Path) -> list[dict[str, Any]]:
    """The failure records workers wrote, root cause first: the earliest error that is not a
    consequence of losing a peer (then the earliest of those)."""
    records = [read_json_record(p) for p in sorted(Path(failure_dir).glob("rank_*.json"))]
    records = [r for r in records if r is not None]  # an empty one: its writer ran out of disk
    return sorted(records, key=lambda r: (any(p in r["message"] for p in _PEER_LOSS), r["time"]))


_DEVICE_ERRORS = ("CUDA error", "AcceleratorError", "NCCL error", "cudaError")
_TRACEBACK_FRAMING = ("Traceback (most recent call last)", "The above exception", "During handling of the above")
# A worker writes a failure record for any Python exception; one that left none was killed by a
# signal Python cannot handle or crashed. (Which signal is known only when the agent reaped it
# first: the fork server reaps the workers, and the agent reports only the first exit it saw.)
SILENT_DEATH = "died without a word: killed by SIGKILL (kill -9, the OOM killer) or a crash"


def failure_of(failure_dir: Path, exc: ChildFailedError, log_dir: Path, hard_failures: list[dict],
               beats: dict[int, dict], progress: dict[int, dict] | None = None) -> WorkerFailure:
    """The launch's failure as a ``WorkerFailure``: message, root-cause rank, and whether a device failed.

    ``progress``: the ranks' progress boards (``read_progress_boards``), which name the hung rank.
    """
    if filesystem_full(log_dir):  # every write fails, so no record tells the cause; no device failed
        return _disk_full_failure(log_dir)
    records = read_failures(failure_dir)
    # A rank that wrote a failure record exited because of that error: the monitor seeing its pid
    # gone afterwards is a consequence, and the records name the root cause.
    reported = {r["rank"] for r in records}
    hard = [e for e in hard_failures if not (e["event"] == "rank_dead" and _rank_of_event(e, beats) in reported)]
    if hard:
        signals = {rank: f.signal_name() for rank, f in exc.failures.items() if f.exitcode < 0}
        return _hard_failure(_first_cause(hard, exc, beats, progress or {}), beats, progress or {}, log_dir, signals)
    message = describe_failures(failure_dir, exc, log_dir)
    signalled = {rank: f for rank, f in exc.failures.items() if f.exitcode < 0}
    if signalled and all(any(p in r["message"] for p in _PEER_LOSS) for r in records):
        rank, failure = min(signalled.items(), key=lambda item: (item[1].signal_name() != "SIGKILL", item[0]))
        return WorkerFailure(message, rank, f"killed by {failure.signal_name()}", device_failure=True)
    if not records:
        rank = min(exc.failures) if exc.failures else None
        return WorkerFailure(message, rank, SILENT_DEATH, device_failure=True)
    if all(any(p in r["message"] for p in _PEER_LOSS) for r in records):
        # Everyone who spoke only lost a peer; the agent may not have reaped the silent one yet.
        silent = sorted(set(beats) - {r["rank"] for r in records})
        if silent:
            rank = first_death(silent, exc, progress or {})
            return WorkerFailure(f"pipeline rank {rank} {SILENT_DEATH} (its peers lost it); logs in "
                                 f"{log_dir}", rank, SILENT_DEATH, device_failure=True)
    root = records[0]
    device_error = _device_error(root)
    cause = device_error or f"{root['type']}: {root['message']}"
    return WorkerFailure(message, root["rank"], cause.splitlines()[0][:200], device_failure=device_error is not None)


DISK_FULL = "No space left on device"


def _disk_full_failure(log_dir: Path) -> WorkerFailure:
    run_dir = Path(log_dir).parents[1]
    message = str(disk_full_error(run_dir, newest_checkpoint(run_dir), "the workers' writes failed"))
    return WorkerFailure(message, None, DISK_FULL, device_failure=False)


def newest_checkpoint(run_dir: Path) -> Path | None:
    ref = latest_valid_checkpoint(Path(run_dir) / "checkpoints")
    return ref.path if ref is not None else None


def _device_error(record: dict) -> str | None:
    """The device error in a failure record's exception chain ("AcceleratorError: CUDA error: ..."), if any.

    Libraries wrap errors (torch.distributed.pipelining re-raises a forward's error as "[Stage 0]
    failed to run forward"), so the causes are read too: in a formatted traceback an exception's
    own lines are the unindented ones (code lines are indented)."""
    lines = [f"{record['type']}: {record['message']}"]
    lines += [line for line in record.get("traceback", "").splitlines()
              if line and not line[0].isspace() and not line.startswith(_TRACEBACK_FRAMING)]
    return next((line for line in lines if any(p in line for p in _DEVICE_ERRORS)), None)


def _first_cause(hard: list[dict], exc: ChildFailedError, beats: dict[int, dict], progress: dict[int, dict]) -> dict:
    """The monitor's first hard failure, unless it is one of several deaths: ranks found dead that the
    teardown had not killed were gone before it acted, seen in one pass in rank order (no order)."""
    if hard[0]["event"] != "rank_dead":
        return hard[0]
    dead = [e for e in hard if e["event"] == "rank_dead"]
    ranks = [_rank_of_event(e, beats) for e in dead]
    return dead[ranks.index(first_death(ranks, exc, progress))]


def first_death(ranks: list, exc: ChildFailedError, progress: dict[int, dict]) -> int | None:
    """Of ranks seen gone together without a word, the likely first: the one the agent reaped first if a
    signal ended it (it reaps every 0.1 s, then terminates the rest); else the first whose board shows
    its own work (one ended while waiting on a peer is most likely that peer's casualty); else the first."""
    reaped = [r for r, f in exc.failures.items() if f.exitcode < 0 and r in ranks]
    if reaped:
        return reaped[0]
    busy = [r for r in ranks if r in progress and progress[r]["phase"] not in WAIT_PHASES]
    return (busy or ranks)[0]


def _hard_failure(event: dict, beats: dict[int, dict], progress: dict[int, dict], log_dir: Path,
                  signals: dict[int, str]) -> WorkerFailure:
    """The health monitor saw a dead or hung rank (or a failing GPU) and tore the launch down.

    ``signals``: the signal that ended each rank the agent reaped, so that a dead rank's cause says
    how it died whether the monitor or the agent noticed it first."""
    rank = _rank_of_event(event, beats)
    culprit = hang_culprit(progress) if event["event"] == "rank_hung" else None
    if culprit is not None:
        board = progress[culprit]
        waiting = sorted(r for r, b in progress.items() if b["phase"] in WAIT_PHASES)
        message = (f"pipeline rank {culprit} hung in {board['phase']} of step {board['step']}: no progress for "
                   f"{event.get('stalled_s')} s (monitor.hang_timeout_s={event.get('hang_timeout_s')}), while "
                   f"rank(s) {waiting} waited on it; logs in {log_dir}")
        return WorkerFailure(message, culprit, "rank_hung", device_failure=True)
    details = {k: v for k, v in event.items() if k not in ("event", "rank", "time")}
    message = f"pipeline rank {rank} failed first: {event['event']} ({details}); logs in {log_dir}"
    cause = event["event"]
    if cause == "rank_dead":
        cause = f"killed by {signals[rank]}" if rank in signals else f"rank_dead: {SILENT_DEATH}"
    return WorkerFailure(message, rank, cause, device_failure=True)


def _rank_of_event(event: dict, beats: dict[int, dict]) -> int | None:
    """The rank a health event is about: its own ``rank``, or the rank whose heartbeat names its device."""
    if event.get("rank") is not None:
        return int(event["rank"])
    if event.get("ranks"):
        return int(event["ranks"][0])
    device = str(event.get("device", ""))
    for rank, beat in sorted(beats.items()):
        if str(beat.get("device")) in (device, f"cuda:{device}"):
            return rank
    return None


def describe_failures(failure_dir: Path, exc: ChildFailedError, log_dir: Path) -> str:
    """A worker failure the workers themselves reported (or died without reporting)."""
    records = read_failures(failure_dir)
    signalled = {rank: f for rank, f in exc.failures.items() if f.exitcode < 0}
    if signalled and all(any(p in r["message"] for p in _PEER_LOSS) for r in records):
        # A rank killed by a signal writes no record; the others only report losing it.
        rank, failure = min(signalled.items(), key=lambda item: (item[1].signal_name() != "SIGKILL", item[0]))
        return (f"pipeline rank {rank} failed first: killed by signal {failure.signal_name()}; the other ranks "
                f"lost their peer; logs in {log_dir}")
    if not records:  # killed without a word (SIGKILL, OOM): only the agent saw it
        lines = [f"pipeline worker(s) died without reporting an error; logs in {log_dir}"]
        for rank, failure in sorted(exc.failures.items()):
            lines.append(f"  rank {rank}: exit code {failure.exitcode}"
                         + (f" (signal {failure.signal_name()})" if failure.exitcode < 0 else ""))
        return "\n".join(lines)
    root = records[0]
    lines = [f"pipeline rank {root['rank']} failed first: {root['type']}: {root['message']}; logs in {log_dir}",
             root["traceback"].rstrip()]
    for other in records[1:]:
        lines.append(f"  then rank {other['rank']}: {other['type']}: {other['message'].splitlines()[0][:200]}")
    return "\n".join(lines)
