"""Files in the run directory that a worker did not write (planted, stale or damaged): the
supervisor's health monitor must neither crash on them nor act on them. Rows "H::" of
docs/reliability.md.

Real files and a real ``HealthMonitor`` (its sampling pass, as its thread runs it); the pids are
real processes.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synapse.health import HealthMonitor, HealthSettings, heartbeat_path

SETTINGS = HealthSettings(nvml=False, probe=False, period_s=0.1, hang_timeout_s=1.0)


def plant(run_dir: Path, rank: int, content: str) -> None:
    path = heartbeat_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def sample(run_dir: Path, hard: list) -> dict:
    monitor = HealthMonitor(run_dir, SETTINGS, on_hard_failure=hard.append, log=lambda line: None)
    return monitor.sample_once()


def gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("content", [
    "{}", "[]", '"beat"', json.dumps({"rank": 9, "pid": "abc", "step": 0, "time": time.time() + 99}),
    json.dumps({"rank": -1, "pid": 1, "step": 0, "time": time.time() + 99}),
    json.dumps({"rank": 9, "pid": 1, "step": None, "time": time.time() + 99}),
], ids=["empty-object", "list", "string", "pid-not-a-number", "negative-rank", "step-null"])
def test_a_malformed_heartbeat_neither_crashes_the_monitor_nor_triggers_anything(tmp_path, content):
    # Before: KeyError/TypeError/ValueError in every sampling pass, i.e. the hang watchdog was off.
    plant(tmp_path, 9, content)
    hard: list = []
    sample(tmp_path, hard)
    assert hard == []


def test_a_planted_heartbeat_of_a_gone_pid_does_not_tear_the_launch_down(tmp_path):
    # Before: "rank 9 dead" -> the supervisor killed its healthy workers and then failed with
    # "a worker failed but its rank is unknown".
    plant(tmp_path, 9, json.dumps({"rank": 9, "pid": gone_pid(), "device": "cpu:9", "step": 3, "phase": "training",
                                   "time": time.time() + 3600}))
    hard: list = []
    sample(tmp_path, hard)
    assert hard == []


# A stand-in fork server: it starts one worker and prints its pid, so the worker is where a launch's
# workers are (a child of the supervisor's child, started after the launch began: health/liveness.py,
# issue #33 item 8); this test process plays the supervisor. A worker killed stays a zombie of it.
FORK_SERVER = ("import subprocess, sys, time\n"
               "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
               "print(worker.pid, flush=True)\n"
               "time.sleep(60)\n")


def test_a_worker_of_ours_that_dies_is_still_reported(tmp_path):
    # The control: a worker of this launch, seen alive, then gone, is a dead rank.
    hard: list = []
    monitor = HealthMonitor(tmp_path, SETTINGS, on_hard_failure=hard.append, log=lambda line: None)
    fork_server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(fork_server.stdout.readline())
        plant(tmp_path, 0, json.dumps({"rank": 0, "pid": worker, "device": "cpu:0", "step": 2, "phase": "training",
                                       "time": time.time()}))  # written after the monitor started: this launch's
        monitor.sample_once()
        assert hard == []
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not hard and time.monotonic() < deadline:  # the kill lands at once; the wait is for a loaded machine
            monitor.sample_once()
            time.sleep(0.05)
    finally:
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        fork_server.kill()
        fork_server.wait(10)
        fork_server.stdout.close()
    assert [(e["event"], e["rank"], e["pid"]) for e in hard] == [("rank_dead", 0, worker)]
