"""The run's key and the sealed records its processes exchange over a store (issue #33, items 1
and 9): a value is opened only under the key, store key and scope it was sealed for; anything
else (tampered, truncated, another run's, another launch's) is refused before it is parsed or
unpickled. The rendezvous state is checked on a real TCPStore: a crafted pickle never runs."""
from __future__ import annotations

import base64
import os
import pickle
import stat
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from synapse.launch import free_port
from synapse.launch.rendezvous import SealedRendezvousBackend
from synapse.rundir import (
    RUN_KEY,
    ForeignRecordError,
    Refusals,
    RunKeyError,
    open_bytes,
    read_events,
    run_key,
    seal_bytes,
)
from synapse.rundir.sealed import open_record, seal_record


def test_the_run_key_is_made_once_private_and_kept(tmp_path):
    key = run_key(tmp_path)
    path = RUN_KEY.path(tmp_path)
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert run_key(tmp_path) == key, "kept: a resume, or another node of the run, reads the same key"
    assert run_key(tmp_path / "other_run") != key
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary left behind"


@pytest.mark.parametrize("spoil", ["readable", "symlink", "garbage"])
def test_a_run_key_that_cannot_be_trusted_is_refused_with_the_fix(tmp_path, spoil):
    path = RUN_KEY.path(tmp_path)
    if spoil == "readable":
        run_key(tmp_path)
        path.chmod(0o644)  # anyone who can read it can speak for the run
    elif spoil == "symlink":
        (tmp_path / "elsewhere").write_text("ab" * 32)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("not a key")
        path.chmod(0o600)
    with pytest.raises(RunKeyError, match="Fix: delete it"):
        run_key(tmp_path)


def test_a_sealed_value_opens_only_where_it_was_sealed():
    key, other_key = os.urandom(32), os.urandom(32)
    sealed = seal_bytes(key, "torch.rendezvous.x", "", b"state")
    assert open_bytes(key, "torch.rendezvous.x", "", sealed) == b"state"
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    cases = {
        "tampered": (key, "torch.rendezvous.x", "", tampered),
        "truncated": (key, "torch.rendezvous.x", "", sealed[:20]),
        "empty": (key, "torch.rendezvous.x", "", b""),
        "another key name": (key, "torch.rendezvous.y", "", sealed),
        "another scope": (key, "torch.rendezvous.x", "launch 1", sealed),
        "another run's key (replayed across runs)": (other_key, "torch.rendezvous.x", "", sealed),
    }
    for case, args in cases.items():
        with pytest.raises(ForeignRecordError):
            open_bytes(*args)
            pytest.fail(case)


def test_a_sealed_record_is_parsed_only_once_its_seal_holds():
    key = os.urandom(32)
    text = seal_record(key, "synapse/control/stop", "launch 2", {"id": "r1"})
    assert open_record(key, "synapse/control/stop", "launch 2", text) == {"id": "r1"}
    head, _, payload = text.partition("\n")
    for bad in (payload, head, "zz" * 32 + "\n" + payload, head + "\n" + payload.replace("r1", "r2"),
                seal_record(key, "synapse/control/stop", "launch 1", {"id": "r1"}), "\x80\x04garbage"):
        with pytest.raises(ForeignRecordError):
            open_record(key, "synapse/control/stop", "launch 2", bad)


def test_a_refusal_is_said_once_per_value_in_the_log_and_the_event_log(tmp_path):
    lines: list[str] = []
    refused = Refusals(tmp_path, source="rank 0", log=lines.append)
    refused("synapse/control/stop", b"junk", "not sealed")
    refused("synapse/control/stop", b"junk", "not sealed")
    refused("synapse/control/stop", b"other junk", "not sealed")
    assert len(lines) == 2 and lines[0].startswith("rank 0: refused the value under 'synapse/control/stop' (")
    assert [e["key"] for e in read_events(tmp_path, "store_record_refused")] == ["synapse/control/stop"] * 2
    for n in range(2 * Refusals.LIMIT):  # new garbage for ever: bounded, and said to be
        refused("k", str(n), "not sealed")
    assert len(lines) == Refusals.LIMIT + 1 and "further refusals are not logged" in lines[-1]


class Marker:
    """Unpickling it would create the marker file: what an attacker's crafted pickle does."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def forge(attacker: TCPStore, key: str, value: bytes) -> None:
    """Write ``value`` under ``key`` as another process would, and return once the store holds it.

    ``TCPStore.set`` does not wait for the server's answer: a read on another connection (the run's) made
    right after could still find the old value, and the foreign value would land after it was checked
    (seen in the parallel suite). A read on the attacker's own connection is answered after its set."""
    attacker.set(key, value)
    assert attacker.get(key) == value


def test_a_crafted_pickle_under_the_rendezvous_key_is_refused_and_never_unpickled(tmp_path):
    store = TCPStore("127.0.0.1", free_port(), is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    lines: list[str] = []
    backend = SealedRendezvousBackend(store, "run1", run_key(tmp_path), Refusals(tmp_path, "rendezvous", lines.append))
    assert backend.get_state() is None  # no state yet
    state, token, ok = backend.set_state(pickle.dumps({"round": 1}))
    assert ok and pickle.loads(state) == {"round": 1}
    marker = tmp_path / "marker"
    attacker = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    key = "torch.rendezvous.run1"  # torch's name for run id run1
    crafted = base64.b64encode(pickle.dumps(Marker(str(marker))))
    for value in (crafted, b"garbage", b"\x00"):
        forge(attacker, key, value)
        got, _ = backend.get_state()  # torch unpickles what this returns
        assert pickle.loads(got) == {"round": 1}, "the last verified state is read (and put back)"
        assert attacker.get(key) != value
    attacker.delete_key(key)
    assert pickle.loads(backend.get_state()[0]) == {"round": 1}
    assert not marker.exists()
    assert len(lines) == 4 and all(f"rendezvous: refused the value under '{key}'" in line for line in lines)
    # the state of another run with the same run id (replayed across runs) opens no more than garbage
    another_run = SealedRendezvousBackend(store, "run1", run_key(tmp_path / "other"), Refusals(None, "rendezvous",
                                                                                                 lines.append))
    assert another_run.get_state() is None and len(lines) == 5


def test_torchs_once_per_round_keys_are_sealed_and_a_foreign_value_is_refused_and_logged(tmp_path):
    """Issue #33, 1: torch's agent writes and reads the bootstrap store's address, the rank assignment and
    the exit barrier on the round's store. Through ``SealedRoundStore`` torch's own code runs unchanged and
    every value it sets is sealed; what another process writes is refused, logged, and never parsed."""
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    from synapse.launch.rendezvous import ForeignRoundValueError, SealedRoundStore

    server = TCPStore("127.0.0.1", free_port(), is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    lines: list[str] = []
    refused = Refusals(tmp_path, "rendezvous", lines.append)
    prefix = "torch.rendezvous.run1.0"
    store = SealedRoundStore(PrefixStore(prefix, server), run_key(tmp_path), refused)
    attacker = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
    # torch's own code: the bootstrap store's address (rank 0 writes it, every agent reads it back)
    info = RendezvousStoreInfo.build(0, store, local_addr="127.0.0.1", server_port=4242)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 4242)
    assert all(server.get(f"{prefix}/{k}")[:32] != b"127.0.0.1"[:32] for k in ("MASTER_ADDR", "MASTER_PORT"))
    # a forged address and port: this agent wrote them, so its own are used and put back
    forge(attacker, f"{prefix}/MASTER_ADDR", b"10.6.6.6")
    forge(attacker, f"{prefix}/MASTER_PORT", b"not a port")
    again = RendezvousStoreInfo.build(1, store, local_addr=None)  # rank 1's read: nothing is written first
    assert (again.master_addr, again.master_port) == ("127.0.0.1", 4242)
    assert server.get(f"{prefix}/MASTER_ADDR") != b"10.6.6.6", "the sealed value was put back"
    # the rank assignment (torch's slow path: role infos in, assigned ranks out, JSON both ways)
    spec = WorkerSpec(role="trainer", local_world_size=3, rdzv_handler=None, entrypoint="x")  # type: ignore[arg-type]
    workers = SimpleElasticAgent._assign_worker_ranks(None, store, 0, 1, spec)  # type: ignore[arg-type]
    assert [w.global_rank for w in workers] == [0, 1, 2]
    forge(attacker, f"{prefix}/torchelastic/assigned_ranks/0", b'[6, 9, 6, 9]')
    assert store.get("torchelastic/assigned_ranks/0") == b"[0, 3, 0, 3]"
    attacker.delete_key(f"{prefix}/MASTER_PORT")  # deleted: torch's get would wait for it for the store's timeout
    assert RendezvousStoreInfo.build(1, store, local_addr=None).master_port == 4242
    refused_keys = {line.split("'")[1] for line in lines}
    assert refused_keys == {"MASTER_ADDR", "MASTER_PORT", "torchelastic/assigned_ranks/0"}, lines
    assert all("torch's once-per-round key" in line for line in lines)
    # a key another agent wrote, overwritten: waited past until the store's timeout, then a clear error
    other = SealedRoundStore(PrefixStore(prefix, server), run_key(tmp_path), refused)
    store.set("torchelastic/role_info/1", b'{"role": "trainer", "rank": 1, "local_world_size": 3}')
    assert other.get("torchelastic/role_info/1").startswith(b'{"role"')
    forge(attacker, f"{prefix}/torchelastic/role_info/1", b"\x80\x04garbage")
    other.set_timeout(timedelta(seconds=1))
    with pytest.raises(ForeignRoundValueError, match="did not seal .* No device is to blame"):
        other.get("torchelastic/role_info/1")
    # the exit barrier (a counter and an existence check) runs through as it does on torch's store
    from torch.distributed.elastic.utils.store import barrier
    barrier(store, 1, "torchelastic/agent/terminal_state", barrier_timeout=5)
