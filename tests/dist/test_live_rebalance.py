"""A REBALANCE of replicas is taken live: the replicas' shares of the global batch change at a step boundary
every rank agrees on, in the same processes, and the run still learns what one device learns.

R = 2 replicas of K = 1 and of K = 2 CPU ranks (gloo), one rank four times slower from step 2, policy=rebalance:
with failover.replan_mode=live the shares change without a launch (one segment's processes to the end, one
``launch_ready``), with failover.replan_mode=restart through a checkpoint and a relaunch, as before. The
reference is one device on the same global batches (a LayerNorm student: how a step's images are grouped
does not change its gradients, so a replica's new share changes nothing learnt; ``test_replicas``).
"""
from __future__ import annotations

import pytest

from synapse.app import run
from synapse.checkpoint import latest_valid_checkpoint, read_manifest
from synapse.failover import read_segments
from synapse.health import read_heartbeats
from synapse.rundir import events_path, read_events, read_jsonl

from .helpers import SHARED_GPU, assert_close_states, compose_config, final_student_state
from .test_replicas import BATCH, COMMON, VIT, reference_run

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = ["trainer.max_steps=32"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher_file):
    """One device, the global batch in 4 micro-batches of 8, 32 steps."""
    return reference_run(tmp_path_factory.mktemp("reference"), teacher_file, 4, [*VIT, *STEPS])


def rebalanced_run(run_dir, teacher_file, stages: int, mode: str, faults: tuple[str, ...] = (),
                   extra: tuple[str, ...] = (), slow: bool = True) -> dict:
    slow_rank = 2 * stages - 1  # replica 1's last rank
    faults = (f"{{kind:slow_compute,rank:{slow_rank},start:2,factor:4}}", *faults) if slow else faults
    return run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *STEPS,
                                        f"trainer.devices={2 * stages}", "trainer.replicas=2",
                                        "pipeline.microbatches=2", "policy=rebalance", f"failover.replan_mode={mode}",
                                        f"injection.faults=[{','.join(faults)}]", *extra]),
               log=lambda m: None)


def assert_slow_replica_got_less(segments) -> tuple[int, ...]:
    shares = segments[1].placement.shares
    assert sum(shares) == BATCH and shares[1] < shares[0] and all(s % 2 == 0 for s in shares), shares
    assert segments[0].placement.share_sizes(BATCH, 2) == (BATCH // 2, BATCH // 2)
    assert segments[1].start_step == segments[0].end_step, "no finished step lost, none done twice"
    return shares


@pytest.mark.parametrize("stages", [1, 2], ids=["2x1", "2x2"])
def test_a_rebalance_is_taken_live_in_the_same_processes_and_nothing_learnt_changes(tmp_path, teacher_file,
                                                                                     reference, stages):
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    summary = rebalanced_run(tmp_path, teacher_file, stages, "live")
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments] == [("start", "rebalanced live"), ("rebalance (live)", "finished")]
    shares = assert_slow_replica_got_less(segments)
    changed_at = segments[0].end_step
    events = read_events(events_path(tmp_path))
    names = [e["event"] for e in events]
    # one launch: no relaunch, no stop, no checkpoint for one
    assert names.count("launch_ready") == 1 and "relaunch" not in names and "live_rebalance_failed" not in names
    assert not any(e["for_stop"] for e in events if e["event"] == "checkpoint_saved")
    [live] = [e for e in events if e["event"] == "live_rebalance"]
    assert live["step"] == changed_at and live["shares"] == list(shares) and live["segment"] == 1
    # the processes that took the new shares are the ones that ran the last step
    assert live["pids"] == [read_heartbeats(tmp_path)[rank]["pid"] for rank in range(2 * stages)]
    first = next(e for e in events if e["event"] == "first_step_after_restart")
    assert (first["mode"], first["action"], first["shares"]) == ("live", "rebalance", list(shares))
    # every step's performance record says the shares it ran on, changed from the same step on every rank
    records = read_jsonl(tmp_path / "performance.jsonl")
    assert [r["step"] for r in records] == list(range(1, 33))
    assert all(r["shares"] == ([BATCH // 2] * 2 if r["step"] <= changed_at else list(shares)) for r in records)
    restart = summary["experiment"]["restarts"][0]
    assert (restart["mode"], restart["action"], restart["segment"]) == ("live", "rebalance", 1)
    # checkpoints written after it carry the new shares (resume=auto resumes on them)
    manifest = read_manifest(latest_valid_checkpoint(tmp_path / "checkpoints").path)
    assert manifest["meta"]["partition"]["shares"] == list(shares)
    assert_close_states(final_student_state(tmp_path), reference)


def test_a_rebalance_by_restart_still_restarts(tmp_path, teacher_file, reference):
    """failover.replan_mode=restart: the same decision stops every rank with a checkpoint and relaunches."""
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    summary = rebalanced_run(tmp_path, teacher_file, 1, "restart")
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments] == [("start", "stopped"), ("rebalance", "finished")]
    assert_slow_replica_got_less(segments)
    names = [e["event"] for e in read_events(events_path(tmp_path))]
    assert names.count("launch_ready") == 2 and "relaunch" in names and "live_rebalance" not in names
    assert summary["experiment"]["restarts"][0]["mode"] == "restart"
    assert_close_states(final_student_state(tmp_path), reference)


def test_a_live_rebalance_that_fails_on_one_rank_falls_back_to_a_restart(tmp_path, teacher_file, reference):
    """Rank 1 raises while taking the new shares: no rank takes them (they agree first), every rank
    checkpoints after the step on the old shares, and the supervisor relaunches on the decided ones."""
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    raises = "{kind:raise,rank:1,step:1,phase:repartition}"
    summary = rebalanced_run(tmp_path, teacher_file, 1, "live", faults=(raises,))
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments] == [("start", "stopped"), ("rebalance", "finished")]
    assert_slow_replica_got_less(segments)
    events = read_events(events_path(tmp_path))
    [failed] = [e for e in events if e["event"] == "live_rebalance_failed"]
    assert list(failed["errors"]) == ["1"] and "InjectedFault" in failed["errors"]["1"]
    assert not [e for e in events if e["event"] == "live_rebalance"]
    restart = summary["experiment"]["restarts"][0]
    assert restart["mode"] == "restart" and "the live rebalance failed" in restart["cause"]
    assert_close_states(final_student_state(tmp_path), reference)


def test_resume_auto_after_a_live_rebalance_goes_on_with_the_new_shares(tmp_path, teacher_file, reference):
    """The run stops after 28 steps of its launch (trainer.stop_after; rebalanced live at step 17-18 here), and
    `resume=auto` (no slowdown this time) continues from the step-28 checkpoint on the shares the live
    REBALANCE chose, ending where one device ends."""
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    rebalanced_run(tmp_path, teacher_file, 1, "live", extra=("trainer.stop_after=28",))
    before = read_segments(tmp_path)
    assert [s.reason for s in before] == ["start", "rebalance (live)"], "rebalanced after step 28: the machine was slow"
    [live] = read_events(events_path(tmp_path), "live_rebalance")  # the shares the workers took
    shares = tuple(live["shares"])
    assert shares[1] < shares[0]
    rebalanced_run(tmp_path, teacher_file, 1, "live", slow=False, extra=("resume=auto",))
    after = read_segments(tmp_path)
    assert len(after) == 3 and after[2].start_step == 28 and after[2].placement.shares == shares, after[2]
    assert_close_states(final_student_state(tmp_path), reference)
