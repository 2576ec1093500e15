"""The code each of the K worker processes runs, started by torch.distributed's elastic agent.

The elastic agent sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the worker
joins the process group (NCCL on GPUs, gloo on CPU) with a collective timeout, so a dead or
hung peer fails the launch instead of hanging it, and trains its stage. What it trains comes in
one piece, a ``LaunchTask``: the segment's typed config, its placement and micro-batch count.
"""
from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from synapse.config import SynapseConfig, cuda_index, resolve_devices
from synapse.engine import build_compute_setup, with_host_data_path
from synapse.health import probe_devices
from synapse.partitioning import Placement
from synapse.pipeline.quorum import ReplicaGroupSpec, respawn_store, respawned, sampler_state_at
from synapse.pipeline.trainer import build_pipeline_trainer
from synapse.rundir import FAILURE_RECORD, JsonlWriter, hold_as_worker


@dataclasses.dataclass(frozen=True)
class LaunchTask:
    """What every worker of one launch is given, once and in one piece (pickled to it by the elastic
    launcher): the segment's config, where the blocks go and how many micro-batches a step is cut
    into (the run's plan), which teacher to load and which checkpoint to resume from."""

    config: SynapseConfig
    placement: Placement
    microbatches: int
    segment: int
    teacher_weights: str
    resume: str | None = None
    # failover.replica_engine=torchft: this launch is one replica of the run (``placement`` is its pipeline)
    replica_group: ReplicaGroupSpec | None = None


@record
def worker_main(task: LaunchTask, run_dir: str, failure_dir: str) -> dict[str, Any] | None:
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the supervisor's to handle
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # and so is its hangup (closed): a checkpoint, not a death
        die_with_the_supervisor()
        hold_as_worker(Path(run_dir), task.config.trainer.node_rank)
        return _train_launch(task, Path(run_dir))
    except BaseException as exc:
        # The elastic agent may tear this rank down before it reports; a file per failing
        # rank, with a precise time, lets the supervisor name the root cause.
        write_failure(Path(failure_dir), int(os.environ.get("RANK", -1)), exc)
        raise


def die_with_the_supervisor() -> None:
    """End this worker the moment the supervisor dies (kill -9 of train.py, the OOM killer).

    The supervisor is the fork server's parent. The fork server does not exit when it dies (every
    worker holds the server's "alive" pipe open), so the kernel's parent-death signal would not
    fire; instead a thread waits on a pidfd of the supervisor and SIGKILLs this process when it
    becomes readable (the supervisor exited). No worker trains on, writing checkpoints and records
    into a run directory a resumed run may already be using."""
    supervisor = _parent_of(os.getppid())
    if not supervisor:
        raise SupervisorGoneError(f"worker pid {os.getpid()}: the supervisor died before this worker started")
    try:
        handle = os.pidfd_open(supervisor)
    except ProcessLookupError:
        raise SupervisorGoneError(f"worker pid {os.getpid()}: supervisor pid {supervisor} is gone") from None
    except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): poll the pid instead
        handle = None
    threading.Thread(target=_end_with, args=(supervisor, handle), name="synapse-lifeline", daemon=True).start()


def _end_with(supervisor: int, handle: int | None) -> None:
    if handle is not None:
        select.select([handle], [], [])  # readable once the supervisor has exited
    else:
        while _parent_of(os.getppid()) == supervisor:
            time.sleep(0.5)
    print(f"worker pid {os.getpid()}: supervisor pid {supervisor} died; this worker ends with it", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class SupervisorGoneError(RuntimeError):
    """The supervisor that started this worker is gone."""


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return 0 if parent <= 1 else parent


def write_failure(failure_dir: Path, rank: int, exc: BaseException) -> None:
    """This rank's failure record; best effort (on a full disk it cannot be written, and the
    partial temporary is removed: the supervisor then judges the launch by the disk's free space)."""
    record = {"rank": rank, "time": time.time(), "type": type(exc).__name__, "message": str(exc),
              "traceback": "".join(traceback.format_exception(exc))}
    path = failure_dir / FAILURE_RECORD.name(rank=rank)
    tmp = FAILURE_RECORD.temp_path(path, os.getpid())  # renamed whole: a rank killed mid-write leaves no torn record
    try:
        failure_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _train_launch(task: LaunchTask, run_dir: Path) -> dict[str, Any] | None:
    started = time.time()
    # The process that launched the workers draws the run's one bar, from their records.
    cfg = dataclasses.replace(task.config, trainer=dataclasses.replace(task.config.trainer, progress=False))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device_id = resolve_devices(cfg.trainer)[local_rank]
    setup = build_compute_setup(cfg.trainer, device_id=device_id, local_processes=local_world)
    backend = "nccl" if setup.wire.type == "cuda" else "gloo"  # ranks sharing a GPU: gloo through host memory
    if cfg.trainer.nodes == 1:
        listen_on_loopback_only()
    timeout = timedelta(seconds=cfg.trainer.collective_timeout_s)
    dist.init_process_group(backend, timeout=timeout, **respawn_store(timeout))
    log = _worker_logger()
    node_ranks = range(rank - local_rank, rank - local_rank + local_world)  # elastic numbers a node's ranks together
    readers = sum(task.placement.stage_of(r) == 0 for r in node_ranks)  # each replica's first stage reads images
    cfg, data_path = with_host_data_path(cfg, setup.device, local_ranks=local_world, local_readers=readers)
    if local_rank == 0 and (task.config.data.num_workers == "auto" or task.config.data.decode == "auto"):
        log(f"data: {data_path.reason}")
    trainer = None
    try:
        trainer = build_pipeline_trainer(cfg, run_dir, rank, world, task.placement, task.teacher_weights, setup, log,
                                         segment=task.segment, microbatches=task.microbatches,
                                         replica_group=task.replica_group)
        built = time.time()
        if task.resume:
            trainer.load_checkpoint(Path(task.resume))
        quorum = trainer.runner.quorum
        if quorum is not None:
            quorum.align_step(trainer.step)
        dist.barrier()  # "ready" means every rank is ready
        # the supervisor splits a restart's cost into launch, load and warm-up with this (a replica's respawn
        # under torchft is no restart of the run)
        if rank == 0 and (task.replica_group is None or (task.replica_group.replica == 0 and not respawned())):
            trainer.events.append("launch_ready", segment=task.segment, step=trainer.step, process_started=started,
                                  build_s=built - started, checkpoint_load_s=time.time() - built)
        if cfg.trainer.start_probe and task.replica_group is None:  # under torchft each replica is a launch: its
            # readings would be of one replica's ranks only
            physical = [cuda_index(cfg.trainer, d) for d in resolve_devices(cfg.trainer)]  # ranks sharing a GPU
            start_probe(trainer, setup.device, local_rank, physical, task.segment)
        if quorum is not None:  # the first step's quorum: a replica behind the others heals from a peer
            healed = quorum.join(trainer.step, started)
            if healed != trainer.step:
                trainer.step = healed
                trainer.sampler.load_state_dict(sampler_state_at(trainer.sampler, healed))
        summary = trainer.fit()
        trainer.runner.heartbeat.beat(trainer.step, phase="finished")  # a normal exit is not a death
        return summary if trainer.writes_records else None
    finally:
        if trainer is not None:
            trainer.injector.close()  # stop background loads, record fault_cleared
            if trainer.runner.quorum is not None:
                trainer.runner.quorum.shutdown()
        dist.destroy_process_group()


def start_probe(trainer: Any, device: Any, local_rank: int, node_devices: list[int], segment: int) -> None:
    """Every rank times the same fixed work before the launch's first step (`synapse.health.speed_probe`),
    slowed as the injected compute slowdowns of that step slow a task; the readings reach the
    supervisor's detector with the launch's first performance record (its start check)."""
    step = trainer.step + 1
    readings, cost_s = probe_devices(device, local_rank, node_devices,
                                     lambda work_s: trainer.injector.slow_probe(step, work_s),
                                     group=trainer.runner.control_group)
    if trainer.runner.rank == 0:
        trainer.events.append("start_probe", segment=segment, step=step, probe_s=readings, cost_s=cost_s)
    trainer.runner.performance = FirstRecordWith(trainer.runner.performance, {"probe_s": readings})


class FirstRecordWith(JsonlWriter):
    """A launch's performance records, its first with ``fields`` added (the start probe's readings)."""

    def __init__(self, records: JsonlWriter, fields: dict[str, Any]) -> None:  # opens no file of its own
        self._records, self._fields = records, dict(fields)

    def write(self, record: dict[str, Any]) -> None:
        record, self._fields = {**record, **self._fields}, {}
        self._records.write(record)

    def close(self) -> None:
        self._records.close()


def listen_on_loopback_only() -> None:
    """One node: gloo's and NCCL's own listening sockets on the loopback interface, not on the
    address the host name resolves to (reachable from other hosts). A user's setting is kept."""
    loopback = [name for _, name in socket.if_nameindex() if name in ("lo", "lo0")]
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback[0])
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback[0])


def _worker_logger():
    """Lines to this rank's stdout log file (the launcher names the rank where it shows them on the console)."""
    def log(message: str) -> None:
        print(message, file=sys.stdout, flush=True)

    return log
