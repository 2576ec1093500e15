"""Where each worker's output is, and the last lines of a failed one.

torch's elastic agent writes every local rank's stdout and stderr under
``<run dir>/logs/launch_<n>/<rendezvous id>_<random>/attempt_0/<local rank>/``; only the ranks of
``trainer.local_ranks_filter`` are shown on the console as well. When a rank fails, its last
lines are what a user needs to see, whether or not it was one of the ranks shown.
"""
from __future__ import annotations

from collections import deque
from pathlib import Path

from synapse.rundir import LAUNCH_LOGS, WORKER_RANK_LOGS, WORKER_STDERR, WORKER_STDOUT

TAIL_LINES = 15


def rank_log_files(log_dir: Path, local_rank: int) -> list[Path]:
    """stdout.log and stderr.log of ``local_rank`` in the newest agent folder of this launch
    (a launch retried on another port has two), those that exist."""
    folders = sorted(Path(log_dir).glob(WORKER_RANK_LOGS.glob(within=LAUNCH_LOGS, local_rank=int(local_rank))),
                     key=lambda p: p.stat().st_mtime)
    if not folders:
        return []
    return [f for f in (folders[-1] / WORKER_STDOUT.name(), folders[-1] / WORKER_STDERR.name()) if f.is_file()]


def last_lines(path: Path, count: int = TAIL_LINES) -> list[str]:
    """The last ``count`` non-empty lines of a text file (torn or undecodable bytes replaced)."""
    with open(path, errors="replace") as f:
        return list(deque((line.rstrip("\n") for line in f if line.strip()), maxlen=count))


def failed_rank_tail(log_dir: Path, local_rank: int | None, count: int = TAIL_LINES) -> str | None:
    """The failed rank's last lines, per file, for the console; None when it left none."""
    if local_rank is None:
        return None
    sections = []
    for path in rank_log_files(log_dir, local_rank):
        lines = last_lines(path, count)
        if lines:
            sections.append(f"--- last {len(lines)} line(s) of rank {local_rank}'s {path.name} ({path}):\n"
                            + "\n".join(f"  {line}" for line in lines))
    return "\n".join(sections) or None
