"""Format 2: tensors in torch.distributed.checkpoint storage, saved asynchronously by the Checkpointer.

Round trip through the real ``Checkpointer`` (one process, no process group), the state frozen at
``save`` time although training goes on, the previous save finished before the next starts, code
in DCP's index or values never run, and a process SIGKILLed while DCP writes in the background
leaving the previous checkpoint in use.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from synapse import checkpoint as ckpt
from synapse.checkpoint import dcp_store
from synapse.engine import Checkpointer, HeldState, HostBufferStager, SingleShard, optimizer_state_by_name
from synapse.injection import FaultInjector
from tests.conftest import repo_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def training_state(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    for _ in range(2):
        model(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def held(model, optimizer, scheduler) -> HeldState:
    return HeldState(model.state_dict(keep_vars=True), optimizer, scheduler, {})


def checkpointer(root: Path, **kwargs) -> Checkpointer:
    return Checkpointer(root, 3, "tiny", SingleShard(), FaultInjector([], rank=0), **kwargs)


def test_async_round_trip_is_exact_and_holds_the_state_of_the_save_not_later(tmp_path):
    model, optimizer, scheduler = training_state()
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    expected_optim = optimizer_state_by_name(optimizer, dict(model.named_parameters()))
    saver = checkpointer(tmp_path)
    saver.save(4, held(model, optimizer, scheduler), {"epoch": 0})
    with torch.no_grad():  # training goes on while DCP writes: the checkpoint must not see it
        for p in model.parameters():
            p.add_(100.0)
    saver.close()
    path = tmp_path / ckpt.step_dir_name(4)
    manifest = ckpt.verify_checkpoint(path)
    assert manifest["format_version"] == ckpt.FORMAT_VERSION == 2
    assert set(manifest["files"]) == {dcp_store.METADATA_FILE, "__0_0.distcp", ckpt.STATE_FILE}

    fresh, fresh_optimizer, fresh_scheduler = training_state(seed=1)
    step, sampler = checkpointer(tmp_path).load(path, held(fresh, fresh_optimizer, fresh_scheduler))
    assert (step, sampler) == (4, {"epoch": 0})
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    loaded = optimizer_state_by_name(fresh_optimizer, dict(fresh.named_parameters()))
    assert loaded.keys() == expected_optim.keys()
    for name, state in expected_optim.items():
        assert all(torch.equal(loaded[name][k], v) for k, v in state.items()), name
    assert fresh_scheduler.state_dict() == scheduler.state_dict()


def test_a_save_stages_only_after_the_previous_one_is_committed(tmp_path):
    # The staging buffers are reused: staging save 2 before save 1 is on disk would overwrite what
    # DCP is still writing. The order of what happened tells.
    order: list[str] = []

    class RecordingStager(HostBufferStager):
        def stage(self, state_dict, **kwargs):
            order.append(f"stage {state_dict['model/0.weight'][0, 0].item():.0f}")
            return super().stage(state_dict, **kwargs)

    model, optimizer, scheduler = training_state()
    saver = checkpointer(tmp_path, on_saved=lambda step, *rest: order.append(f"committed {step}"))
    saver._stager = RecordingStager(torch.device("cpu"))
    with torch.no_grad():
        for step in (1, 2):
            model[0].weight[0, 0] = step
            saver.save(step, held(model, optimizer, scheduler), {})
    saver.close()
    assert order == ["stage 1", "committed 1", "stage 2", "committed 2"]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_save_that_waits_for_the_previous_write_says_to_raise_checkpoint_every(tmp_path, monkeypatch):
    model, optimizer, scheduler = training_state()
    # the first commit takes 0.3 s (longer than the loop takes to reach the next save)
    saver = checkpointer(tmp_path, on_saved=lambda step, *rest: time.sleep(0.3) if step == 1 else None)
    # A handler on the logger itself: in the full suite an earlier in-process run's logging config
    # (Hydra's dictConfig) may have disabled existing loggers or stopped their propagation to the root.
    log, handler = logging.getLogger("synapse.engine.checkpointer"), _Records()
    monkeypatch.setattr(log, "disabled", False)
    monkeypatch.setattr(log, "level", logging.WARNING)
    log.addHandler(handler)
    try:
        for step in (1, 2, 3):
            saver.save(step, held(model, optimizer, scheduler), {})
        saver.close()
    finally:
        log.removeHandler(handler)
    warnings = [r.getMessage() for r in handler.records if "raise checkpoint.every" in r.getMessage()]
    assert len(warnings) == 1 and "step 2 waited" in warnings[0], warnings  # said once, at the save that waited


def test_a_checkpoint_from_another_partition_loads_by_name(tmp_path):
    # Two "ranks" of one model write disjoint names; one process reads both back by name.
    path = tmp_path / "parts"
    dcp.save({"model/a.weight": torch.ones(2), "optim/a.weight/step": torch.tensor(3.0)},
             checkpoint_id=str(path), no_dist=True)
    model, optim = dcp_store.split_state(dcp_store.read_state(path))
    assert torch.equal(model["a.weight"], torch.ones(2)) and optim == {"a.weight": {"step": torch.tensor(3.0)}}


class _RunsCodeWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def committed_dcp_checkpoint(root: Path, entries: dict) -> Path:
    tmp = ckpt.begin_checkpoint(root, 1)
    dcp.save(entries, checkpoint_id=str(tmp), no_dist=True)
    ckpt.save_tensor_file({"step": 1}, tmp / ckpt.STATE_FILE)
    return ckpt.commit_checkpoint(tmp, 1)


def test_code_in_a_dcp_value_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "code-was-executed"
    path = committed_dcp_checkpoint(tmp_path / "ckpts", {"model/w": torch.zeros(1),
                                                         "optim/w/evil": _RunsCodeWhenUnpickled(marker)})
    with pytest.raises(ckpt.UnsafeCheckpointError, match="cannot be read safely"):
        ckpt.load_student_state(path)
    assert not marker.exists()


def test_code_in_dcp_metadata_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "code-was-executed"
    tmp = ckpt.begin_checkpoint(tmp_path / "ckpts", 1)
    dcp.save({"model/w": torch.zeros(1)}, checkpoint_id=str(tmp), no_dist=True)
    (tmp / dcp_store.METADATA_FILE).write_bytes(pickle.dumps(_RunsCodeWhenUnpickled(marker)))
    ckpt.save_tensor_file({"step": 1}, tmp / ckpt.STATE_FILE)  # every checkpoint has one: verified first
    path = ckpt.commit_checkpoint(tmp, 1)  # checksums match the planted file: only the unpickler stands
    for load in (ckpt.load_student_state, lambda p: ckpt.check_resumable(p, "x", {"w": (1,)})):
        with pytest.raises(ckpt.UnsafeCheckpointError, match="not part of DCP's metadata"):
            load(path)
    assert not marker.exists()


def test_shapes_come_from_dcp_metadata_and_another_model_is_refused(tmp_path):
    path = committed_dcp_checkpoint(tmp_path / "ckpts", {"model/w": torch.zeros(2, 3)})
    ckpt.check_resumable(path, "x", {"w": (2, 3)})
    with pytest.raises(ckpt.IncompatibleCheckpointError, match=r"w has shape \(2, 3\) in the checkpoint"):
        ckpt.check_resumable(path, "x", {"w": (3, 3)})


def test_a_nonfinite_state_is_never_committed(tmp_path):
    model, optimizer, scheduler = training_state()
    saver = checkpointer(tmp_path)
    saver.save(1, held(model, optimizer, scheduler), {})
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    saver.save(2, held(model, optimizer, scheduler), {})  # checked off the loop, on the staged copy
    with pytest.raises(ckpt.NonFiniteCheckpointError, match="model/0.weight"):
        saver.close()  # the end of the run (or the next save) says it
    assert [r.step for r in ckpt.list_checkpoints(tmp_path)] == [1] and not list(tmp_path.glob("*.tmp-*"))


# ----------------------------------------------------------------------------- SIGKILL mid async save
# The child commits checkpoint A (step 1), then saves B (step 2) asynchronously. DCP's thread
# stalls right after writing B's data file, before fsync and before DCP's .metadata; the
# training thread, already past ``save``, says so. We SIGKILL the process there.
CHILD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    from synapse.engine.checkpointer import Checkpointer, HeldState, SingleShard
    from synapse.injection.injector import FaultInjector

    root, ready = Path(sys.argv[1]), Path(sys.argv[2])
    model = torch.nn.Linear(1000, 1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    saver = Checkpointer(root, 3, "tiny", SingleShard(), FaultInjector([], rank=0))
    held = lambda: HeldState(model.state_dict(keep_vars=True), optimizer, scheduler, {})
    saver.save(1, held(), {})
    saver.wait()
    real_fsync = os.fsync
    def fsync(fd):
        if (os.readlink(f"/proc/self/fd/{fd}").endswith(".distcp")
                and "step_00000002" in os.readlink(f"/proc/self/fd/{fd}")):
            (ready / "writer").touch()
            time.sleep(600)
        real_fsync(fd)
    os.fsync = fsync
    with torch.no_grad():
        model.weight.fill_(2.0)
    saver.save(2, held(), {})
    (ready / "loop").touch()  # the loop goes on while DCP writes
    time.sleep(600)
""")


@pytest.mark.slow  # a subprocess that saves with DCP until it is killed
@pytest.mark.timeout(120)
def test_sigkill_during_an_async_save_leaves_the_previous_checkpoint_in_use(tmp_path):
    root, ready = tmp_path / "checkpoints", tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(ready)],
                            env=repo_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not ((ready / "writer").exists() and (ready / "loop").exists()):
            assert proc.poll() is None, f"child exited early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "child never reached the kill point"
            time.sleep(0.05)
        (tmp,) = root.glob("step_00000002.tmp-*")
        assert list(tmp.glob("*.distcp")) and not (tmp / dcp_store.METADATA_FILE).exists()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [r.step for r in ckpt.list_checkpoints(root)] == [1]
    ref = ckpt.latest_valid_checkpoint(root)
    model, optim = ckpt.load_student_state(ref.path)
    assert ref.step == 1 and not torch.equal(model["weight"], torch.full((1000, 1000), 2.0))
    assert json.loads((ref.path / ckpt.MANIFEST).read_text())["format_version"] == 2


def test_prepared_buffers_are_the_ones_the_first_save_stages_into(tmp_path):
    # Pinning host memory is the slow part of a first save on a GPU: prepare() does it after the
    # first step, and the save then only copies.
    model, optimizer, scheduler = training_state()
    saver = checkpointer(tmp_path)
    saver.prepare(held(model, optimizer, scheduler))
    reserved = {key: t.data_ptr() for key, t in saver._stager.staged.items()}
    assert any(key.startswith(dcp_store.OPTIM) for key in reserved)  # the optimizer state too
    saver.save(1, held(model, optimizer, scheduler), {})
    assert {key: t.data_ptr() for key, t in saver._stager.staged.items()} == reserved
    saver.close()
