"""What a run exposes and what it touches (issue #19's rows "I::" of tests/RELIABILITY.md): its
sockets listen on the loopback interface only, and a process it did not start is neither killed
nor blamed, even when a heartbeat planted in its run directory names it.

Real runs as in test_reliability.py, whose helpers and leftover-process check are reused.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time

import pytest

from synapse.failover import read_segments
from synapse.health import pid_alive

from .helpers import assert_identical_states, final_student_state, plant_heartbeat
from .test_reliability import (  # noqa: F401  (the fixtures apply here too; no_leftover_processes is autouse)
    events,
    in_group,
    live_descendants,
    no_leftover_processes,
    overrides_for,
    reference,
    reference_run,
    run_overrides,
    train_py,
)

pytestmark = [pytest.mark.dist]


# ---------------------------------------------------------------- the sockets it listens on
def _socket_address(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` (/proc/net/tcp's little-endian words) -> ("127.0.0.1", 8080)."""
    ip, port = hex_address.split(":")
    raw = bytes.fromhex(ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def listening_sockets(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    listening[fields[9]] = _socket_address(fields[1])  # by inode
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in listening:
                found.add(listening[link[8:-1]])
    return found


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


@pytest.mark.timeout(240)
def test_a_single_node_run_listens_on_loopback_only(tmp_path, teacher_file):
    run_dir = tmp_path / "run"
    proc = train_py(run_dir, overrides_for(run_dir, teacher_file, "policy=keep", devices=2))
    seen: set[tuple[str, int]] = set()
    try:
        while proc.poll() is None:  # the supervisor, its fork server and the workers: one process group
            seen |= listening_sockets(in_group(proc.pid))
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(30)
    assert proc.returncode == 0, (tmp_path / "run.train_py.log").read_text()[-3000:]
    assert seen, "the run's stores were never seen listening: the check itself is broken"
    exposed = sorted(s for s in seen if not is_loopback(s[0]))
    assert not exposed, f"listening on non-loopback addresses {exposed} (all seen: {sorted(seen)})"


# ---------------------------------------------------------------- processes it did not start
@contextlib.contextmanager
def unrelated_process():
    """A live process this test process did not start as a descendant (its parent exits at once,
    so it is re-parented away) and in a session of its own: the 'unrelated process' a planted
    heartbeat names."""
    shell = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                           start_new_session=True, check=True)
    pid = int(shell.stdout.strip())
    try:
        assert pid_alive(pid) and pid not in live_descendants(os.getpid())
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_a_planted_heartbeat_pid_is_neither_killed_nor_blamed(tmp_path, teacher_file, reference):
    # A hang makes the supervisor tear the launch down (SIGKILL to the workers it finds in live/);
    # a planted rank_9.json names an unrelated live process that must survive it.
    with unrelated_process() as victim:
        plant_heartbeat(tmp_path, 9, victim)
        run_overrides(overrides_for(tmp_path, teacher_file,
                                    "injection.faults=[{kind:hang,rank:1,step:5,phase:backward}]",
                                    "monitor.hang_timeout_s=4", "monitor.period_s=0.25",
                                    "trainer.collective_timeout_s=900"))
        assert pid_alive(victim), "the supervisor killed a process it did not start"
    assert not [e for e in events(tmp_path, "rank_hung") if e["pid"] == victim], "a foreign pid was judged hung"
    (ended,) = events(tmp_path, "segment_ended", segment=0)
    assert ended["cause"] == "rank_hung" and ended["rank"] == 1
    assert [s.devices for s in read_segments(tmp_path)] == [[0, 1, 2], [0, 2]]
    assert_identical_states(final_student_state(tmp_path), reference)
