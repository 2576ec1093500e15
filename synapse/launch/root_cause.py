"""Which rank failed first, and why: the launch's failure judged from what the workers left behind.

When a launch fails, every rank stops, most of them only because a peer went away. The evidence
is read in this order of trust: the health monitor's hard events (a rank hung, a GPU failed, a
rank found dead), the failure records the ranks wrote for their own exceptions (a lost peer is
never a root cause), the signals the elastic agent reaped, and the ranks' progress boards (the
one busy in its own work, not the ones waiting on it). The result is a ``WorkerFailure`` naming
the root-cause rank and whether its device failed (a restart elsewhere helps) or the code did.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from synapse.checkpoint import latest_valid_checkpoint
from synapse.pipeline import WAIT_PHASES
from synapse.rundir import CHECKPOINTS, FAILURE_RECORD, FAILURES, disk_full_error, filesystem_full, read_json_record


class WorkerFailure(RuntimeError):
    """A pipeline worker failed; the message names the rank and its error.

    ``rank`` is the root-cause rank (None when unknown); ``device_failure`` says whether the
    failure is the device's or its process's (killed, hung, CUDA error, probe/XID) rather than
    an error in the code, which no restart would fix. ``lost_ranks``: every rank gone with it (a
    node lost with all its ranks; empty: only ``rank``). ``retry_same_devices``: no device can be
    blamed and nothing says the code is wrong (a stall whose culprit cannot be told, a launch failed
    by a value another process wrote on its store), so the launch is retried on the same devices
    from the newest checkpoint, within the restart budget.
    """

    def __init__(self, message: str, rank: int | None = None, cause: str = "error", device_failure: bool = False,
                 lost_ranks: tuple[int, ...] = (), retry_same_devices: bool = False):
        super().__init__(message)
        self.rank, self.cause, self.device_failure, self.lost_ranks = rank, cause, device_failure, tuple(lost_ranks)
        self.retry_same_devices = retry_same_devices


def hang_culprit(progress: dict[int, dict]) -> int | None:
    """In a stalled pipeline every rank stops; the hung one is busy in its own work, the others wait
    for it (recv, send, sync). Of the busy ones, the one busy longest; None if all of them wait
    (a hang in the network itself: no rank can be told from the others)."""
    busy = [(board["time"], rank) for rank, board in progress.items() if board["phase"] not in WAIT_PHASES]
    return min(busy)[1] if busy else None


# Errors a rank raises because *another* rank died: never the root cause.
_PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Read error",
              "NCCL communicator was aborted", "Socket Timeout", "timed out", "TCPStore")


def lost_a_peer(record: dict[str, Any]) -> bool:
    """Whether a rank's error is the loss of a peer, said by the error itself or by the one it was
    raised from (pipelining wraps a failed backward, a replica's lost gradient all-reduce with it, in
    "Failed to run stage backward"; the cause is in the chained traceback)."""
    said = record["message"] + "\n" + str(record.get("traceback", ""))
    return any(p in said for p in _PEER_LOSS)


def read_failures(failure_dir: Path) -> list[dict[str, Any]]:
    """The failure records workers wrote, root cause first: the earliest error that is not a
    consequence of losing a peer (then the earliest of those)."""
    read = [read_json_record(p) for p in sorted(Path(failure_dir).glob(FAILURE_RECORD.glob(within=FAILURES)))]
    records = [r for r in read if r is not None]  # an empty one: its writer ran out of disk
    return sorted(records, key=lambda r: (lost_a_peer(r), r["time"]))


_DEVICE_ERRORS = ("CUDA error", "AcceleratorError", "NCCL error", "cudaError")
_TRACEBACK_FRAMING = ("Traceback (most recent call last)", "The above exception", "During handling of the above")
# A worker writes a failure record for any Python exception; one that left none was killed by a
# signal Python cannot handle or crashed. (Which signal is known only when the agent reaped it
# first: the fork server reaps the workers, and the agent reports only the first exit it saw.)
SILENT_DEATH = "died without a word: killed by SIGKILL (kill -9, the OOM killer) or a crash"


def failure_of(failure_dir: Path, reaped: Mapping[int, ProcessFailure], log_dir: Path, hard_failures: list[dict],
               beats: dict[int, dict], progress: dict[int, dict] | None = None,
               killed: Collection[int] = ()) -> WorkerFailure:
    """The launch's failure as a ``WorkerFailure``: message, root-cause rank, and whether a device failed.

    ``reaped``: the failed workers the elastic agent reported (``ChildFailedError.failures``; empty when
    the agent itself failed reading them). ``progress``: the ranks' progress boards
    (``read_progress_boards``), which name the hung rank. ``killed``: the pids the launch's teardown
    signalled (their deaths are its consequence).
    """
    if filesystem_full(log_dir):  # every write fails, so no record tells the cause; no device failed
        return _disk_full_failure(log_dir)
    records = read_failures(failure_dir)
    # A rank that wrote a failure record exited because of that error: the monitor seeing its pid
    # gone afterwards is a consequence, and the records name the root cause.
    reported = {r["rank"] for r in records}
    hard = [e for e in hard_failures if not (e["event"] == "rank_dead" and _rank_of_event(e, beats) in reported)]
    if hard and hard[0]["event"] == "rank_dead":
        hard += _deaths_the_monitor_missed(hard, reaped, beats, reported, killed)
    if hard:
        signals = {rank: f.signal_name() for rank, f in reaped.items() if f.exitcode < 0}
        return _hard_failure(_first_cause(hard, reaped, beats, progress or {}), beats, progress or {}, log_dir, signals)
    message = describe_failures(failure_dir, reaped, log_dir)
    if records and all(_forming_the_group(r) for r in records):
        # Every rank that spoke failed while its process group formed, on the workers' bootstrap store, which
        # any local process can write to (docs/reliability.md, "Stores, pids and signals"): no device is to
        # blame, and a fresh launch forms the group on a fresh store.
        return WorkerFailure(f"the workers' process group did not form: {message}", None, FORMING_THE_GROUP,
                             retry_same_devices=True)
    signalled = {rank: f for rank, f in reaped.items() if f.exitcode < 0}
    if signalled and all(lost_a_peer(r) for r in records):
        rank, failure = min(signalled.items(), key=lambda item: (item[1].signal_name() != "SIGKILL", item[0]))
        return WorkerFailure(message, rank, f"killed by {failure.signal_name()}", device_failure=True)
    if not records:
        return WorkerFailure(message, min(reaped) if reaped else None, SILENT_DEATH, device_failure=True)
    if all(lost_a_peer(r) for r in records):
        # Everyone who spoke only lost a peer; the agent may not have reaped the silent one yet.
        silent = sorted(set(beats) - {r["rank"] for r in records})
        if silent:
            dead = first_death(silent, reaped, progress or {})
            return WorkerFailure(f"pipeline rank {dead} {SILENT_DEATH} (its peers lost it); logs in "
                                 f"{log_dir}", dead, SILENT_DEATH, device_failure=True)
    root = records[0]
    device_error = _device_error(root)
    cause = device_error or f"{root['type']}: {root['message']}"
    return WorkerFailure(message, root["rank"], cause.splitlines()[0][:200], device_failure=device_error is not None)


FORMING_THE_GROUP = "the process group did not form"


def _forming_the_group(record: dict[str, Any]) -> bool:
    """Whether a rank's error was raised inside ``init_process_group`` (and is no device error)."""
    return "in init_process_group" in str(record.get("traceback", "")) and _device_error(record) is None


DISK_FULL = "No space left on device"


def _disk_full_failure(log_dir: Path) -> WorkerFailure:
    run_dir = Path(log_dir).parents[1]
    message = str(disk_full_error(run_dir, newest_checkpoint(run_dir), "the workers' writes failed"))
    return WorkerFailure(message, None, DISK_FULL, device_failure=False)


def newest_checkpoint(run_dir: Path) -> Path | None:
    ref = latest_valid_checkpoint(CHECKPOINTS.path(run_dir))
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


def _first_cause(hard: list[dict], reaped: Mapping[int, ProcessFailure], beats: dict[int, dict],
                 progress: dict[int, dict]) -> dict:
    """The monitor's first hard failure, unless it is one of several deaths: ranks found dead that the
    teardown had not killed were gone before it acted, seen in one pass in rank order (no order)."""
    if hard[0]["event"] != "rank_dead":
        return hard[0]
    dead = [e for e in hard if e["event"] == "rank_dead"]
    ranks = [_rank_of_event(e, beats) for e in dead]
    return dead[ranks.index(first_death(ranks, reaped, progress))]


def _deaths_the_monitor_missed(hard: list[dict], reaped: Mapping[int, ProcessFailure], beats: dict[int, dict],
                               reported: set[int], killed: Collection[int]) -> list[dict]:
    """Ranks the agent reaped by a signal, silent and not killed by the teardown, that no hard event names.

    The monitor judges only pids it saw alive (liveness: one first seen gone is "not ours"), so a
    rank killed within a monitor period of its first heartbeat is never reported dead, while the
    peers the agent then terminates without a word are. Found by a drawn sequence (eta; rank 1
    SIGKILLed at the start of step 1 on a loaded machine): device 0 was dropped, the next segment ran
    on the killed device 1."""
    named = {_rank_of_event(e, beats) for e in hard}
    missed = [rank for rank, f in reaped.items()
              if f.exitcode < 0 and rank not in named and rank not in reported
              and (beats.get(rank) or {}).get("pid") not in killed]
    return [{"event": "rank_dead", "rank": rank, "pid": (beats.get(rank) or {}).get("pid"), "seen_by": "agent"}
            for rank in missed]


def first_death(ranks: list, reaped: Mapping[int, ProcessFailure], progress: dict[int, dict]) -> int | None:
    """Of ranks seen gone together without a word, the likely first: the one the agent reaped first if a
    signal ended it (it reaps every 0.1 s, then terminates the rest); else the first whose board shows
    its own work (one ended while waiting on a peer is most likely that peer's casualty); else the first."""
    signalled = [r for r, f in reaped.items() if f.exitcode < 0 and r in ranks]
    if signalled:
        return signalled[0]
    busy = [r for r in ranks if r in progress and progress[r]["phase"] not in WAIT_PHASES]
    return (busy or ranks)[0]


def _hard_failure(event: dict, beats: dict[int, dict], progress: dict[int, dict], log_dir: Path,
                  signals: dict[int, str]) -> WorkerFailure:
    """The health monitor saw a dead or hung rank (or a failing GPU) and tore the launch down.

    ``signals``: the signal that ended each rank the agent reaped, so that a dead rank's cause says
    how it died whether the monitor or the agent noticed it first."""
    if event["event"] == "rank_hung":
        return _hang(event, progress, log_dir)
    rank = _rank_of_event(event, beats)
    details = {k: v for k, v in event.items() if k not in ("event", "rank", "time")}
    message = f"pipeline rank {rank} failed first: {event['event']} ({details}); logs in {log_dir}"
    cause = event["event"]
    if cause == "rank_dead":
        cause = f"killed by {signals[rank]}" if rank in signals else f"rank_dead: {SILENT_DEATH}"
    return WorkerFailure(message, rank, cause, device_failure=True)


def _hang(event: dict, progress: dict[int, dict], log_dir: Path) -> WorkerFailure:
    """The pipeline stalled. Its culprit is a rank found stopped, else the one busy in its own work
    while the others wait (``hang_culprit``). When every rank waits on a peer the culprit cannot be
    told: the failure names no rank, so no device is dropped (dropping the first rank judged hung
    dropped a healthy device 0 in 3 of 8 stalls of rank 2: issue #33)."""
    stalled = (f"no progress for {event.get('stalled_s')} s "
               f"(monitor.hang_timeout_s={event.get('hang_timeout_s')})")
    stopped = event.get("stopped_ranks") or []
    if stopped:
        culprit = stopped[0]
        message = f"pipeline rank {culprit} was found stopped (SIGSTOP or a debugger) with the pipeline hung: {stalled}"
    else:
        found = hang_culprit(progress)
        if found is None:
            phases = {rank: board["phase"] for rank, board in sorted(progress.items())}
            return WorkerFailure(f"the pipeline hung ({stalled}) and no rank can be told as the cause: every rank "
                                 f"waited on a peer ({phases or 'no progress boards'}), so no device is dropped "
                                 f"and the launch is retried on the same devices; logs in {log_dir}", None,
                                 "rank_hung", device_failure=True, retry_same_devices=True)
        culprit = found
        board = progress[culprit]
        message = f"pipeline rank {culprit} hung in {board['phase']} of step {board['step']}: {stalled}"
    waiting = sorted(r for r, b in progress.items() if b["phase"] in WAIT_PHASES and r != culprit)
    return WorkerFailure(f"{message}, while rank(s) {waiting} waited on it; logs in {log_dir}", culprit, "rank_hung",
                         device_failure=True)


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


def describe_failures(failure_dir: Path, reaped: Mapping[int, ProcessFailure], log_dir: Path) -> str:
    """A worker failure the workers themselves reported (or died without reporting)."""
    records = read_failures(failure_dir)
    signalled = {rank: f for rank, f in reaped.items() if f.exitcode < 0}
    if signalled and all(lost_a_peer(r) for r in records):
        # A rank killed by a signal writes no record; the others only report losing it.
        rank, failure = min(signalled.items(), key=lambda item: (item[1].signal_name() != "SIGKILL", item[0]))
        return (f"pipeline rank {rank} failed first: killed by signal {failure.signal_name()}; the other ranks "
                f"lost their peer; logs in {log_dir}")
    if not records:  # killed without a word (SIGKILL, OOM): only the agent saw it
        lines = [f"pipeline worker(s) died without reporting an error; logs in {log_dir}"]
        for rank, failure in sorted(reaped.items()):
            lines.append(f"  rank {rank}: exit code {failure.exitcode}"
                         + (f" (signal {failure.signal_name()})" if failure.exitcode < 0 else ""))
        return "\n".join(lines)
    root = records[0]
    lines = [f"pipeline rank {root['rank']} failed first: {root['type']}: {root['message']}; logs in {log_dir}",
             root["traceback"].rstrip()]
    for other in records[1:]:
        lines.append(f"  then rank {other['rank']}: {other['type']}: {other['message'].splitlines()[0][:200]}")
    return "\n".join(lines)
