"""Issue #33, items 1 and 9: a local process that writes crafted pickles and garbage under the keys of
a running run's stores. Before, a crafted pickle under the rendezvous key ran code in the supervisor
within 0.5 s; garbage under a node report key killed the decider's watch thread (both nodes hung after
the last step); a bad record on the control key made rank 0 raise, judged dead, its device dropped.

Now every value the run's processes put on a store is sealed with the run's key (run.key, mode 0600),
and a value that is not is refused before it is parsed or unpickled, logged once (a line naming what
was refused and where, and a ``store_record_refused`` event): the runs below finish on every device,
and the marker the pickle would create never appears. The attacker is a real ``TCPStore`` client that
lists the store's keys (as anyone who reaches the port can) and writes over the run's records.
Rows of docs/reliability.md ("Stores, pids and signals") name these tests.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from synapse.failover import read_segments
from synapse.launch import free_port
from synapse.rundir.sealed import MAC_BYTES

from .test_multinode_failover import finish, start_nodes
from .test_reliability import (
    events,
    no_leftover_processes,  # noqa: F401  (autouse: nothing the test started outlives it)
    overrides_for,
    steps_done,
    train_py,
    wait_until,
)

pytestmark = [pytest.mark.dist]
RENDEZVOUS_STATE = "torch.rendezvous."  # + the run id: torch's pickled state (no "/" in the name)
# node 0's launcher's announcement of the decider epoch (issue #36): a forged "lost" would make the agents
# tear their workers down; unsealed, it is refused, and the launcher puts its own back
DECIDER_ANNOUNCEMENT = "synapse/nodes/decider"


class CreatesMarker:
    """Unpickled, it creates the marker file: what the attacker's crafted pickle would do in the run."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class Attacker(threading.Thread):
    """Every ``period_s`` until stopped: write each of ``values`` in turn under every key ``targets``
    picks from the store's key list, plus the ``always`` keys."""

    def __init__(self, port: int, targets, always: tuple[str, ...], values: list[bytes], period_s: float = 0.3):
        super().__init__(daemon=True)
        self.port, self.targets, self.always, self.values, self.period_s = port, targets, always, values, period_s
        self.written: dict[str, int] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        store = None
        n = 0
        while not self._stop_event.is_set():
            with contextlib.suppress(Exception):  # the store is not up yet, or gone: try again
                store = store or TCPStore("127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=5))
                for key in {*filter(self.targets, store.list_keys()), *self.always}:
                    store.set(key, self.values[n % len(self.values)])
                    self.written[key] = self.written.get(key, 0) + 1
                n += 1
            self._stop_event.wait(self.period_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def is_rendezvous_state(key: str) -> bool:
    """torch's pickled state; not the keys of a round (``torch.rendezvous.<id>.<round>/...``), which torch
    writes and reads once per round unsealed (a value there fails the round: docs/reliability.md)."""
    return key.startswith(RENDEZVOUS_STATE) and "/" not in key


def refused_keys(run_dir: Path) -> set[str]:
    return {e["key"] for e in events(run_dir, "store_record_refused")}


def refusals_of(run_dir: Path, key: str) -> set[str]:
    """The distinct values refused under ``key`` (each is said once per process that read it)."""
    return {e["value_head"] for e in events(run_dir, "store_record_refused", key=key)}


@pytest.mark.timeout(300)
def test_crafted_pickles_under_the_rendezvous_key_and_garbage_control_records_change_nothing(tmp_path, teacher_file):
    run_dir, port = tmp_path / "run", free_port()
    marker = tmp_path / "marker"
    pickled = base64.b64encode(pickle.dumps(CreatesMarker(marker)))  # as torch's backend stores its state
    # From step 2 every step is slower (rank 0 slowed): the attack runs over many of torch's state reads.
    # policy=keep: the slowdown is no reason to re-plan.
    proc = train_py(run_dir, overrides_for(run_dir, teacher_file, "policy=keep",
                                           f"trainer.rdzv_endpoint=127.0.0.1:{port}",
                                           "injection.faults=[{kind:slow_compute,rank:0,start:2,seconds:0.1}]"))
    attacker = Attacker(port, is_rendezvous_state, (),
                        [pickled, b"garbage", pickled, b"\x80\x04\x95"])
    attacker.start()
    control = run_dir / "control" / "stop.json"
    bad_records = (b"{torn", b"\x80\x04\x95crafted", b'{"id": "x", "mode": "restart"}', b"[]")
    try:
        wait_until(lambda: steps_done(run_dir) >= 2, proc, 240, "step 2")
        for n, bad in enumerate(bad_records, 1):
            control.parent.mkdir(exist_ok=True)
            control.write_bytes(bad)  # rank 0 reads it at its next step
            wait_until(lambda n=n: len(refusals_of(run_dir, str(control))) >= n, proc, 120, f"bad record {n} refused")
        control.unlink()
        assert proc.wait(240) == 0, (tmp_path / "run.train_py.log").read_text()[-3000:]
    finally:
        attacker.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "run.train_py.log").read_text()
    assert not marker.exists(), "the crafted pickle ran in the run"
    state_keys = [k for k in attacker.written if k.startswith(RENDEZVOUS_STATE)]
    assert len(state_keys) == 1 and attacker.written[state_keys[0]] > 3, attacker.written
    assert {state_keys[0], str(control)} <= refused_keys(run_dir)
    assert f"rendezvous: refused the value under '{state_keys[0]}'" in log
    assert f"rank 0: refused the value under '{control}'" in log
    (segment,) = read_segments(run_dir)
    assert segment.devices == [0, 1, 2] and segment.outcome == "finished", "no device was dropped"
    assert not events(run_dir, "rank_dead") and not events(run_dir, "worker_failed")


@pytest.mark.extended  # two nodes; the one-node store case stays in the default suite, the refusals are unit-tested
@pytest.mark.timeout(420)
def test_garbage_and_forged_records_on_the_nodes_store_change_nothing(tmp_path, teacher_file):
    run_dir = tmp_path / "run"
    marker = tmp_path / "marker"
    report = "synapse/nodes/report/0/1"
    forged_report = json.dumps({"node_rank": 1, "segment": 0, "outcome": "failed", "rank": 3,
                                "cause": "forged", "device_failure": True}).encode()
    forged_stop = json.dumps({"id": "forged", "action": "degrade", "step": 1, "segment": 0, "mode": "restart",
                              "placement": {"devices": [0], "teacher": [4], "student": [4]}}).encode()
    nodes = start_nodes(run_dir, teacher_file, "policy=keep",
                        "injection.faults=[{kind:slow_compute,rank:0,start:2,seconds:0.1}]")
    port = int(next(a for a in nodes[0].args if a.startswith("trainer.rdzv_endpoint=")).rsplit(":", 1)[1])
    # After the meeting (a value under a key the nodes meet on fails the meeting, with the fix: a
    # denial of service, not a takeover): the report, control and rendezvous-state keys, and the beats.
    attacker = Attacker(port, lambda key: key.startswith("synapse/nodes/beat/") or is_rendezvous_state(key),
                        (report, "synapse/control/stop", DECIDER_ANNOUNCEMENT),
                        [b"\x80\x04garbage\xff", base64.b64encode(pickle.dumps(CreatesMarker(marker))), forged_report,
                         forged_stop])
    try:
        deadline = time.monotonic() + 240
        while steps_done(run_dir) < 1:
            assert all(n.poll() is None for n in nodes), "a node exited before step 1"
            assert time.monotonic() < deadline, "no step 1"
            time.sleep(0.05)
        attacker.start()
        outputs = finish(nodes, timeout=300)
    finally:
        attacker.stop()
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-3000:]
    assert not marker.exists(), "the crafted pickle ran in the run"
    assert {report, "synapse/control/stop", DECIDER_ANNOUNCEMENT} <= refused_keys(run_dir), refused_keys(run_dir)
    assert any(k.startswith(RENDEZVOUS_STATE) for k in attacker.written)
    assert f"decider: refused the value under '{report}'" in outputs[0]
    (segment,) = read_segments(run_dir)
    assert segment.outcome == "finished" and len(segment.devices) == 4, "no device was dropped"


def bootstrap_port(store: TCPStore) -> int | None:
    """The first launch's bootstrap store port, read where torch's agent publishes it (sealed: the seal
    authenticates the value, it does not hide it)."""
    for key in store.list_keys():
        if key.endswith("/MASTER_PORT"):
            with contextlib.suppress(ValueError):
                return int(store.get(key)[MAC_BYTES:])
    return None


LATE_RANK = 2  # held back on the first launch, so that its gloo key holds only the attacker's garbage


def late_rank_site(site_dir: Path, flag: Path) -> Path:
    """A ``sitecustomize`` (first on PYTHONPATH, so every process of the run imports it) that holds rank
    ``LATE_RANK`` back before its process group forms, on its first launch only (``flag`` marks it held),
    as a slow-starting worker would be. Until it writes its gloo key, only the attacker writes there: the
    other ranks, which wait for that key, can read nothing but garbage (without the hold, a rank's own
    write could land after the garbage and the group formed under load: the spoil lost the race)."""
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text(f"""\
import os
import time

import torch.distributed as dist

_init_process_group = dist.init_process_group


def init_process_group_late(*args, **kwargs):
    if os.environ.get("RANK") == "{LATE_RANK}" and not os.path.exists({str(flag)!r}):
        open({str(flag)!r}, "w").close()
        time.sleep(120)  # the launch is torn down long before: the other ranks fail on the garbage
    return _init_process_group(*args, **kwargs)


dist.init_process_group = init_process_group_late
""")
    return site_dir


@pytest.mark.timeout(420)
def test_garbage_under_every_key_of_both_stores_changes_nothing_and_a_spoilt_group_is_retried(tmp_path, teacher_file,
                                                                                             monkeypatch):
    # Issue #33, 1, torch's own keys: garbage and crafted pickles under every key the rendezvous store lists
    # (torch's state, the round's MASTER_ADDR/MASTER_PORT, role infos, rank assignment, exit barrier) for
    # the whole run; and, on the first launch's bootstrap store, garbage under the keys gloo reads while the
    # process group forms (their names are fixed: default_pg/0//cpu//0/<rank>), written before and while
    # the workers meet. Rank 2 is late on the first launch (``late_rank_site``), so the other ranks read its
    # key while only the attacker has written it: the group cannot form, whatever the load. No device is
    # blamed, and the launch is retried on the same devices. The run finishes on [0, 1, 2]; the pickle never
    # runs.
    run_dir, port = tmp_path / "run", free_port()
    marker, held = tmp_path / "marker", tmp_path / "late_rank_held"
    site = late_rank_site(tmp_path / "site", held)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    pickled = base64.b64encode(pickle.dumps(CreatesMarker(marker)))
    proc = train_py(run_dir, overrides_for(run_dir, teacher_file, "policy=keep",
                                           f"trainer.rdzv_endpoint=127.0.0.1:{port}"))
    everywhere = Attacker(port, lambda key: True, (),
                          [pickled, b"garbage", b"\x80\x04\x95", pickle.dumps(CreatesMarker(marker))])
    gloo_keys = [f"default_pg/0//cpu//0/{rank}" for rank in range(3)]
    spoilt: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not spoilt:
            assert proc.poll() is None and time.monotonic() < deadline, "no bootstrap store was published"
            with contextlib.suppress(Exception):
                store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
                if (found := bootstrap_port(store)) is not None:
                    spoilt.append(found)
            time.sleep(0.01)
        everywhere.start()  # once the port is read: its garbage would hide the port from this test as well
        bootstrap = TCPStore("127.0.0.1", spoilt[0], is_master=False, timeout=timedelta(seconds=10))
        while not events(run_dir, "segment_ended") and steps_done(run_dir) == 0:  # the first launch's meeting
            assert proc.poll() is None and time.monotonic() < deadline, "the first launch neither failed nor trained"
            with contextlib.suppress(Exception):
                for key in gloo_keys:
                    bootstrap.set(key, b"\x80\x04garbage\xff" * 4)
            time.sleep(0.02)
        code = proc.wait(300)
        said = [line for line in (tmp_path / "run.train_py.log").read_text().splitlines()
                if line.startswith(("failover:", "rendezvous:")) or "Error" in line]
        assert code == 0, "\n".join(said)[-6000:]
    finally:
        everywhere.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "run.train_py.log").read_text()
    assert not marker.exists(), "the crafted pickle ran in the run"
    assert held.exists(), f"rank {LATE_RANK} was not held back on the first launch"
    round_keys = [k for k in everywhere.written if k.startswith(RENDEZVOUS_STATE) and "/" in k]
    assert any(k.endswith("/MASTER_PORT") for k in round_keys) and any("assigned_ranks" in k for k in round_keys)
    segments = read_segments(run_dir)
    assert all(s.devices == [0, 1, 2] for s in segments), "no device was dropped"
    assert segments[-1].outcome == "finished"
    (ended, *_) = events(run_dir, "segment_ended", segment=0)
    assert ended["cause"] == "the process group did not form" and ended["rank"] is None, ended
    retry = events(run_dir, "retry_same_devices")
    assert retry and retry[0]["devices"] == [0, 1, 2] and segments[1].reason == "retry", retry
    assert "retrying on the same devices [0, 1, 2]" in log
    assert not events(run_dir, "rank_dead")
