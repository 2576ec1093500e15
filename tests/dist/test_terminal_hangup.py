"""Issue #33, item 14: a closed terminal (SIGHUP) stops the run like SIGTERM, with a checkpoint.

The run is started as from an interactive shell: ``python train.py`` is the session leader of a
real pseudo-terminal, its controlling terminal. Closing a terminal does two things, both done here:
the shell forwards SIGHUP to every process of its job (``killpg``), and the terminal itself hangs up
(the pty's master side is closed: the kernel sends SIGHUP, then SIGCONT, to the session leader).
So the supervisor hears SIGHUP twice, and the workers, the fork server and multiprocessing's
resource tracker once each. A row of docs/reliability.md ("Stores, pids and signals") names this test.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import threading

import pytest

from synapse import checkpoint as ckpt
from synapse.failover import read_segments
from synapse.rundir import LOG
from tests.conftest import repo_env

# no_leftover_processes is autouse: nothing the test started outlives it
from .test_reliability import (
    REPO_ROOT,
    STEPS,
    no_leftover_processes,  # noqa: F401
    overrides_for,
    steps_done,
    wait_until,
)

pytestmark = [pytest.mark.dist, pytest.mark.extended]


class Terminal:
    """A pseudo-terminal whose screen is read on a thread (a full pty buffer would block the run)."""

    def __init__(self):
        self.master, self.slave = pty.openpty()
        self.screen = bytearray()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:  # the slave side closed (every process of the job exited)
                    return

    def start(self, args: list[str]) -> subprocess.Popen:
        """``python train.py`` as the session leader with this terminal as its controlling terminal."""
        proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "train.py"), *args], cwd=REPO_ROOT, env=repo_env(),
                                stdin=self.slave, stdout=self.slave, stderr=self.slave, start_new_session=True,
                                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(self.slave)  # the job holds it now; the terminal hangs up only through the master
        return proc

    def close(self) -> None:
        """The terminal window goes away: its master side closes, the kernel hangs the session up."""
        self._closed.set()
        self._reader.join(5)
        os.close(self.master)


@pytest.mark.timeout(300)
def test_a_closed_terminal_stops_the_run_with_a_checkpoint_like_sigterm(tmp_path, teacher_file):
    run_dir = tmp_path / "run"
    args = [*overrides_for(run_dir, teacher_file, "policy=keep", "checkpoint.every=100",  # no periodic checkpoint
                           "injection.faults=[{kind:slow_compute,rank:0,start:3,seconds:0.1}]"),
            f"hydra.run.dir={run_dir}"]
    terminal = Terminal()
    proc = terminal.start(args)
    try:
        wait_until(lambda: steps_done(run_dir) >= 3, proc, 240, "step 3")
        os.killpg(proc.pid, signal.SIGHUP)  # the shell passes the hangup on to its job
        terminal.close()  # and the terminal itself hangs up: the session leader hears it again
        assert proc.wait(120) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    log = LOG.path(run_dir).read_text()  # the console is gone with the terminal; the log file stays
    (segment,) = read_segments(run_dir)
    assert segment.outcome == "interrupted" and segment.end_step is not None, (segment, log[-3000:])
    assert 3 <= segment.end_step < STEPS
    saved = [r.step for r in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert saved == [segment.end_step], "the hangup wrote a checkpoint of the last finished step"
    assert "supervisor: SIGHUP: stopping after the current step with a checkpoint" in log, log[-3000:]
