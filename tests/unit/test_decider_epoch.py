"""The decider's epoch across nodes (issue #36): raised durably, carried by the orders on the run's
store, announced by node 0's launcher, and a fence on checkpoint commits.

Real files in a real run directory: the epoch file node 0's launcher raises before each decider,
and the commit of workers whose decider a newer one replaced, refused before anything is renamed
into place (``tests/dist/test_decider_restart.py`` shows the whole scenario with real processes).
"""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed import TCPStore

from synapse import checkpoint as ckpt
from synapse.failover import ExitOrder, LaunchOrder, NodeChannel, NodeHello
from synapse.failover.epoch import (
    NO_LAUNCH,
    EpochFileError,
    admit_workers,
    close_commits,
    next_epoch,
    read_epoch,
    record_decider,
)
from synapse.failover.node_channel import DECIDER_KEY, RUN_SCOPE, DeciderAnnouncement
from synapse.launch import free_port


def write_checkpoint(root: Path, step: int, epoch: int) -> Path:
    tmp = ckpt.begin_checkpoint(root, step)
    ckpt.save_tensor_file({"model": {"w": torch.full((4,), float(step))}, "optim": {}}, tmp / ckpt.shard_name(0))
    ckpt.save_tensor_file({"step": step}, tmp / ckpt.STATE_FILE)
    return ckpt.commit_checkpoint(tmp, step, meta={"student": "resnet_micro", "epoch": epoch})


def test_the_epoch_only_grows_and_survives_the_process_that_raised_it(tmp_path):
    assert read_epoch(tmp_path).epoch == 0, "no decider yet"
    assert [next_epoch(tmp_path) for _ in range(3)] == [1, 2, 3]
    record_decider(tmp_path, 3, pid=4242)
    again = read_epoch(tmp_path)
    assert (again.epoch, again.pid) == (3, 4242)
    assert next_epoch(tmp_path) == 4
    assert sorted(p.name for p in (tmp_path / "failover").iterdir()) == ["decider_epoch.json"], \
        "written beside and renamed: no temporary left"


def test_an_unreadable_epoch_file_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "failover").mkdir()
    (tmp_path / "failover" / "decider_epoch.json").write_text("{not json")
    with pytest.raises(EpochFileError, match="only ever grows. Fix: write"):
        next_epoch(tmp_path)


def test_a_commit_of_workers_the_new_decider_did_not_adopt_is_refused_and_leaves_nothing(tmp_path):
    root = tmp_path / "checkpoints"
    next_epoch(tmp_path)
    first = write_checkpoint(root, 2, epoch=1)
    assert ckpt.read_manifest(first)["meta"]["epoch"] == 1, "a commit carries its writers' epoch"
    next_epoch(tmp_path)  # a new decider took the run over: until it launches, epoch 1's workers are adopted
    adopted = write_checkpoint(root, 3, epoch=1)
    assert ckpt.read_manifest(adopted)["meta"]["epoch"] == 1 and read_epoch(tmp_path).workers == 1
    admit_workers(tmp_path, 2)  # it launches workers of its own: epoch 1's may no longer commit
    assert read_epoch(tmp_path).workers == 2 and read_epoch(tmp_path).epoch == 2
    with pytest.raises(ckpt.StaleEpochCommitError, match="decider epoch 1, and a decider of epoch 2"):
        write_checkpoint(root, 4, epoch=1)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_00000002",
                                                                                    "step_00000003"], \
        "nothing of the refused commit is left: neither the step nor its temporary"
    assert ckpt.latest_valid_checkpoint(root).step == 3
    newer = write_checkpoint(root, 4, epoch=2)  # the new decider's workers commit as before
    assert json.loads((newer / ckpt.MANIFEST).read_text())["meta"]["epoch"] == 2


def test_one_node_runs_have_no_epoch_and_no_fence(tmp_path):
    root = tmp_path / "checkpoints"
    assert ckpt.read_manifest(write_checkpoint(root, 2, epoch=0))["step"] == 2


def test_a_restarted_decider_numbers_its_orders_on_and_an_older_epoch_s_order_reads_as_older(tmp_path):
    """On a real TCPStore: node 0's launcher serves the store and announces each decider; an agent says
    hello again to the second with the orders it has read, which the second numbers on from; the first,
    replaced, still writes under the same number, and the agent can tell its order by its epoch."""
    endpoint = f"127.0.0.1:{free_port()}"
    launcher = NodeChannel.host(endpoint, timeout_s=10, run_dir=tmp_path)
    launcher.announce_decider(DeciderAnnouncement(1, "starting"))
    agent = NodeChannel.connect(endpoint, node_rank=1, timeout_s=10, run_dir=tmp_path)
    assert agent.wait_decider(1).epoch == 1

    first = NodeChannel.attach(endpoint, timeout_s=10, run_dir=tmp_path)
    first.epoch = 1
    agent.say_hello(NodeHello(1, 2, [0, 1], "host-b", 1, "claim", epoch=1))
    assert first.hellos()[1].epoch == 1
    first.join(RUN_SCOPE)
    agent.join(RUN_SCOPE)
    agent.epoch = 1
    launch = LaunchOrder(0, "trainer: {}\n", {"devices": [0, 1], "teacher": [1, 1], "student": [1, 1]}, 4, None,
                         "/w/teacher.pt", store_hosted=True)
    first.order(1, launch)
    assert agent.next_order(1, 0, timeout_s=1).epoch == 1

    launcher.announce_decider(DeciderAnnouncement(1, "lost"))
    assert agent.decider().state == "lost"
    launcher.announce_decider(DeciderAnnouncement(2, "starting"))
    assert agent.wait_decider(1, newer_than=1).epoch == 2
    agent.join("nodes meeting")
    agent.say_hello(NodeHello(1, 2, [0, 1], "host-b", 1, "second hello", epoch=2, orders_seen=1), claim_nonce="claim")
    second = NodeChannel.attach(endpoint, timeout_s=10, run_dir=tmp_path)
    second.epoch = 2
    hello = second.hellos()[1]
    assert (hello.epoch, hello.orders_seen) == (2, 1), "the node_rank is still this agent's claim"
    second.continue_orders(1, hello.orders_seen)
    second.join(RUN_SCOPE)
    agent.join(RUN_SCOPE)

    first.order(1, ExitOrder("the replaced decider"))  # number 1, as the replaced decider counts
    stale = agent.next_order(1, 1, timeout_s=1)
    assert isinstance(stale, ExitOrder) and stale.epoch == 1, "opens (one run, one key) but says its epoch"
    second.order(1, ExitOrder())  # number 1 again: the current decider's
    current = agent.next_order(1, 1, timeout_s=1)
    assert isinstance(current, ExitOrder) and current.epoch == 2 and current.error is None


def test_an_announcement_the_launcher_did_not_seal_is_refused(tmp_path):
    port = free_port()
    launcher = NodeChannel.host(f"127.0.0.1:{port}", timeout_s=10, run_dir=tmp_path)
    forger = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    forged = json.dumps({"epoch": 99, "state": "lost"}).encode()
    forger.set(DECIDER_KEY, forged)
    # a set returns before the server has applied it; a read on the same connection waits for it, so the
    # launcher's read below cannot come before the forged value has landed
    assert forger.get(DECIDER_KEY) == forged
    assert launcher.decider() is None, "a forged 'lost' is no announcement"
    refused = [json.loads(line) for line in (tmp_path / "failover_events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "store_record_refused" and e["key"] == DECIDER_KEY for e in refused)


def test_a_lost_nodes_workers_cannot_commit_once_it_is_judged_lost_and_the_launch_that_replaces_them_can(
        tmp_path, monkeypatch):
    """Issue #36: the workers of a node judged lost (its agent only stalled) share their epoch with the launch
    that replaces them; the fence names the launch too (torch gives each worker its launch's rendezvous run id)."""
    root = tmp_path / "checkpoints"
    next_epoch(tmp_path)
    admit_workers(tmp_path, 1, "run-segment0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-segment0")
    first = write_checkpoint(root, 2, epoch=1)
    assert ckpt.read_manifest(first)["meta"]["launch"] == "run-segment0", "a commit carries its writers' launch"
    close_commits(tmp_path, 1)  # node 1 declared lost: its workers of segment 0 may train on
    assert read_epoch(tmp_path).launch == NO_LAUNCH
    with pytest.raises(ckpt.StaleEpochCommitError, match="launch run-segment0, and the decider's fence .* admits none"):
        write_checkpoint(root, 3, epoch=1)
    admit_workers(tmp_path, 1, "run-segment1")  # the DEGRADE's launch, in the same epoch
    assert (read_epoch(tmp_path).workers, read_epoch(tmp_path).launch) == (1, "run-segment1")
    with pytest.raises(ckpt.StaleEpochCommitError, match="admits run-segment1"):
        write_checkpoint(root, 3, epoch=1)
    assert sorted(p.name for p in root.glob("*step*")) == [first.name], "nothing of a refused commit is left"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-segment1")
    replaced = write_checkpoint(root, 3, epoch=1)
    assert ckpt.read_manifest(replaced)["meta"]["launch"] == "run-segment1"
    next_epoch(tmp_path)  # a restarted decider adopts the running launch: its workers go on committing
    assert read_epoch(tmp_path).launch == "run-segment1"
    assert ckpt.read_manifest(write_checkpoint(root, 4, epoch=1))["meta"]["epoch"] == 1
    close_commits(tmp_path, 1)  # the replaced decider, stalled, wakes and declares a node lost: nothing closes
    assert read_epoch(tmp_path).launch == "run-segment1"
    assert ckpt.read_manifest(write_checkpoint(root, 5, epoch=1))["meta"]["epoch"] == 1
