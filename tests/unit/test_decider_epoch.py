"""The decider's epoch across nodes (issue #36): raised durably, and a fence on checkpoint commits.

Real files in a real run directory: the epoch file node 0's launcher raises before each decider,
and the commit of workers whose decider a newer one replaced, refused before anything is renamed
into place (``tests/dist/test_decider_restart.py`` shows the whole scenario with real processes).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from synapse import checkpoint as ckpt
from synapse.failover.epoch import EpochFileError, next_epoch, read_epoch, record_decider


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


def test_a_commit_of_a_replaced_decider_s_workers_is_refused_and_leaves_nothing(tmp_path):
    root = tmp_path / "checkpoints"
    next_epoch(tmp_path)
    first = write_checkpoint(root, 2, epoch=1)
    assert ckpt.read_manifest(first)["meta"]["epoch"] == 1, "a commit carries its writers' epoch"
    next_epoch(tmp_path)  # a new decider took the run over
    with pytest.raises(ckpt.StaleEpochCommitError, match="decider epoch 1, and a decider of epoch 2"):
        write_checkpoint(root, 4, epoch=1)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_00000002"], \
        "nothing of the refused commit is left: neither the step nor its temporary"
    assert ckpt.latest_valid_checkpoint(root).step == 2
    newer = write_checkpoint(root, 4, epoch=2)  # the new decider's workers commit as before
    assert json.loads((newer / ckpt.MANIFEST).read_text())["meta"]["epoch"] == 2


def test_one_node_runs_have_no_epoch_and_no_fence(tmp_path):
    root = tmp_path / "checkpoints"
    assert ckpt.read_manifest(write_checkpoint(root, 2, epoch=0))["step"] == 2
