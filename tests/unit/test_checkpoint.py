"""Atomic, verified checkpoints: round trip, corruption, versions, pruning, and a SIGKILL mid-write."""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from synapse import checkpoint as ckpt
from synapse.engine import (
    load_optimizer_state_by_name,
    optimizer_state_by_name,
    resolve_resume,
    rng_state,
    set_rng_state,
)
from synapse.models import build_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_checkpoint(root: Path, step: int, tensors: dict[str, torch.Tensor] | None = None,
                     meta: dict | None = None) -> Path:
    """The sequence every writer follows: begin, shard(s), state, commit."""
    tmp = ckpt.begin_checkpoint(root, step)
    model = tensors if tensors is not None else {"w": torch.full((4,), float(step))}
    ckpt.save_tensor_file({"model": model, "optim": {}}, tmp / ckpt.shard_name(0))
    ckpt.save_tensor_file({"step": step}, tmp / ckpt.STATE_FILE)
    return ckpt.commit_checkpoint(tmp, step, meta=meta)


def steps(refs: list[ckpt.CheckpointRef]) -> list[int]:
    return [r.step for r in refs]


# ----------------------------------------------------------------------------- round trip

@pytest.mark.slow  # a real model and optimizer state to save and load
def test_round_trip_of_a_real_training_state(tmp_path):
    torch.manual_seed(0)
    model = build_model("resnet_micro", 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    optimizer.step()
    named = dict(model.named_parameters())
    random.random()
    rng = rng_state()
    expected_draws = (torch.rand(3), random.random())  # what the saved RNG state produces next
    tmp = ckpt.begin_checkpoint(tmp_path, 5)
    ckpt.save_tensor_file({"model": model.state_dict(), "optim": optimizer_state_by_name(optimizer, named)},
                          tmp / ckpt.shard_name(0))
    ckpt.save_tensor_file({"step": 5, "rng": rng}, tmp / ckpt.STATE_FILE)
    assert ckpt.list_checkpoints(tmp_path) == []  # not visible before the commit
    path = ckpt.commit_checkpoint(tmp, 5, meta={"student": "resnet_micro"})

    assert path == tmp_path / "step_00000005" and not tmp.exists()
    model_state, optim_state = ckpt.load_student_state(path)
    assert model_state.keys() == model.state_dict().keys()
    assert all(torch.equal(model_state[k], v) for k, v in model.state_dict().items())
    fresh = torch.optim.AdamW(build_model("resnet_micro", 10).parameters(), lr=1e-3)
    fresh_named = dict(zip(named, fresh.param_groups[0]["params"]))
    load_optimizer_state_by_name(fresh, fresh_named, optim_state)
    for name, param in named.items():
        saved, loaded = optimizer.state[param], fresh.state[fresh_named[name]]
        assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    run_state = ckpt.load_run_state(path)
    set_rng_state(run_state["rng"])
    assert run_state["step"] == 5
    assert torch.equal(torch.rand(3), expected_draws[0]) and random.random() == expected_draws[1]


def test_manifest_records_version_step_meta_and_checksums(tmp_path):
    path = write_checkpoint(tmp_path, 3, meta={"student": "resnet_micro", "world_size": 1})
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    assert manifest["format_version"] == 1 and manifest["step"] == 3  # shard_XX.pt files: the version-1 layout
    assert manifest["meta"] == {"student": "resnet_micro", "world_size": 1}
    assert set(manifest["files"]) == {ckpt.shard_name(0), ckpt.STATE_FILE}
    for name, info in manifest["files"].items():
        data = (path / name).read_bytes()
        assert info == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert ckpt.verify_checkpoint(path) == manifest


def test_shards_of_several_ranks_merge_into_one_state(tmp_path):
    tmp = ckpt.begin_checkpoint(tmp_path, 1, nonce="shared")
    for rank, name in enumerate(["a.weight", "b.weight"]):
        assert ckpt.begin_checkpoint(tmp_path, 1, nonce="shared") == tmp  # every rank finds the same dir
        ckpt.save_tensor_file({"model": {name: torch.full((2,), float(rank))}, "optim": {name: {"step": rank}}},
                              tmp / ckpt.shard_name(rank))
    ckpt.save_tensor_file({"step": 1}, tmp / ckpt.STATE_FILE)
    model, optim = ckpt.load_student_state(ckpt.commit_checkpoint(tmp, 1))
    assert torch.equal(model["a.weight"], torch.zeros(2)) and torch.equal(model["b.weight"], torch.ones(2))
    assert optim == {"a.weight": {"step": 0}, "b.weight": {"step": 1}}


def test_saving_a_step_again_keeps_its_verified_copy_and_never_leaves_a_gap(tmp_path):
    # Training is deterministic: a step saved twice (e.g. right after a resume) holds the same
    # state, so the copy already on disk stays and the step is never missing in between.
    first = write_checkpoint(tmp_path, 4, {"w": torch.zeros(2)})
    again = write_checkpoint(tmp_path, 4, {"w": torch.ones(2)})
    assert again == first and steps(ckpt.list_checkpoints(tmp_path)) == [4]
    assert torch.equal(ckpt.load_student_state(again)[0]["w"], torch.zeros(2))
    assert not list(tmp_path.glob("step_*.tmp-*"))


def test_saving_a_step_again_replaces_a_corrupt_copy(tmp_path):
    path = write_checkpoint(tmp_path, 4, {"w": torch.zeros(2)})
    flip_one_byte(path / ckpt.shard_name(0))
    write_checkpoint(tmp_path, 4, {"w": torch.ones(2)})
    assert torch.equal(ckpt.load_student_state(path)[0]["w"], torch.ones(2))
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert not list(tmp_path.glob("step_*.corrupt-*"))


def test_list_checkpoints_orders_by_step_and_ignores_other_entries(tmp_path):
    for step in (12, 3, 100):
        write_checkpoint(tmp_path, step)
    ckpt.begin_checkpoint(tmp_path, 200)  # unfinished
    (tmp_path / "step_7").mkdir()  # not the naming scheme
    (tmp_path / "notes.txt").write_text("x")
    assert steps(ckpt.list_checkpoints(tmp_path)) == [3, 12, 100]
    assert ckpt.list_checkpoints(tmp_path / "absent") == []


def test_prune_keeps_the_newest_and_removes_stray_temporaries(tmp_path):
    for step in (1, 2, 3, 4):
        write_checkpoint(tmp_path, step)
    stray = ckpt.begin_checkpoint(tmp_path, 5)
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert steps(ckpt.list_checkpoints(tmp_path)) == [3, 4]
    assert not stray.exists()


# ----------------------------------------------------------------------------- corruption and versions

def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda p: flip_one_byte(p / ckpt.shard_name(0)), "shard_00.pt is corrupt or truncated (checksum mismatch)"),
    (lambda p: (p / ckpt.STATE_FILE).write_bytes((p / ckpt.STATE_FILE).read_bytes()[:-10]),
     "state.pt is corrupt or truncated"),
    (lambda p: (p / ckpt.shard_name(0)).unlink(), "shard_00.pt is missing"),
    (lambda p: (p / ckpt.MANIFEST).write_text("{not json"), "manifest.json is corrupt"),
    (lambda p: (p / ckpt.MANIFEST).unlink(), "has no manifest.json: it is not a finished checkpoint"),
], ids=["flipped-byte", "truncated", "missing-file", "garbled-manifest", "no-manifest"])
def test_damage_is_detected_and_the_previous_checkpoint_is_used(tmp_path, damage, message):
    write_checkpoint(tmp_path, 1)
    newest = write_checkpoint(tmp_path, 2)
    damage(newest)
    with pytest.raises(ckpt.CheckpointError, match=re.escape(message)):
        ckpt.verify_checkpoint(newest)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load_student_state(newest)
    skipped = []
    ref = ckpt.latest_valid_checkpoint(tmp_path, on_skip=lambda r, e: skipped.append((r.step, str(e))))
    assert ref.step == 1
    assert len(skipped) == 1 and skipped[0][0] == 2 and message in skipped[0][1]


def test_no_valid_checkpoint_gives_none(tmp_path):
    flip_one_byte(write_checkpoint(tmp_path, 1) / ckpt.shard_name(0))
    assert ckpt.latest_valid_checkpoint(tmp_path) is None


def test_resume_auto_skips_a_corrupt_checkpoint_and_says_so(tmp_path):
    root = tmp_path / "checkpoints"
    write_checkpoint(root, 10)
    flip_one_byte(write_checkpoint(root, 20) / ckpt.STATE_FILE)
    lines: list[str] = []
    resume = resolve_resume("auto", tmp_path, log=lines.append)
    assert resume == root / "step_00000010"
    assert len(lines) == 1 and "skipping checkpoint" in lines[0] and "step_00000020" in lines[0]


def test_another_format_version_is_refused_with_a_fix(tmp_path):
    path = write_checkpoint(tmp_path, 1)
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    manifest["format_version"] = ckpt.FORMAT_VERSION + 1
    (path / ckpt.MANIFEST).write_text(json.dumps(manifest))
    expected = (f"format version {ckpt.FORMAT_VERSION + 1}, this Synapse reads version {ckpt.FORMAT_VERSION}; "
                "resume it with the Synapse release that wrote it")
    with pytest.raises(ckpt.CheckpointError, match=re.escape(expected)):
        ckpt.load_student_state(path)
    assert ckpt.latest_valid_checkpoint(tmp_path) is None


class _RunsCodeWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def test_a_checkpoint_holding_code_is_never_executed(tmp_path):
    marker = tmp_path / "code-was-executed"
    write_checkpoint(tmp_path / "ckpts", 1, {"w": torch.zeros(1), "evil": _RunsCodeWhenUnpickled(marker)})
    with pytest.raises(Exception, match="Weights only load failed"):
        ckpt.load_student_state(tmp_path / "ckpts" / "step_00000001")
    assert not marker.exists()


# ----------------------------------------------------------------------------- killed while writing
# The child saves checkpoint A (step 1) completely, then starts checkpoint B (step 2). To make
# the SIGKILL land at a known point, the child stalls there and tells us by creating a file:
#   mid_shard:     torch.save's file object lets the first 8 MB of B's 16 MB shard through, then
#                  stalls (the shard on disk is a torn, partial file);
#   before_commit: B's shard and state are complete, the manifest and rename have not happened.
# We then SIGKILL it: no Python cleanup, exactly what a crashed node leaves behind.

CHILD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    from synapse import checkpoint as ckpt

    root, ready, kill_point = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def stall():
        ready.touch()
        time.sleep(600)

    class StallHalfwayThroughTheShard:
        # Passes writes through until 8 MB are on disk (half of B's shard), however torch chunks them.
        def __init__(self, file, stall_after=8_000_000):
            self.file, self.written, self.stall_after = file, 0, stall_after
        def write(self, data):
            if self.written + len(data) < self.stall_after:
                self.written += len(data)
                return self.file.write(data)
            self.file.write(bytes(memoryview(data)[: self.stall_after - self.written]))
            self.file.flush()
            os.fsync(self.file.fileno())
            stall()
        def flush(self):
            self.file.flush()

    def save(step, tensor):
        tmp = ckpt.begin_checkpoint(root, step)
        ckpt.save_tensor_file({"model": {"w": tensor}, "optim": {"w": {"step": step}}}, tmp / ckpt.shard_name(0))
        ckpt.save_tensor_file({"step": step}, tmp / ckpt.STATE_FILE)
        return ckpt.commit_checkpoint(tmp, step)

    save(1, torch.arange(1000.0))
    if kill_point == "mid_shard":
        real_save = torch.save
        torch.save = lambda obj, f, *a, **k: real_save(obj, StallHalfwayThroughTheShard(f), *a, **k)
    else:
        ckpt.commit_checkpoint = lambda *a, **k: stall()
    save(2, torch.ones(4_000_000))
    sys.exit("the child was not killed")
""")


def wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("child never reached the kill point")
        time.sleep(0.05)


@pytest.mark.slow  # a subprocess killed while it writes
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kill_point", ["mid_shard", "before_commit"])
def test_sigkill_while_writing_leaves_the_previous_checkpoint_loadable(tmp_path, kill_point):
    root, ready = tmp_path / "checkpoints", tmp_path / "ready"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(ready), kill_point], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready, proc, timeout=90)
        (tmp,) = root.glob("step_00000002.tmp-*")  # B is in progress, A is finished
        shard = tmp / ckpt.shard_name(0)
        if kill_point == "mid_shard":
            assert shard.stat().st_size == 8_000_000 and not (tmp / ckpt.STATE_FILE).exists()
        else:
            assert shard.stat().st_size > 4_000_000 * 4 and (tmp / ckpt.STATE_FILE).is_file()
        assert not (tmp / ckpt.MANIFEST).exists()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert steps(ckpt.list_checkpoints(root)) == [1]
    ref = ckpt.latest_valid_checkpoint(root)
    model, optim = ckpt.load_student_state(ref.path)
    assert ref.step == 1 and torch.equal(model["w"], torch.arange(1000.0)) and optim == {"w": {"step": 1}}
    assert tmp.exists()  # the torn write stays aside until the next prune
    path = write_checkpoint(root, 2, {"w": torch.ones(3)})  # the run can carry on writing B
    ckpt.prune_checkpoints(root, keep=2)
    assert not tmp.exists() and ckpt.latest_valid_checkpoint(root).path == path
