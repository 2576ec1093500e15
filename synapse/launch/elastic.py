"""Start the K pipeline workers with torch.distributed's elastic launcher.

Programmatic ``elastic_launch`` with a c10d rendezvous: on one machine on a free local port
(never a hard-coded one); across machines every node runs the same config with
``trainer.nodes`` and ``trainer.rdzv_endpoint``. Each rank's stdout/stderr go to
``<run_dir>/logs/``. A worker that raises fails the whole launch with that rank's error.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import json
import time
import socket
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ..config import resolve_accelerator, resolve_devices
from ..monitor.health import build_health_monitor
from ..monitor.heartbeat import read_heartbeats
from ..monitor.liveness import kill_live_workers
from ..pipeline.worker import worker_main


# Workers are forked from a fork server that has torch and the worker code imported already:
# a relaunch costs a fork instead of a fresh interpreter importing torch (seconds per rank),
# and, unlike a plain fork of the supervisor, the server never saw CUDA or the monitor threads.
START_METHOD = "forkserver"
multiprocessing.set_forkserver_preload(["torch", "torch.distributed.pipelining", "synapse.pipeline.worker"])


class WorkerFailure(RuntimeError):
    """A pipeline worker failed; the message names the rank and its error.

    ``rank`` is the root-cause rank (None when unknown); ``device_failure`` says whether the
    failure is the device's or its process's (killed, hung, CUDA error, probe/XID) rather than
    an error in the code, which no restart would fix.
    """

    def __init__(self, message: str, rank: int | None = None, cause: str = "error", device_failure: bool = False):
        super().__init__(message)
        self.rank, self.cause, self.device_failure = rank, cause, device_failure


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_config(cfg: DictConfig, run_dir: Path, attempt: str = "0") -> LaunchConfig:
    trainer = cfg.trainer
    endpoint = trainer.rdzv_endpoint or f"127.0.0.1:{free_port()}"  # nodes > 1 requires an explicit one
    run_id = trainer.rdzv_id or hashlib.sha1(f"{run_dir}:{attempt}".encode()).hexdigest()[:12]
    logs = DefaultLogsSpecs(log_dir=str(run_dir / "logs" / f"launch_{attempt}"), redirects=Std.ALL, tee=Std.ALL)
    return LaunchConfig(
        min_nodes=trainer.nodes, max_nodes=trainer.nodes, nproc_per_node=len(resolve_devices(trainer)),
        run_id=run_id, rdzv_backend="c10d", rdzv_endpoint=endpoint,
        rdzv_configs={"timeout": trainer.rdzv_timeout_s, "join_timeout": trainer.rdzv_timeout_s,
                      # Node 0 hosts the c10d store; on one machine the others must not try to.
                      "is_host": trainer.node_rank == 0},
        max_restarts=0,  # failover is Synapse's decision, made by the supervisor, not a blind restart
        monitor_interval=0.1, start_method=START_METHOD, logs_specs=logs,
    )


def launch_pipeline(cfg: DictConfig, run_dir: Path, teacher_weights: str, partition: dict[str, list[int]],
                    resume: str | None, attempt: str = "0", log: Callable[[str], None] = print,
                    stage: int = 0) -> dict[str, Any]:
    """Run the pipeline to the end of this launch; return the summary of the last rank."""
    config = launch_config(cfg, run_dir, attempt)
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    log_dir = run_dir / "logs" / f"launch_{attempt}"
    failure_dir = log_dir / "failures"
    launched_at, hard_failures = time.time(), []

    def tear_down(event: dict) -> None:  # on the monitor's thread: a dead or hung rank ends the launch now
        hard_failures.append(event)
        kill_live_workers(read_heartbeats(run_dir), since=launched_at)

    gpus = resolve_devices(cfg.trainer) if resolve_accelerator(cfg.trainer) == "cuda" else ()
    try:
        with build_health_monitor(run_dir, cfg.monitor, on_hard_failure=tear_down, log=log, gpu_devices=gpus):
            results = elastic_launch(config, worker_main)(cfg_yaml, str(run_dir), teacher_weights, partition,
                                                          resume, str(failure_dir), stage)
    except ChildFailedError as exc:
        raise failure_of(failure_dir, exc, log_dir, hard_failures, read_heartbeats(run_dir)) from exc
    summaries = [r for r in results.values() if r]
    return summaries[0] if summaries else {}


# Errors a rank raises because *another* rank died: never the root cause.
_PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Read error",
              "NCCL communicator was aborted", "Socket Timeout", "timed out", "TCPStore")


def read_failures(failure_dir: Path) -> list[dict[str, Any]]:
    """The failure records workers wrote, root cause first: the earliest error that is not a
    consequence of losing a peer (then the earliest of those)."""
    records = [json.loads(p.read_text()) for p in sorted(Path(failure_dir).glob("rank_*.json"))]
    return sorted(records, key=lambda r: (any(p in r["message"] for p in _PEER_LOSS), r["time"]))


_DEVICE_ERRORS = ("CUDA error", "AcceleratorError", "NCCL error", "cudaError")


def failure_of(failure_dir: Path, exc: ChildFailedError, log_dir: Path, hard_failures: list[dict],
               beats: dict[int, dict]) -> WorkerFailure:
    """The launch's failure as a ``WorkerFailure``: message, root-cause rank, and whether a device failed."""
    message = describe_failures(failure_dir, exc, log_dir, hard_failures)
    if hard_failures:
        first = hard_failures[0]
        return WorkerFailure(message, _rank_of_event(first, beats), first["event"], device_failure=True)
    records = read_failures(failure_dir)
    signalled = {rank: f for rank, f in exc.failures.items() if f.exitcode < 0}
    if signalled and all(any(p in r["message"] for p in _PEER_LOSS) for r in records):
        rank, failure = min(signalled.items(), key=lambda item: (item[1].signal_name() != "SIGKILL", item[0]))
        return WorkerFailure(message, rank, f"killed by {failure.signal_name()}", device_failure=True)
    if not records:
        rank = min(exc.failures) if exc.failures else None
        return WorkerFailure(message, rank, "died without an error", device_failure=True)
    if all(any(p in r["message"] for p in _PEER_LOSS) for r in records):
        # Everyone who spoke only lost a peer; the agent may not have reaped the silent one yet.
        silent = sorted(set(beats) - {r["rank"] for r in records})
        if silent:
            return WorkerFailure(f"pipeline rank {silent[0]} died without a word (its peers lost it); logs in "
                                 f"{log_dir}", silent[0], "died without an error (killed)", device_failure=True)
    root = records[0]
    device = any(p in root["type"] or p in root["message"] for p in _DEVICE_ERRORS)
    return WorkerFailure(message, root["rank"], f"{root['type']}: {root['message'].splitlines()[0][:200]}",
                         device_failure=device)


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


def describe_failures(failure_dir: Path, exc: ChildFailedError, log_dir: Path,
                      hard_failures: list[dict] | None = None) -> str:
    records = read_failures(failure_dir)
    signalled = {rank: f for rank, f in exc.failures.items() if f.exitcode < 0}
    if hard_failures:  # the health monitor saw a dead or hung rank and tore the launch down
        first = hard_failures[0]
        return (f"pipeline rank {first.get('rank')} failed first: {first.get('event')} "
                f"({ {k: v for k, v in first.items() if k not in ('event', 'rank', 'time')} }); logs in {log_dir}")
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
