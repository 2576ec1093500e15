"""Issue #33, item 8: a heartbeat planted in live/ naming one of the supervisor's own helpers (the
fork server the workers are forked from, multiprocessing's resource tracker) or the supervisor
itself. Those pids are alive and the supervisor's, but no worker: judged as workers, they "hung"
(their step never moves), the teardown SIGKILLed them and a healthy device was dropped. Now they
are "not ours": the run trains on untouched. A real ``python train.py``; a row of
docs/reliability.md ("Stores, pids and signals") names this test.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from synapse.failover import read_segments
from synapse.health import pid_alive
from synapse.rundir import HEALTH, read_jsonl

from .helpers import plant_heartbeat
from .test_reliability import (
    STEPS,
    events,
    no_leftover_processes,  # noqa: F401  (autouse: nothing the test started outlives it)
    overrides_for,
    steps_done,
    train_py,
    wait_until,
)

pytestmark = [pytest.mark.dist, pytest.mark.extended]
HANG_TIMEOUT_S = 10


def helper_of(supervisor: int, module: str) -> int:
    """The pid of the supervisor's child running ``multiprocessing.<module>`` (its command line says)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
            if parent == supervisor and f"multiprocessing.{module}".encode() in command:
                return int(entry)
    raise AssertionError(f"train.py (pid {supervisor}) has no multiprocessing.{module} child")


@pytest.mark.timeout(300)
def test_heartbeats_naming_the_supervisors_helpers_are_neither_killed_nor_blamed(tmp_path, teacher_file):
    run_dir = tmp_path / "run"
    # From step 2 every step takes over 3 s (rank 0 slowed): the planted files sit unchanged for longer
    # than monitor.hang_timeout_s. The timeout still leaves the real ranks room: under CPU load a rank's
    # end of run (waiting on rank 0's last checkpoint) went 3.2 s without a new phase, and a 3 s timeout
    # judged it hung. policy=keep: the slowdown is no reason to re-plan.
    proc = train_py(run_dir, overrides_for(run_dir, teacher_file, "policy=keep",
                                           "injection.faults=[{kind:slow_compute,rank:0,start:2,seconds:0.4}]",
                                           f"monitor.hang_timeout_s={HANG_TIMEOUT_S}", "monitor.period_s=0.25"))
    try:
        wait_until(lambda: steps_done(run_dir) >= 1, proc, 240, "step 1")  # the fork server runs by now
        planted = {7: proc.pid, 8: helper_of(proc.pid, "resource_tracker"), 9: helper_of(proc.pid, "forkserver")}
        for rank, pid in planted.items():
            plant_heartbeat(run_dir, rank, pid)
        planted_at = time.monotonic()
        wait_until(lambda: steps_done(run_dir) >= STEPS - 1, proc, 200, f"step {STEPS - 1}")
        assert time.monotonic() - planted_at > HANG_TIMEOUT_S + 1, "the run went faster than the hang timeout"
        alive = {rank: pid_alive(pid) for rank, pid in planted.items()}
        assert proc.wait(120) == 0, (tmp_path / "run.train_py.log").read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert alive == {7: True, 8: True, 9: True}, "the supervisor killed its own helper"
    assert not events(run_dir, "rank_hung") and not events(run_dir, "rank_dead")
    (segment,) = read_segments(run_dir)
    assert segment.devices == [0, 1, 2] and segment.outcome == "finished", "no device was dropped"
    states = [sample["ranks"] for sample in read_jsonl(HEALTH.path(run_dir))]
    assert {states[-1][str(rank)]["state"] for rank in planted} == {"not ours"}
    assert json.loads((run_dir / "live" / "rank_9.json").read_text())["pid"] == planted[9]  # left as it was
