"""Damaged records the supervisor reads do not end a run that can train (issue #33, item 7).

Before: a torn last line in ``failover_events.jsonl`` (a run killed mid-append), then a resume and
a killed rank: the resumed run's first event was appended to the torn piece, the supervisor's
reader met a line that is not JSON and died of ``EventLogError``. A performance record with
missing keys, or a garbage line, let training finish and then failed the comparison of the plan
with the run (``KeyError 'ranks'`` / ``RecordFileError``): exit 1, no report. Now the run ends 0
with its report (over the garbage line the report is drawn and names the line it left out).

Real processes: one stopped run of a tiny 2-rank CPU pipeline (3 of 6 steps, planned:
``partition=auto``), its records then damaged as a kill or a stray writer leaves them, then
``resume=auto`` with rank 1 killed at step 5.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import TINY_RUN

# generous limits: a loaded machine (other test runs beside) makes each run several times slower
pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

RUN = (*TINY_RUN, "partition=auto", "trainer.devices=2", "data.batch_size=16", "trainer.max_steps=6",
       "checkpoint.every=3")


def train_py_in(train_py, run_dir: Path, *extra: str):
    return train_py([*RUN, f"hydra.run.dir={run_dir}", *extra], timeout=420)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    from tests.conftest import run_train_py

    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    first = train_py_in(run_train_py, run_dir, "trainer.stop_after=3", "report=false")
    assert first.returncode == 0, first.stderr[-3000:]
    return run_dir


@pytest.mark.parametrize("damage", ["missing keys", pytest.param("garbage line", marks=pytest.mark.extended)])
def test_a_resume_over_damaged_records_trains_to_the_end_and_reports(train_py, stopped_run, tmp_path, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir, ignore=shutil.ignore_patterns(".synapse*.lock"))
    with open(run_dir / "failover_events.jsonl", "a") as events:
        events.write('{"time": 1.0, "source": "worker", "event": "checkpoint_sa')  # a kill mid-append
    with open(run_dir / "performance.jsonl", "a") as performance:
        performance.write('{"step": 4, "segment": 0}\n' if damage == "missing keys" else "garbage\n")

    resumed = train_py_in(train_py, run_dir, "resume=auto", "injection.faults=[{kind:kill,rank:1,step:5}]")
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-4000:]
    assert "EventLogError" not in output and "Traceback" not in output, output[-4000:]
    summary = json.loads((run_dir / "experiment_summary.json").read_text())
    assert summary["steps"] == summary["total_steps"] == 6, "the resumed run trained to its end"
    assert summary["restarts"], "the killed rank was restarted: the supervisor read the events after the torn line"
    report = (run_dir / "report" / "report.md").read_text()
    if damage == "garbage line":  # left out of the report, and named in it
        assert f"{run_dir / 'performance.jsonl'}:4 is not JSON" in report.split("## Damaged records left out")[1]
    assert (f"planner: comparison of the plan with the run skipped: {run_dir / 'performance.jsonl'} or "
            f"{run_dir / 'plan.json'} holds a record it cannot read (") in output, output[-4000:]
    # the torn piece was cut off: every line of the event log is a record again
    lines = (run_dir / "failover_events.jsonl").read_text().splitlines()
    assert all(json.loads(line)["event"] for line in lines)
