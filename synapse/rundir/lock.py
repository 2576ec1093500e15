"""One run per run directory: the supervisor and its workers hold locks on it.

Two supervisors in one directory (two ``python train.py`` with the same ``hydra.run.dir``, or a
``resume=auto`` while the first run, or workers it left behind, still train) would write the same
checkpoints and records and corrupt each other. So:

* the supervisor holds ``.synapse.lock`` exclusively for its whole run (its pid is written in it);
* every worker holds ``.synapse.workers.lock`` shared, for its whole life.

A new supervisor takes the first without waiting and probes the second; either held means the
directory is in use, and it is refused before it writes anything, naming the holder and the fix.
Locks are ``flock``s: the kernel drops them when their holder dies (SIGKILL included), so a
crashed run never leaves a stale lock behind. One lock pair per node (several nodes may share a
run directory on a shared filesystem).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from synapse.rundir.layout import HEARTBEAT, NODE_SUPERVISOR_LOCK, NODE_WORKERS_LOCK, SUPERVISOR_LOCK, WORKERS_LOCK


class RunDirInUseError(RuntimeError):
    """Another supervisor, or workers of one, hold the run directory."""


class RunDirUnusableError(ValueError):
    """The run directory cannot be created or written (a file in the way, read-only)."""


def lock_paths(run_dir: Path, node_rank: int = 0) -> tuple[Path, Path]:
    """(supervisor lock, workers lock) of one node of a run directory."""
    if node_rank == 0:
        return SUPERVISOR_LOCK.path(run_dir), WORKERS_LOCK.path(run_dir)
    return NODE_SUPERVISOR_LOCK.path(run_dir, node=node_rank), NODE_WORKERS_LOCK.path(run_dir, node=node_rank)


def _try_flock(handle: IO, mode: int) -> bool:
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


# (run directory, node rank) -> how many holds of it this process has open. Taken first by the
# process's entry (before Hydra writes .hydra/ and train.log into it), then again by the run itself:
# a second flock from the same process would conflict with the first, so a nested hold only counts.
_HELD: dict[tuple[Path, int], int] = {}


@contextlib.contextmanager
def hold_run_dir(run_dir: Path, node_rank: int = 0) -> Iterator[None]:
    """Hold the run directory for this supervisor; ``RunDirInUseError`` if another run holds it.
    Re-entrant within a process: a hold inside a hold of the same directory is the outer one's."""
    key = (Path(run_dir).resolve(), node_rank)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    supervisor_lock, workers_lock = lock_paths(run_dir, node_rank)
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        handle = open(supervisor_lock, "a+")
    except OSError as exc:  # a file in the way, a read-only or foreign directory
        raise RunDirUnusableError(
            f"run directory {run_dir} cannot be used: {exc.strerror or exc} ({exc.filename or run_dir}). Fix: give a "
            f"writable directory (hydra.run.dir=... / run_dir=...), or remove what is in the way") from exc
    try:
        if not _try_flock(handle, fcntl.LOCK_EX):
            holder = _holder(supervisor_lock)
            pid = holder.get("pid", "?")
            raise RunDirInUseError(
                f"run directory {run_dir} is in use: another Synapse supervisor (pid {pid}, started "
                f"{holder.get('started', '?')}) holds {supervisor_lock}. Fix: wait for that run to end, or stop it "
                f"(kill {pid}: its workers end with it) and then continue it with resume=auto; or give this run "
                f"another directory (hydra.run.dir=... / run_dir=...)")
        _refuse_if_workers_left(run_dir, workers_lock)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]
    finally:
        handle.close()  # closing drops the flock


def _refuse_if_workers_left(run_dir: Path, workers_lock: Path) -> None:
    with open(workers_lock, "a+") as probe:
        if _try_flock(probe, fcntl.LOCK_EX):
            return  # released when the probe closes: no worker of an earlier run is alive
    pids = sorted(_worker_pids(run_dir))
    raise RunDirInUseError(
        f"run directory {run_dir} is in use: workers of an earlier run still hold {workers_lock} (pids "
        f"{pids or 'unknown'}, from {HEARTBEAT.glob()}) though no supervisor does. Fix: end them (kill "
        f"{' '.join(map(str, pids)) or '<their pids>'}), then continue with resume=auto; or give this run another "
        f"directory")


def _worker_pids(run_dir: Path) -> set[int]:
    pids = set()
    for path in Path(run_dir).glob(HEARTBEAT.glob()):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            pids.add(int(json.loads(path.read_text())["pid"]))
    return pids


_WORKER_HANDLES: list[IO] = []  # held for the life of the worker process


def hold_as_worker(run_dir: Path, node_rank: int = 0, attempts: int = 50) -> None:
    """Mark this worker process as holding ``run_dir`` until it exits (shared: all the run's workers).

    A starting supervisor probes the lock for a moment; the worker retries through that."""
    handle = open(lock_paths(run_dir, node_rank)[1], "a+")
    for _ in range(attempts):
        if _try_flock(handle, fcntl.LOCK_SH):
            _WORKER_HANDLES.append(handle)
            return
        time.sleep(0.02)
    handle.close()
    raise RunDirInUseError(f"worker pid {os.getpid()} could not share {lock_paths(run_dir, node_rank)[1]}: "
                           f"another supervisor holds it exclusively")
