"""A run refused by the run-dir lock writes nothing into the directory (issue #33, items 13 and 15).

Hydra writes ``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml`` and opens ``train.log``
before the job starts, and the lock was taken in the job: a second ``python train.py`` into a
running run's directory was refused, but only after it had overwritten the running run's Hydra
records and appended to its log. A directory that cannot be written failed inside Hydra with a
raw ``OSError``. The lock is now taken by a Hydra callback before Hydra writes anything.

Real processes: the holder is a process holding the lock as a running supervisor does.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TINY_RUN, repo_env

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

HOLDER = """
import sys, time
from pathlib import Path
from synapse.rundir import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("holding", flush=True)
    time.sleep(200)
"""


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def train_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *TINY_RUN, "trainer.max_steps=2", *args],
                          cwd=REPO_ROOT, env=repo_env(), capture_output=True, text=True, timeout=200)


def test_a_run_refused_by_the_lock_leaves_the_running_runs_files_untouched(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run_dir / ".hydra" / name).write_text(f"# the running run's {name}\n")
    (run_dir / "train.log").write_text("[the running run's log]\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env=repo_env())
    try:
        assert holder.stdout.readline().strip() == "holding"
        before = digest(run_dir)
        second = train_py(f"hydra.run.dir={run_dir}", "seed=7")
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 1, second.stderr[-3000:]
    assert second.stderr.startswith(f"synapse: RunDirInUseError: run directory {run_dir} is in use: another Synapse "
                                    f"supervisor (pid {holder.pid}"), second.stderr[-3000:]
    assert "Fix:" in second.stderr and "Traceback" not in second.stderr
    after = digest(run_dir)
    changed = sorted(set(after) ^ set(before)) + [k for k in before if after.get(k) != before[k]]
    assert after == before, f"the refused run wrote into the running run's directory: {changed}"


def test_a_run_directory_that_cannot_be_written_is_named_with_the_fix(tmp_path):
    # /sys takes no new file, root included (a read-only directory that needs no mount rights)
    assert not os.access("/sys", os.W_OK) or os.geteuid() == 0
    result = train_py("hydra.run.dir=/sys")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith("synapse: RunDirUnusableError: run directory /sys cannot be used: Permission "
                                    "denied (/sys/.synapse.lock). Fix: give a writable directory"), \
        result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "OSError" not in result.stderr


@pytest.mark.extended  # every run of the suite takes the lock through the callback; this one through train.py itself
def test_the_lock_taken_before_hydra_still_lets_the_run_itself_finish(tmp_path):
    # The control: the callback's hold and the run's own hold of the same directory are one (re-entrant)
    run_dir = tmp_path / "run"
    result = train_py(f"hydra.run.dir={run_dir}", "report=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
