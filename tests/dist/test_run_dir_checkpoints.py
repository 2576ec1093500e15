"""A run directory's checkpoints in real ``python train.py`` runs (issue #33, items 4, 5 and 6).

One real run (two CPU pipeline ranks under the failover supervisor, 10 steps of a 15-step schedule, a checkpoint every
5, ``checkpoint.keep=2``) leaves steps 5 and 10; each test works on its own copy of that
directory, as a user's next command would:

* a fresh run (``resume=null``) into it is refused before anything starts, naming
  ``resume=auto`` and a new directory, and the earlier run's files stay as they were; the
  ``resume=auto`` it names continues the earlier run, and pruning then takes only that run's own;
* with a flipped byte in the newest checkpoint's ``.metadata``, ``resume=auto`` says so and
  continues from the previous one;
* with every checkpoint damaged, ``resume=auto`` stops naming each damage and the setting that
  starts over, instead of training from step 0;
* ``resume=auto`` with settings that change what is learned (``kd.T``, ``data.batch_size``) is
  refused before any work, naming each key with its recorded value.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from synapse import checkpoint as ckpt
from synapse.failover import read_segments
from tests.conftest import repo_env

from .helpers import BASE_OVERRIDES

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
REPO_ROOT = Path(__file__).resolve().parents[2]


def train_py(run_dir: Path, *extra: str, teacher: Path) -> subprocess.CompletedProcess:
    # 15 steps, of which the earlier run trains 10 (trainer.stop_after): a resume continues the same
    # schedule, since one that changed trainer.max_steps would learn on another LR schedule (refused)
    args = [*BASE_OVERRIDES, "trainer.devices=2", "trainer.max_steps=15", "checkpoint.every=5", "checkpoint.keep=2",
            "report=false", f"teacher.checkpoint={teacher}", f"run_dir={run_dir}",
            f"hydra.run.dir={run_dir.parent / (run_dir.name + '.hydra')}", *extra]
    return subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *args], cwd=REPO_ROOT, env=repo_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory, teacher_file) -> Path:
    run_dir = tmp_path_factory.mktemp("earlier") / "run"
    done = train_py(run_dir, "trainer.stop_after=10", teacher=teacher_file)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture
def used_dir(earlier_run, tmp_path) -> Path:
    """A copy of the earlier run's directory (checkpoints 5 and 10, its config, records and logs)."""
    run_dir = tmp_path / "run"
    shutil.copytree(earlier_run, run_dir, symlinks=True)
    return run_dir


def digest(run_dir: Path) -> dict[str, str]:
    """Every file of the earlier run that a refused command must leave as it was."""
    files = [run_dir / "config.yaml", *sorted((run_dir / "checkpoints").rglob("*"))]
    return {str(f.relative_to(run_dir)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def launches(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "logs").glob("launch_*"))


def steps(run_dir: Path) -> list[int]:
    return [c.ref.step for c in ckpt.ordered_checkpoints(run_dir / "checkpoints")]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_fresh_run_into_a_used_run_dir_is_refused_and_resume_auto_continues_the_earlier_run(used_dir, teacher_file):
    before, launched = digest(used_dir), launches(used_dir)
    identity = json.loads((used_dir / "checkpoints" / ckpt.RUN_FILE).read_text())["run"]
    fresh = train_py(used_dir, teacher=teacher_file)
    assert fresh.returncode == 2 and "Traceback" not in fresh.stderr, fresh.stderr[-3000:]  # one line, its fix
    assert (f"synapse: {used_dir} already holds the checkpoints of an earlier run (2 checkpoints in "
            f"{used_dir / 'checkpoints'}, steps 5, 10) and resume=null starts a fresh run: its checkpoints would mix "
            f"with those, and a later resume=auto could continue the earlier run's. Nothing was started, and the "
            f"earlier run's files are untouched. Fix: continue the earlier run with resume=auto, or start this one "
            f"in a new directory (run_dir=<new directory>)") in fresh.stderr, fresh.stderr[-3000:]
    assert digest(used_dir) == before and launches(used_dir) == launched

    continued = train_py(used_dir, "resume=auto", teacher=teacher_file)
    assert continued.returncode == 0, continued.stderr[-3000:]
    last = read_segments(used_dir)[-1]
    assert last.start_step == 10 and last.resume == str(used_dir / "checkpoints" / "step_00000010")
    assert steps(used_dir) == [10, 15]  # keep=2: the run's own step 5 pruned
    assert {c.run for c in ckpt.ordered_checkpoints(used_dir / "checkpoints")} == {identity}


@pytest.mark.extended  # checkpoint choice on damage is unit-tested on real checkpoints; here through train.py
def test_a_flipped_byte_in_the_newest_metadata_resumes_from_the_previous_checkpoint(used_dir, teacher_file):
    newest = used_dir / "checkpoints" / "step_00000010"
    flip_byte(newest / ckpt.dcp_store.METADATA_FILE)
    resumed = train_py(used_dir, "resume=auto", teacher=teacher_file)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]  # was: refused as "cannot be read safely"
    assert (f"skipping checkpoint {newest}: {newest}: .metadata is corrupt or truncated (checksum mismatch)"
            in output), output[-3000:]
    last = read_segments(used_dir)[-1]
    assert last.start_step == 5 and last.resume == str(used_dir / "checkpoints" / "step_00000005")
    assert steps(used_dir) == [10, 15]  # step 10 trained again and saved in place of the damaged copy
    ckpt.verify_checkpoint(newest)
    assert not list((used_dir / "checkpoints").glob("step_*.corrupt-*"))


def test_resume_auto_over_only_damaged_checkpoints_is_refused_naming_each(used_dir, teacher_file):
    root = used_dir / "checkpoints"
    flip_byte(root / "step_00000010" / ckpt.dcp_store.METADATA_FILE)
    state = root / "step_00000005" / ckpt.STATE_FILE
    state.write_bytes(state.read_bytes()[:100])
    before, launched = digest(used_dir), launches(used_dir)
    refused = train_py(used_dir, "resume=auto", teacher=teacher_file)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (f"synapse: resume=auto: none of the 2 checkpoints in {root} is intact, so there is "
            f"nothing to continue from (step_00000010: {root / 'step_00000010'}: .metadata is corrupt or truncated "
            f"(checksum mismatch); step_00000005: {root / 'step_00000005'}: state.pt is corrupt or truncated "
            f"(checksum mismatch)). Nothing was started and nothing was deleted. Fix: put back an intact copy of one "
            f"of them (e.g. from a backup); or, to start over from step 0, run with resume=null in a new run_dir "
            f"(run_dir=<new directory>), which leaves these checkpoints as they are for inspection"
            ) in refused.stderr, refused.stderr[-3000:]
    assert "no checkpoint yet, starting fresh" not in refused.stdout + refused.stderr
    assert digest(used_dir) == before  # refused by validate: not even config.yaml rewritten
    assert launches(used_dir) == launched


def test_a_resume_that_would_learn_with_other_settings_is_refused_before_any_work(used_dir, teacher_file):
    # issue #33, item 5: was accepted, and distilled at another temperature from the resume step on
    before, launched = digest(used_dir), launches(used_dir)
    refused = train_py(used_dir, "resume=auto", "kd.T=2.0", "data.batch_size=8", teacher=teacher_file)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    message = refused.stderr
    assert (f"synapse: resume: this run would learn with other settings than the run it continues (recorded in "
            f"{used_dir / 'config.yaml'}): ") in message, message[-3000:]
    for named in ("kd.T=4.0 (now 2.0)", "data.batch_size=16 (now 8)", "Fix: continue it with the recorded values (",
                  "or start a new run with the new ones: resume=null in a new run directory"):
        assert named in message, message[-3000:]
    assert digest(used_dir) == before and launches(used_dir) == launched
