"""``python train.py`` as a user runs it: the embedded default end to end, and bad overrides refused.

Each test is a real subprocess (Hydra's own command line, logging and exit code), with this
session's temporary SYNAPSE_CACHE and a run directory under pytest's tmp_path.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

# What Hydra itself leaves in a run directory before the job function starts.
HYDRA_ONLY = {".hydra", "train.log"}


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~30-60 s on two idle cores; generous for a loaded machine
def test_default_run_trains_a_teacher_then_distils_a_student_above_90_percent(train_py, tmp_path):
    run_dir, cache = tmp_path / "default", tmp_path / "cache"  # a cache of its own: the teacher is trained here
    result = train_py([f"hydra.run.dir={run_dir}"], timeout=880, SYNAPSE_CACHE=str(cache))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training resnet_mini on digits with labels" in result.stdout
    assert list((cache / "teachers").glob("resnet_mini-*.pt"))
    match = re.search(r"distilled student resnet_micro: val top-1 (\d+\.\d+)% \(teacher (\d+\.\d+)%\)", result.stdout)
    assert match, result.stdout[-3000:]
    student_top1, teacher_top1 = map(float, match.groups())
    assert student_top1 >= 90.0 and teacher_top1 >= 90.0
    assert (run_dir / "summary.json").is_file() and (run_dir / "metrics.jsonl").is_file()
    # The demo's story: a slowdown detected, an ETA decision that acted, a second segment, a report.
    experiment = json.loads((run_dir / "experiment_summary.json").read_text())
    assert experiment["policy"] == "eta" and len(experiment["segments"]) >= 2
    acted = [d for d in experiment["decisions"] if d["action"] != "keep"]
    assert acted and all(set(d["eta_s"]) >= {"keep", "replan", "degrade"} for d in acted)
    assert "slowdown_detected" in (run_dir / "failover_events.jsonl").read_text()
    assert "predicted time to finish" in result.stdout and (run_dir / "report" / "report.md").is_file()


BAD_OVERRIDES = [
    (["kd.T=0"], "kd.T: must be > 0, got 0.0. Fix: set kd.T to a value > 0"),
    (["teacher=nope"], "Could not find 'teacher/nope'"),
]  # wrong types and misspelt keys: the same path, tested in-process in test_config.py
if not torch.cuda.is_available():
    BAD_OVERRIDES.append((["trainer.accelerator=cuda"],
                          "trainer.accelerator: cuda requested but no CUDA device is visible. "
                          "Fix: use trainer.accelerator=cpu"))


@pytest.mark.slow  # a train.py subprocess each (Hydra and torch start up)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides, message", BAD_OVERRIDES, ids=[" ".join(o) for o, _ in BAD_OVERRIDES])
def test_bad_override_fails_with_a_clear_message_and_no_run_output(train_py, tmp_path, overrides, message):
    run_dir = tmp_path / "run"
    result = train_py([*overrides, f"hydra.run.dir={run_dir}"], timeout=110)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-3000:]
    if "Fix: " in message:  # Synapse's own check: one line, no stack, the usage-error exit code
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    left = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
    assert left <= HYDRA_ONLY, f"the failed run wrote {sorted(left - HYDRA_ONLY)}"


@pytest.mark.slow  # a train.py subprocess
@pytest.mark.timeout(120)
def test_a_sweep_value_that_cannot_be_composed_refuses_the_sweep_before_any_job_runs(train_py, tmp_path):
    """Issue #33, item 11: a value of the wrong type (a typo) is found by Hydra when it composes
    every job of the batch, before the first job starts: nothing runs, no job folder is left.
    (A value that composes but fails validation or at run time fails only its own job:
    tests/dist/test_sweep_failed_jobs.py.)"""
    sweep = tmp_path / "sweep"
    result = train_py(["-m", f"hydra.sweep.dir={sweep}", "trainer=cpu", "kd.T=4,abc,2"], timeout=110)
    assert result.returncode != 0
    assert "Error merging override kd.T=abc" in result.stderr, result.stderr[-3000:]
    assert "could not be converted to Float" in result.stderr, result.stderr[-3000:]
    jobs = [p for p in sweep.iterdir() if p.is_dir()] if sweep.exists() else []
    assert not jobs, f"a job ran before the sweep was refused: {jobs}"
