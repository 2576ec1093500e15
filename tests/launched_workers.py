"""Stand-in workers in the shape a launch builds them, for tests of the supervisor's health monitor
and teardown: the test process plays the supervisor, a child plays the launcher's fork server, and
the fork server's children are the workers. The monitor judges, and the teardown signals, only such
grandchildren (health/liveness.py, ``is_launch_worker``), so a plain child of the test would be
ignored as "not ours". Their exit statuses go to their parent, which passes them back on request."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

FORK_SERVER = """
import subprocess, sys
workers = []
for line in sys.stdin:  # "start": one more worker, its pid back; "wait <i>": worker i's exit status back
    command, *index = line.split()
    if command == "start":
        workers.append(subprocess.Popen(["sleep", "120"]))
        print(workers[-1].pid, flush=True)
    else:
        print(workers[int(index[0])].wait(10), flush=True)
"""


class LaunchedWorkers:
    """``sleep`` processes started as a launch starts its workers; ``pids[i]`` is worker i's pid."""

    def __init__(self, fork_server: subprocess.Popen):
        self._server = fork_server
        self.pids: list[int] = []
        self.reaped: set[int] = set()  # indices: their pids may belong to someone else by now

    def _ask(self, command: str) -> int:
        assert self._server.stdin is not None and self._server.stdout is not None
        self._server.stdin.write(command + "\n")
        self._server.stdin.flush()
        return int(self._server.stdout.readline())

    def start(self) -> int:
        """One more worker; its pid."""
        self.pids.append(self._ask("start"))
        return self.pids[-1]

    def signal(self, index: int, signum: int = signal.SIGKILL) -> None:
        os.kill(self.pids[index], signum)

    def wait(self, index: int) -> int:
        """Worker ``index``'s exit status as its parent reaps it (-N: killed by signal N)."""
        status = self._ask(f"wait {index}")
        self.reaped.add(index)
        return status


@contextlib.contextmanager
def launched_workers(count: int = 0) -> Iterator[LaunchedWorkers]:
    """``count`` workers started now (more with ``start``); all killed with their fork server at the end."""
    server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    workers = LaunchedWorkers(server)
    try:
        for _ in range(count):
            workers.start()
        yield workers
    finally:
        for pid in [pid for i, pid in enumerate(workers.pids) if i not in workers.reaped]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.kill()
        server.wait(10)
        for stream in (server.stdin, server.stdout):
            if stream is not None:
                stream.close()
