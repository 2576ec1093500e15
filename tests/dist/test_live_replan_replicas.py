"""A REPLAN of replicas is taken live: every replica is re-cut at a step boundary every rank agrees on, in the
same processes (blocks move between the ranks of each replica, the groups that sum the gradients are made for
the new cut), and the run still learns what one device learns.

R = 2 replicas of K = 2 CPU ranks (gloo), replica 1's last rank four times slower from step 2, policy=replan:
the re-cut lightens stage 1 of both replicas (a stage's replicas run the same blocks). The reference is one
device on the same global batches (a LayerNorm student, ``test_replicas``).
"""
from __future__ import annotations

import pytest

from synapse.app import run
from synapse.checkpoint import latest_valid_checkpoint, read_manifest
from synapse.failover import read_segments
from synapse.health import read_heartbeats
from synapse.rundir import events_path, read_events, read_jsonl

from .helpers import SHARED_GPU, assert_close_states, compose_config, final_student_state
from .test_replicas import COMMON, VIT, reference_run

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = ["trainer.max_steps=32"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher_file):
    """One device, the global batch in 4 micro-batches of 8, 32 steps."""
    return reference_run(tmp_path_factory.mktemp("reference"), teacher_file, 4, [*VIT, *STEPS])


def replanned_run(run_dir, teacher_file, mode: str) -> dict:
    return run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *STEPS,
                                        "trainer.devices=4", "trainer.replicas=2", "pipeline.microbatches=2",
                                        "policy=replan", f"failover.replan_mode={mode}",
                                        "injection.faults=[{kind:slow_compute,rank:3,start:2,factor:4}]"]),
               log=lambda m: None)


def test_a_replan_of_replicas_is_taken_live_in_the_same_processes_and_nothing_learnt_changes(tmp_path, teacher_file,
                                                                                           reference):
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    summary = replanned_run(tmp_path, teacher_file, "live")
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments][:2] == [("start", "replanned live"), ("replan (live)",
                                                              segments[1].outcome)]
    before, after = segments[0].placement, segments[1].placement
    assert after.same_ranks(before) and after.replicas == 2 and after.cut_alike
    assert after.student_counts[1] < before.student_counts[1], "the slow stage gave blocks away in both replicas"
    assert segments[1].start_step == segments[0].end_step, "no finished step lost, none done twice"
    changed_at = segments[0].end_step
    events = read_events(events_path(tmp_path))
    names = [e["event"] for e in events]
    # one launch: no relaunch, no stop, no checkpoint for one
    assert names.count("launch_ready") == 1 and "relaunch" not in names and "live_replan_failed" not in names
    assert not any(e["for_stop"] for e in events if e["event"] == "checkpoint_saved")
    first_live = next(e for e in events if e["event"] == "live_replan")
    assert first_live["step"] == changed_at and first_live["segment"] == 1
    # each replica moved the same blocks between its own two ranks
    assert first_live["moved_blocks"] == 2 * (before.student_counts[1] - after.student_counts[1])
    restart = summary["experiment"]["restarts"][0]
    assert (restart["mode"], restart["action"], restart["segment"]) == ("live", "replan", 1)
    # the processes that took the new cut are the ones that ran the last step
    assert first_live["pids"] == [read_heartbeats(tmp_path)[rank]["pid"] for rank in range(4)]
    records = read_jsonl(tmp_path / "performance.jsonl")
    assert [r["step"] for r in records] == list(range(1, 33))
    manifest = read_manifest(latest_valid_checkpoint(tmp_path / "checkpoints").path)
    assert manifest["meta"]["partition"] == segments[-1].placement.to_dict()
    assert_close_states(final_student_state(tmp_path), reference)


def test_a_replan_of_replicas_by_restart_still_restarts_and_learns_the_same(tmp_path, teacher_file, reference):
    """failover.replan_mode=restart: the same decision stops every rank with a checkpoint and relaunches."""
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    summary = replanned_run(tmp_path, teacher_file, "restart")
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments][:2] == [("start", "stopped"), ("replan", segments[1].outcome)]
    names = [e["event"] for e in read_events(events_path(tmp_path))]
    assert "relaunch" in names and "live_replan" not in names
    assert summary["experiment"]["restarts"][0]["mode"] == "restart"
    assert_close_states(final_student_state(tmp_path), reference)


def test_a_drilled_replan_of_replicas_moves_blocks_live_from_a_skewed_cut_and_nothing_learnt_changes(
        tmp_path, teacher_file, reference):
    """A REPLAN drill (no slowdown: this runs on ranks that share one GPU too, experiments/gpu/shared_gpu.sh)
    from a cut that puts 8 of the 10 student blocks on stage 1: the planner's cut moves blocks to stage 0 in
    both replicas, live, and the run still learns what one device learns."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *STEPS,
                                  "trainer.devices=4", "trainer.replicas=2", "pipeline.microbatches=2",
                                  "partition=manual", "partition.teacher=[5,6]", "partition.student=[2,8]",
                                  "failover.drills=[{step:5,action:replan}]"]), log=lambda m: None)
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments] == [("start", "replanned live"), ("replan (live)", "finished")]
    before, after = segments[0].placement, segments[1].placement
    assert after.same_ranks(before) and after.student_counts[0] > 2
    [moved] = read_events(events_path(tmp_path), "live_replan")
    assert moved["moved_blocks"] == 2 * (after.student_counts[0] - 2) and moved["step"] == segments[0].end_step
    assert moved["pids"] == [read_heartbeats(tmp_path)[rank]["pid"] for rank in range(4)]
    assert_close_states(final_student_state(tmp_path), reference)


def test_a_drilled_replan_of_replicas_cut_differently_makes_the_new_owners_groups_live(tmp_path, teacher_file,
                                                                                      reference):
    """Replicas cut differently (replica 0 puts 8 student blocks on stage 1, replica 1 on stage 0): a block's
    owners across the replicas are other pairs of ranks than a stage's, and the re-cut changes them, so the
    gradient groups of owners not met before are made live; the run still learns what one device learns."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *STEPS,
                                  "trainer.devices=4", "trainer.replicas=2", "pipeline.microbatches=2",
                                  "partition=manual", "partition.teacher=[5,6,6,5]", "partition.student=[2,8,8,2]",
                                  "partition.replica_stages=[2,2]", "failover.drills=[{step:5,action:replan}]"]),
        log=lambda m: None)
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments] == [("start", "replanned live"), ("replan (live)", "finished")]
    before, after = segments[0].placement, segments[1].placement
    assert after.same_ranks(before) and after.student_groups() != before.student_groups()
    [moved] = read_events(events_path(tmp_path), "live_replan")
    assert moved["moved_blocks"] > 0 and moved["pids"] == [read_heartbeats(tmp_path)[rank]["pid"] for rank in range(4)]
    assert_close_states(final_student_state(tmp_path), reference)

