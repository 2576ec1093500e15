"""Who is dead, who is hung: judged from the workers' heartbeat files, with no collective.

A rank is *dead* when the pid in its heartbeat is gone (or a zombie not yet reaped), and
*hung* when its pid is alive but its progress, the (step, phase) pair of its heartbeat, has
not changed for ``hang_timeout_s``. A heartbeat with phase ``finished`` is a rank that
ended normally: its pid going away is not a death. Heartbeats written before ``since``
(an earlier launch of the same run) are ignored.

Only workers of this supervisor's launch are judged or signalled: a heartbeat file is plain data
in the run directory, and a pid planted there (a hostile or stale file naming an unrelated
process, or one of the supervisor's own helpers) must never be hung-reported or killed. "A worker
of this launch" is checked in /proc (``is_launch_worker``): a child of the fork server, itself a
child of the supervisor, started after the launch began.

Each problem is reported once: ``rank_dead`` once per pid, ``rank_hung`` once per
(pid, step, phase), so a rank that recovers and hangs again later is reported again.

The records: each worker says who it is (pid) and how far it got (step), atomically:
``<run_dir>/live/rank_<r>.json`` is rewritten (temp file + rename) at start-up and after
every step, so the supervisor's watchdog can tell a dead process (pid gone) from a hung one
(pid alive, step not advancing) without any collective.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse.rundir import HEARTBEAT

FINISHED_PHASE = "finished"
NOT_OURS = "not ours"  # the state of a heartbeat whose pid is no worker of this launch


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not: it has exited, unreaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no procfs (not Linux): os.kill said it exists
    return state not in ("Z", "X")


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger): alive, and frozen where it stands."""
    fields = _stat(pid)
    return fields is not None and fields[0] in ("T", "t")


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the 3rd (state) on (the name before them may hold spaces); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None  # field 4: the parent's pid


def started_at(pid: int) -> float | None:
    """When ``pid`` started, in wall-clock seconds: /proc gives its start in clock ticks after boot, and
    /proc/uptime how long ago boot was (both to 10 ms). None if it is gone or there is no procfs."""
    fields = _stat(pid)
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        ticks = int(fields[19]) if fields else None  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None
    return None if ticks is None else time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


# How much earlier than the launch a worker's start may read: /proc's 10 ms ticks, and the launch's
# time taken just before torch's agent starts forking.
START_SLACK_S = 0.5


def is_launch_worker(pid: int, since: float | None = None, supervisor: int | None = None) -> bool:
    """Whether ``pid`` is a worker that a launch of ``supervisor`` (default: this process) started at or
    after ``since``, judged from /proc alone, never from what a file says.

    The launcher forks its workers from the fork server, a child of the supervisor (launch/elastic.py,
    ``START_METHOD``), so a worker is a grandchild of the supervisor through one of its children, and
    it started after its launch did. That leaves out the supervisor itself and its own children (the
    fork server, multiprocessing's resource tracker), which are alive and the supervisor's, but no
    worker: a heartbeat naming them must neither be judged hung nor get them killed. A worker of an
    earlier launch, or an unrelated process, is left out too. False where /proc cannot be read."""
    supervisor = os.getpid() if supervisor is None else supervisor
    parent = parent_of(pid)
    if parent is None or parent in (supervisor, pid) or pid == supervisor or parent_of(parent) != supervisor:
        return False
    if since is None:
        return True
    start = started_at(pid)
    return start is not None and start >= since - START_SLACK_S


def signal_launch_worker(pid: int, signum: int, since: float | None = None) -> bool:
    """Send ``signum`` to ``pid`` only if it is a worker of a launch of this process started at or after
    ``since`` (``is_launch_worker``); True if sent.

    A pidfd pins the process while it is checked, so a pid reused in between gets nothing (the signal
    goes to the exited process and fails)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux): check, then signal
        fd = None
    try:
        if not is_launch_worker(pid, since):
            return False
        if fd is None:
            os.kill(pid, signum)
        else:
            signal.pidfd_send_signal(fd, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


@dataclass
class _RankProgress:
    pid: int
    step: int
    phase: str
    since: float  # wall time at which this (step, phase) was first written


class LivenessTracker:
    """Turns successive heartbeat snapshots into per-rank status and new events."""

    def __init__(self, hang_timeout_s: float, since: float | None = None,
                 is_alive: Callable[[int], bool] = pid_alive, is_ours: Callable[[int], bool] = lambda pid: True,
                 is_stopped: Callable[[int], bool] = is_stopped):
        """``is_ours``: whether a pid is a worker of this launch (``is_launch_worker``), asked when a pid is
        first seen; a pid that is not (a planted or stale heartbeat: someone else's process, one of the
        supervisor's helpers, or one already gone when first seen) is reported as ``not ours`` and never
        judged hung or dead."""
        if hang_timeout_s <= 0:
            raise ValueError(f"hang_timeout_s={hang_timeout_s} must be > 0 (seconds without progress)")
        self.hang_timeout_s = hang_timeout_s
        self.since = since
        self._is_alive, self._is_ours, self._is_stopped = is_alive, is_ours, is_stopped
        self._trusted: set[int] = set()
        self._progress: dict[int, _RankProgress] = {}
        self._reported: set[tuple] = set()

    def update(self, beats: Mapping[int, Mapping[str, Any]], now: float | None = None
               ) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
        """(status per rank, events new since the last update) for one heartbeat snapshot."""
        now = time.time() if now is None else now
        status, events = {}, []
        for rank, beat in sorted(beats.items()):
            if self.since is not None and beat.get("time", 0.0) < self.since:
                continue  # left by an earlier launch
            if not written_here(beat):  # another node's rank: its pid means nothing here
                status[rank] = {"pid": int(beat["pid"]), "step": int(beat["step"]), "phase": str(beat.get("phase", "")),
                                "host": beat.get("host"), "state": NOT_OURS}
                continue
            progress = self._track(rank, beat, now)
            rank_status, event = self._judge(rank, progress, now)
            status[rank] = rank_status
            if event is not None:
                events.append(event)
        # Every rank of a stalled pipeline stops progressing at once, so the first rank judged hung is
        # as likely a healthy one waiting on its peer. A stopped process is no guess: name it.
        stopped = sorted(rank for rank, s in status.items() if s.get("stopped"))
        for event in events:
            if event["event"] == "rank_hung":
                event["stopped_ranks"] = stopped
        return status, events

    def _track(self, rank: int, beat: Mapping[str, Any], now: float) -> _RankProgress:
        pid, step, phase = int(beat["pid"]), int(beat["step"]), str(beat.get("phase", ""))
        last = self._progress.get(rank)
        if last is None or (last.pid, last.step, last.phase) != (pid, step, phase):
            written = float(beat.get("time", now))
            last = self._progress[rank] = _RankProgress(pid, step, phase, min(written, now))
        return last

    def _judge(self, rank: int, p: _RankProgress, now: float) -> tuple[dict[str, Any], dict[str, Any] | None]:
        stalled = now - p.since
        status = {"pid": p.pid, "step": p.step, "phase": p.phase, "stalled_s": round(stalled, 3)}
        if p.phase == FINISHED_PHASE:
            return {**status, "state": "finished"}, None
        alive = self._is_alive(p.pid)
        if p.pid not in self._trusted:  # judged once per pid: a live process this supervisor started
            if not self._is_ours(p.pid):
                # Alive and someone else's, or already gone and never seen as ours (a planted or stale
                # file): neither killed nor reported, so it cannot tear a healthy launch down.
                return {**status, "state": NOT_OURS}, None
            self._trusted.add(p.pid)
        if not alive:
            return {**status, "state": "dead"}, self._once(("dead", p.pid), {
                "event": "rank_dead", "rank": rank, "pid": p.pid, "step": p.step, "phase": p.phase})
        if stalled >= self.hang_timeout_s:
            status["stopped"] = self._is_stopped(p.pid)
            return {**status, "state": "hung"}, self._once(("hung", p.pid, p.step, p.phase), {
                "event": "rank_hung", "rank": rank, "pid": p.pid, "step": p.step, "phase": p.phase,
                "stalled_s": round(stalled, 3), "hang_timeout_s": self.hang_timeout_s})
        return {**status, "state": "alive"}, None

    def _once(self, key: tuple, event: dict[str, Any]) -> dict[str, Any] | None:
        if key in self._reported:
            return None
        self._reported.add(key)
        return event


def kill_live_workers(beats: Mapping[int, Mapping[str, Any]], since: float | None = None,
                      signum: int = 9) -> list[int]:
    """Send ``signum`` (default SIGKILL) to every live worker pid of these heartbeats (written at or
    after ``since``) that a launch of this process started at or after ``since``; the elastic agent
    then sees its workers fail and the launch ends at once. The supervisor's teardown after a hard
    failure; returns the pids signalled. A pid of another origin is left alone, whatever the file says."""
    signalled = []
    for beat in beats.values():
        pid = int(beat["pid"])
        if written_here(beat) and (since is None or beat.get("time", 0.0) >= since) and pid_alive(pid) \
                and signal_launch_worker(pid, signum, since):
            signalled.append(pid)
    return signalled


def _host_id() -> str:
    """This machine, container included: its host name and boot id. A pid names a process only on
    the host that wrote it (pids repeat across nodes, and across containers of one host)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


HOST_ID = _host_id()


def written_here(beat: Mapping[str, Any]) -> bool:
    """Whether a heartbeat was written on this host (one without a host: by a version before hosts)."""
    return beat.get("host", HOST_ID) == HOST_ID


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return HEARTBEAT.path(run_dir, rank=rank)


class Heartbeat:
    def __init__(self, run_dir: Path, rank: int, device: str):
        self.path = heartbeat_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.device = rank, device
        self.beat(step=0, phase="starting")

    def beat(self, step: int, phase: str = "training") -> None:
        record = {"rank": self.rank, "pid": os.getpid(), "host": HOST_ID, "device": self.device, "step": step,
                  "phase": phase, "time": time.time()}
        tmp = HEARTBEAT.temp_path(self.path, os.getpid())
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)


def read_heartbeats(run_dir: Path) -> dict[int, dict[str, Any]]:
    beats = {}
    for path in sorted(Path(run_dir).glob(HEARTBEAT.glob())):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now: the next read sees it
        if is_heartbeat(record):  # anything else (damaged, or planted) is not a worker's: ignored
            beats[record["rank"]] = record
    return beats


def is_heartbeat(record: Any) -> bool:
    """Whether ``record`` has the shape ``Heartbeat.beat`` writes (the fields the monitor reads)."""
    def whole(value: Any, minimum: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

    return (isinstance(record, dict) and whole(record.get("rank"), 0) and whole(record.get("pid"), 1)
            and whole(record.get("step"), 0) and isinstance(record.get("phase", ""), str)
            and isinstance(record.get("host", ""), str)
            and isinstance(record.get("time", 0.0), (int, float)) and not isinstance(record.get("time"), bool))
