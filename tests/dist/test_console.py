"""What a user sees on the console of a supervised run (issue #18, item 1).

``python train.py`` in a subprocess with its output in a pipe (so off a terminal, as in a
submitit ``.err`` file): 3 CPU ranks, a fire drill that re-partitions live at step 6 (every rank
logs it) and rank 2 killed at step 14 (a restart from the checkpoint of step 12). The console
must carry one progress (a few plain lines, no per-refresh lines), only rank 0's worker lines,
the failed rank's last lines, and the failover story; every rank's lines must be in its own log
file in the run dir, and train.log must hold the supervisor's lines.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from synapse.launch import rank_log_files
from tests.conftest import repo_env

from .helpers import BASE_OVERRIDES

pytestmark = [pytest.mark.dist, pytest.mark.extended]
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
PROGRESS_LINE = re.compile(r"step \d+/\d+ \(\d+%\)")


def train_py(run_dir: Path, teacher_file: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [*BASE_OVERRIDES, "trainer.progress=true", f"trainer.max_steps={STEPS}", "trainer.devices=3",
            f"teacher.checkpoint={teacher_file}", "checkpoint.every=4", "report=false", "logger=none",
            "failover.drills=[{step:6,action:replan}]",
            "injection.faults=[{kind:kill,rank:2,step:14,phase:forward}]",
            # a live REPLAN restarts nothing: the kill after it still has its one restart (it once counted)
            "failover.max_restarts=1", *extra, f"hydra.run.dir={run_dir}"]
    return subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *args], cwd=REPO_ROOT, env=repo_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=280, check=False)


@pytest.mark.timeout(300)
def test_a_supervised_run_prints_one_progress_rank_0_and_the_failed_ranks_tail(tmp_path, teacher_file):
    run_dir = tmp_path / "run"
    done = train_py(run_dir, teacher_file)
    console = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-4000:]
    assert len(console) <= 40, f"{len(console)} console lines:\n{done.stdout}"
    # Off a terminal: a plain line per quarter of the run, never a refresh per line or a worker's bar.
    progress = [line for line in console if PROGRESS_LINE.search(line)]
    assert 1 <= len(progress) <= 5, progress
    assert not any("it/s" in line or "step/s" in line or "\r" in line for line in console)
    assert any("step 20/20 (100%)" in line for line in progress), progress
    # Worker lines: rank 0's on the console (named), the others only in their log files.
    repartitions = [line for line in console if line.startswith("[rank") and "live re-partition at step" in line]
    assert [line.split("]")[0] for line in repartitions] == ["[rank 0"], repartitions
    assert not any(line.startswith(("[rank 1]", "[rank 2]", "[default")) for line in console)
    # The failed rank (2, not shown) gets its last lines printed, then the run recovers.
    tail = [i for i, line in enumerate(console) if "of rank 2's stdout.log" in line]
    assert tail, done.stdout
    assert "live re-partition at step" in console[tail[0] + 1], console[tail[0]:tail[0] + 3]
    assert not any("Traceback" in line or "exitcode" in line for line in console), "torch's agent: train.log only"
    assert any(line.startswith("failover (eta policy") for line in console), "the failover story"
    assert any("distilled student" in line for line in console), "the final summary"
    for rank in (1, 2):
        files = rank_log_files(run_dir / "logs" / "launch_0", rank)
        assert [f.name for f in files] == ["stdout.log", "stderr.log"]
        assert "live re-partition at step" in files[0].read_text()
    log = (run_dir / "train.log").read_text()
    assert "failover: REPLAN at step" in log and "distilled student" in log
    # which rank's exit torch's agent reports first is a race (the killed one, or a peer that lost it)
    assert "failed (exitcode:" in log, "torch's agent's lines are kept in train.log"


@pytest.mark.timeout(300)
@pytest.mark.long  # 17 s; the default filter ([0]) and the failed rank's tail stay in the default suite
def test_local_ranks_filter_null_shows_every_rank_and_no_second_copy_of_the_failed_ones(tmp_path, teacher_file):
    done = train_py(tmp_path / "run", teacher_file, "trainer.local_ranks_filter=null")
    assert done.returncode == 0, done.stdout[-4000:]
    console = done.stdout.splitlines()
    shown = {line.split("]")[0] for line in console if line.startswith("[rank") and "live re-partition" in line}
    assert shown == {"[rank 0", "[rank 1", "[rank 2"}, done.stdout
    assert any("failover: device 2 (rank 2) failed" in line for line in console), done.stdout
    assert not any("of rank 2's stdout.log" in line for line in console), "rank 2's lines were shown already"
