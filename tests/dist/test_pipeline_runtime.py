"""Pipeline runtime behaviour beyond equivalence: failures, partition-independent resume, records."""
from __future__ import annotations

import json
import time

import pytest

from synapse.app import run
from synapse.launch import WorkerFailure
from synapse.rundir import read_jsonl

from .helpers import assert_identical_states, compose_config, final_student_state

pytestmark = [pytest.mark.dist]
QUIET = dict(log=lambda message: None)


@pytest.mark.timeout(180)
def test_a_raising_rank_fails_the_launch_fast_with_its_error(tmp_path, teacher_file):
    # The collective timeout is far longer than the test's: failing in time proves the
    # launcher tore the other ranks down rather than waiting for a timeout.
    cfg = compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", "trainer.devices=3",
                                    "trainer.collective_timeout_s=900", "trainer.max_steps=8",
                                    "injection.faults=[{kind:raise,rank:1,step:3}]"])
    started = time.monotonic()
    with pytest.raises(WorkerFailure) as failure:
        run(cfg, **QUIET)
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert "rank 1 failed first" in message
    assert "InjectedFault" in message and "step 3" in message
    assert elapsed < 120, f"the failure took {elapsed:.0f} s to surface"


@pytest.mark.extended  # K=3 to K=2 across a restart is every DEGRADE of test_failover; here on its own
@pytest.mark.timeout(400)
def test_checkpoint_from_k3_resumes_on_k2_with_another_partition(tmp_path, teacher_file):
    reference_dir = tmp_path / "uninterrupted"
    run(compose_config(reference_dir, [f"teacher.checkpoint={teacher_file}", "trainer.devices=3"]), **QUIET)

    split_dir = tmp_path / "split"
    first = [f"teacher.checkpoint={teacher_file}", "trainer.devices=3", "trainer.stop_after=2",
             "partition=manual", "partition.teacher=[2,5,4]", "partition.student=[6,3,2]"]
    run(compose_config(split_dir, first), **QUIET)
    second = [f"teacher.checkpoint={teacher_file}", "trainer.devices=2", "resume=auto",
              "partition=manual", "partition.teacher=[7,4]", "partition.student=[3,8]"]
    run(compose_config(split_dir, second), **QUIET)
    assert_identical_states(final_student_state(split_dir), final_student_state(reference_dir))


@pytest.mark.timeout(200)
def test_performance_records_have_per_rank_timings(tmp_path, teacher_file):
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", "trainer.devices=3"]), **QUIET)
    records = read_jsonl(tmp_path / "performance.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        assert len(record["compute_s"]) == len(record["comm_s"]) == 3
        for rank in record["ranks"]:
            assert rank["teacher_fwd"] > 0 and rank["student_fwd"] > 0 and rank["student_bwd"] > 0
            assert rank["compute"] <= rank["wall"] + 1e-9
        assert record["ranks"][-1]["loss"] > 0  # the KD loss is computed on the last rank only
        assert record["ranks"][0]["loss"] == 0
    assert json.loads((tmp_path / "partition.json").read_text()) == {"devices": [0, 1, 2], "teacher": [4, 4, 3],
                                                                      "student": [4, 4, 3]}
