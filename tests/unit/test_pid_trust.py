"""Which pids the supervisor may judge and kill: a worker of its own launch, and nothing else
(issue #33, item 8). Real processes in the shape the launcher builds: this test process plays the
supervisor, a child plays the fork server (or the resource tracker), the child's child a worker."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from synapse.health import LivenessTracker, kill_live_workers, pid_alive
from synapse.health.liveness import HOST_ID, is_launch_worker, signal_launch_worker, written_here

FORK_SERVER = ("import subprocess, sys, time\n"
               "worker = subprocess.Popen(['sleep', '60'])\n"
               "print(worker.pid, flush=True)\n"
               "time.sleep(60)\n")


@contextlib.contextmanager
def launch():
    """(helper pid, worker pid): a child of this process and that child's own child."""
    helper = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(helper.stdout.readline())
        yield helper.pid, worker
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        helper.kill()
        helper.wait(10)
        helper.stdout.close()


def test_a_worker_is_a_grandchild_started_after_its_launch():
    before = time.time()
    time.sleep(0.6)  # more than START_SLACK_S: a launch begun now did not start the worker below
    launched = time.time()
    with launch() as (helper, worker):
        assert is_launch_worker(worker, since=launched)
        assert not is_launch_worker(worker, since=time.time() + 5), "started before this launch: an earlier one's"
        assert is_launch_worker(worker, since=before)
        assert not is_launch_worker(helper, since=before), "the fork server (a child) is no worker"
    assert not is_launch_worker(os.getpid(), since=before), "nor is the supervisor itself"
    assert not is_launch_worker(1, since=before)
    assert not is_launch_worker(2 ** 22 + 12345), "a pid that does not exist"


def test_only_a_worker_of_the_launch_is_signalled():
    since = time.time()
    with launch() as (helper, worker):
        assert not signal_launch_worker(helper, signal.SIGKILL, since)
        assert not signal_launch_worker(os.getpid(), signal.SIGKILL, since)
        assert pid_alive(helper)
        assert signal_launch_worker(worker, signal.SIGKILL, since)
        deadline = time.monotonic() + 10
        while pid_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(worker)


def test_the_teardown_kills_the_workers_and_spares_the_helpers_a_heartbeat_names():
    since = time.time()
    with launch() as (helper, worker):
        beats = {0: {"rank": 0, "pid": worker, "step": 3, "phase": "training", "time": since + 1},
                 8: {"rank": 8, "pid": helper, "step": 0, "phase": "training", "time": since + 3600},
                 9: {"rank": 9, "pid": os.getpid(), "step": 0, "phase": "training", "time": since + 3600}}
        assert kill_live_workers(beats, since=since) == [worker]
        assert pid_alive(helper) and pid_alive(os.getpid())


@pytest.mark.parametrize("who", ["helper", "supervisor"])
def test_a_heartbeat_naming_a_helper_is_never_judged_hung(who):
    since = time.time()
    with launch() as (helper, worker):
        pid = helper if who == "helper" else os.getpid()
        tracker = LivenessTracker(hang_timeout_s=1.0, since=since, is_ours=lambda p: is_launch_worker(p, since))
        beats = {0: {"rank": 0, "pid": worker, "step": 1, "phase": "training", "time": since},
                 9: {"rank": 9, "pid": pid, "step": 0, "phase": "training", "time": since}}
        status, events = tracker.update(beats, now=since + 10)
        assert status[9]["state"] == "not ours" and status[0]["state"] == "hung"
        assert [e["rank"] for e in events] == [0]


def test_a_heartbeat_written_on_another_host_is_never_judged_nor_killed_here():
    """Issue #36, item 5: pids repeat across nodes (and containers). A rank of another node whose
    pid is, here, a live worker of this launch is another node's to judge: not ours, not killed."""
    since = time.time()
    with launch() as (_, worker):
        remote = {"rank": 3, "pid": worker, "host": "node-7/another-boot", "step": 1, "phase": "training",
                  "time": since}
        local = {**remote, "rank": 0, "host": HOST_ID}
        tracker = LivenessTracker(hang_timeout_s=1.0, since=since, is_ours=lambda p: is_launch_worker(p, since))
        status, events = tracker.update({3: remote}, now=since + 10)
        assert status[3]["state"] == "not ours" and events == []
        assert kill_live_workers({3: remote}, since=since) == [] and pid_alive(worker)
        assert written_here(local) and not written_here(remote) and written_here({"rank": 0, "pid": worker})
        assert kill_live_workers({0: local}, since=since) == [worker]
