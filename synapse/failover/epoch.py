"""The decider's epoch: which decider of a run across nodes speaks for it now.

Node 0's launcher raises the epoch by one before it starts a decider (the first, and every restart
after a decider died) and records it in the run directory (``failover/decider_epoch.json``), on the
filesystem every node shares. Every order, report, beat and welcome on the run's store carries it:
an agent follows only the epoch it attached to and refuses an older one (a decider that was
replaced but still writes). The file also names the epoch whose workers may commit (``workers``): a
restarted decider first adopts the workers still running (their commits go on), and raises it to its
own epoch before it launches any (``admit_workers``); a worker refuses to commit a checkpoint once
that is newer than its own, so two deciders never both steer the run, nor two generations of workers
both commit. Within one epoch the file also names the launch whose workers may commit (``launch``:
its rendezvous run id, which torch gives each of its workers as ``TORCHELASTIC_RUN_ID``): the decider
names each launch before it starts it, and names none the moment it declares a node lost
(``close_commits``), so the workers of a lost node, which share their epoch with the launch that
replaces them, can never commit once the node is judged lost.

The file is whole or absent (written beside, fsynced, renamed, the folder fsynced), so the epoch
never goes back, not even across a crash of the machine: a resumed run (``resume=auto``) keeps
counting from it, and an earlier run's records, replayed, carry an epoch that is older.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from synapse.rundir import DECIDER_EPOCH, EVENTS


class EpochFileError(RuntimeError):
    """``failover/decider_epoch.json`` cannot be read; the message names the fix."""


@dataclass(frozen=True)
class DeciderEpoch:
    epoch: int  # 1 for a run's first decider; 0 means "no decider has started in this run directory"
    pid: int  # node 0's decider process of this epoch (0 until it started)
    host: str
    started: float
    # the epoch whose workers may commit checkpoints (older ones' commits are refused): the epoch of the
    # newest decider that launched workers; 0 in a file written before this field existed: ``epoch``
    workers: int = 0
    # the launch whose workers may commit (the run id of its rendezvous); "": any of ``workers``' epoch (a file
    # written before this field existed); NO_LAUNCH: none (a node was declared lost; the next launch names itself)
    launch: str = ""


NO_LAUNCH = "none: a node was declared lost and no launch has replaced it yet"


def read_epoch(run_dir: Path | str) -> DeciderEpoch:
    """The newest epoch recorded in the run directory (epoch 0 if none was)."""
    path = DECIDER_EPOCH.path(run_dir)
    try:
        data = json.loads(path.read_text())
        return DeciderEpoch(int(data["epoch"]), int(data["pid"]), str(data["host"]), float(data["started"]),
                            int(data.get("workers") or data["epoch"]), str(data.get("launch") or ""))
    except FileNotFoundError:
        return DeciderEpoch(0, 0, "", 0.0)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EpochFileError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); it holds the run's decider epoch, which only ever "
            f"grows. Fix: write {{\"epoch\": N, \"pid\": 0, \"host\": \"\", \"started\": 0}} into it with N larger "
            f"than any epoch in {EVENTS.path(run_dir)} ('decider_started' events), then rerun") from exc


def write_epoch(run_dir: Path | str, record: DeciderEpoch) -> None:
    """Record ``record`` durably: a reader sees the old epoch or the new one, never half of one."""
    path = DECIDER_EPOCH.path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = DECIDER_EPOCH.temp_path(path, secrets.token_hex(4))
    with open(temp, "w") as f:
        f.write(json.dumps(asdict(record)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)


def next_epoch(run_dir: Path | str) -> int:
    """Raise the run's epoch by one, durably, before a decider starts; the new epoch. Only node 0's
    launcher calls it, under node 0's run-directory lock, so no two raise it at once."""
    before = read_epoch(run_dir)
    epoch = before.epoch + 1
    # the workers of the decider before keep committing until the new one relaunches (it may adopt them)
    write_epoch(run_dir, DeciderEpoch(epoch, 0, socket.gethostname(), time.time(), before.workers, before.launch))
    return epoch


def record_decider(run_dir: Path | str, epoch: int, pid: int) -> None:
    """Name the process that serves as the decider of ``epoch`` (for people and tests: who to blame or kill)."""
    current = read_epoch(run_dir)
    write_epoch(run_dir, DeciderEpoch(epoch, pid, socket.gethostname(), time.time(), current.workers, current.launch))


def admit_workers(run_dir: Path | str, epoch: int, launch: str = "") -> None:
    """The decider of ``epoch`` is about to start ``launch`` (its rendezvous run id): from now on only its
    workers commit (``launch`` empty: any of ``epoch``, or newer). Called by that decider only after it has
    met the agents, long after the launcher's last write of the file for this epoch (``record_decider``,
    right after the decider's start)."""
    current = read_epoch(run_dir)
    if current.workers < epoch or current.launch != launch:
        write_epoch(run_dir, dataclasses.replace(current, workers=max(current.workers, epoch), launch=launch))


def close_commits(run_dir: Path | str, epoch: int) -> None:
    """A node was declared lost by the decider of ``epoch``: no worker commits until that decider starts the
    launch that replaces the segment (``admit_workers``). The lost node's workers may still run (its agent was
    only stalled), and the other nodes' are being torn down: none of them has a checkpoint left to give. A
    decider already replaced (one that stalled, then woke) closes nothing: the workers its successor adopted
    keep committing."""
    current = read_epoch(run_dir)
    if current.epoch == epoch and current.launch != NO_LAUNCH:
        write_epoch(run_dir, dataclasses.replace(current, launch=NO_LAUNCH))
