"""Failover changes where work runs, never what is learned.

Real supervisors, real elastic launches of K gloo ranks, real checkpoints: a run that is
re-partitioned (REPLAN), shrunk to K-1 devices (DEGRADE) or loses a rank to SIGKILL ends
with student weights and optimizer state bit-identical to an uninterrupted run on the same
data order. The segments are composed Hydra configs that reproduce what they ran.
"""
from __future__ import annotations

import json

import pytest
import yaml
from omegaconf import OmegaConf

from synapse.app import run
from synapse.failover import compose_segment_config, merge_overrides, read_segment_overrides, read_segments
from synapse.rundir import read_events, read_jsonl

from .helpers import BASE_OVERRIDES, SHARED_GPU, assert_identical_states, final_student_state

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = 12


def overrides_for(run_dir, teacher_file, *extra: str) -> list[str]:
    return [*BASE_OVERRIDES, f"trainer.max_steps={STEPS}", f"run_dir={run_dir}", f"cache_dir={run_dir}/cache",
            f"teacher.checkpoint={teacher_file}", "trainer.devices=3", *extra]


def run_overrides(overrides: list[str]) -> dict:
    return run(compose_segment_config(overrides), log=lambda m: None, overrides=overrides)


def block_owners(devices: list[int], counts: list[int]) -> list[int]:
    """The device of each block, in block order."""
    return [device for device, count in zip(devices, counts) for _ in range(count)]


def moved_blocks(before, after) -> dict[str, list[int]]:
    """Per model, the blocks whose device differs between two segments."""
    moved = {}
    for model in ("teacher", "student"):
        old = block_owners(before.devices, getattr(before, f"{model}_counts"))
        new = block_owners(after.devices, getattr(after, f"{model}_counts"))
        moved[model] = [block for block, (a, b) in enumerate(zip(old, new)) if a != b]
    return moved


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, teacher_file):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    run_overrides(overrides_for(run_dir, teacher_file))
    return final_student_state(run_dir)


@pytest.mark.parametrize("action, mode, devices_after", [("replan", "live", [0, 1, 2]),
                                                   ("replan", "restart", [0, 1, 2]),
                                                   ("degrade", "restart", [1, 2]), ("replace", "restart", [0, 3, 2])])
def test_planned_restart_learns_exactly_what_an_uninterrupted_run_learns(tmp_path, teacher_file, uninterrupted,
                                                                         action, mode, devices_after):
    device = {"replan": "", "degrade": ",device:0", "replace": ",device:1"}[action]
    spares = ["trainer.spare_devices=[3]"] if action == "replace" else []
    summary = run_overrides(overrides_for(tmp_path, teacher_file, f"failover.replan_mode={mode}", *spares,
                                          f"failover.drills=[{{step:5,action:{action}{device}}}]"))
    assert_identical_states(final_student_state(tmp_path), uninterrupted)
    segments = read_segments(tmp_path)
    assert [s.reason for s in segments] == ["start", "replan (live)" if mode == "live" else action]
    assert segments[1].devices == devices_after and segments[1].outcome == "finished"
    assert segments[0].outcome == ("replanned live" if mode == "live" else "stopped")
    # The action really changed where work runs: blocks changed device (a REPLAN that kept the
    # split, or a REPLACE that kept the device, would learn the same and prove nothing).
    moved = moved_blocks(segments[0], segments[1])
    assert moved["teacher"] or moved["student"], f"no block changed device: {segments[0]} -> {segments[1]}"
    if action == "replan":
        assert (segments[1].teacher_counts, segments[1].student_counts) != (segments[0].teacher_counts,
                                                                        segments[0].student_counts)
    # No finished step is lost: the new segment starts where the first ended.
    assert segments[1].start_step == segments[0].end_step >= 5
    experiment = summary["experiment"]
    assert experiment["steps"] == STEPS and experiment["decisions"][0]["action"] == action
    restart = experiment["restarts"][0]
    assert restart["mode"] == mode and restart["recovery_s"] > 0
    events = [e["event"] for e in read_events(tmp_path / "failover_events.jsonl")]
    expected = ("live_replan",) if mode == "live" else ("checkpoint_saved", "segment_ended", "relaunch", "launch_ready")
    for name in ("decision", "first_step_after_restart", *expected):
        assert name in events, f"no {name} event"
    if mode == "live":
        [live] = read_events(tmp_path / "failover_events.jsonl", "live_replan")
        assert live["moved_blocks"], "a live re-plan that moved no block"
    if mode == "restart":
        assert set(restart["components"]) == {"checkpoint_save_s", "teardown_s", "launch_s", "checkpoint_load_s",
                                              "warmup_s"}
    else:
        saved = read_events(tmp_path / "failover_events.jsonl", "checkpoint_saved")
        assert "relaunch" not in events and not any(e["for_stop"] for e in saved), \
            "a live re-plan neither stops nor saves"
        assert [e["step"] for e in saved] == [STEPS], "the only checkpoint is the one at the end of the run"


def test_timing_read_a_step_late_records_every_step_once_across_a_live_replan(tmp_path, teacher_file, uninterrupted):
    """pipeline.timing_read=late (auto's choice on CUDA, forced on the CPU): each rank reports a
    step's timing at the end of the next, the last one of a segment when it ends. The records must
    still hold every step once, in its own segment, and the segment bookkeeping that reads them must
    not move; what is learned does not change."""
    run_overrides(overrides_for(tmp_path, teacher_file, "pipeline.timing_read=late", "failover.replan_mode=live",
                                "failover.drills=[{step:5,action:replan}]"))
    assert_identical_states(final_student_state(tmp_path), uninterrupted)
    segments = read_segments(tmp_path)
    assert [s.reason for s in segments] == ["start", "replan (live)"]
    assert segments[1].start_step == segments[0].end_step >= 5 and segments[1].end_step == STEPS
    records = read_jsonl(tmp_path / "performance.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["segment"] == (0 if r["step"] <= segments[0].end_step else 1) for r in records), records
    assert all(len(r["ranks"]) == 3 and all("step" not in parts for parts in r["ranks"]) for r in records)
    assert all(r["step_seconds"] > 0 and all(c > 0 for c in r["compute_s"]) for r in records)


def test_sigkilled_rank_resumes_from_last_checkpoint_on_survivors_and_learns_the_same(tmp_path, teacher_file,
                                                                                     uninterrupted):
    summary = run_overrides(overrides_for(tmp_path, teacher_file, "checkpoint.every=3",
                                          "injection.faults=[{kind:kill,rank:1,step:8,phase:backward}]"))
    assert_identical_states(final_student_state(tmp_path), uninterrupted)
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"]
    assert segments[1].devices == [0, 2], "the killed rank's device must leave the pipeline"
    assert segments[1].start_step == 6, "resume from the last checkpoint before the kill (every 3 steps)"
    restart = summary["experiment"]["restarts"][0]
    assert restart["trigger"] == "failure" and "SIGKILL" in restart["cause"]
    # The kill fired once; the segment config left it out, so the resumed run did not kill again.
    assert yaml.safe_load((tmp_path / "segments/1/config.yaml").read_text())["injection"]["faults"] == []


def test_stage_configs_compose_and_reproduce_their_stage(tmp_path, teacher_file, uninterrupted):
    first = tmp_path / "first"
    run_overrides(overrides_for(first, teacher_file, "failover.drills=[{step:4,action:degrade,device:2}]"))
    for index in (0, 1):
        saved = yaml.safe_load((first / f"segments/{index}/config.yaml").read_text())
        composed = OmegaConf.to_container(compose_segment_config(read_segment_overrides(first, index)), resolve=True)
        assert composed == saved, f"segments/{index} does not compose to its saved config"
    # Rerun segment 1 alone, elsewhere, without the drill: it continues from its pinned checkpoint
    # on its two devices and ends exactly where the original run ended.
    again = tmp_path / "again"
    overrides = merge_overrides(read_segment_overrides(first, 1), [f"run_dir={again}", "failover.drills=[]"])
    run_overrides(overrides)
    assert_identical_states(final_student_state(again), uninterrupted)
    assert json.loads((again / "segments/0/segment.json").read_text())["devices"] == [0, 1]


def test_a_failing_live_replan_falls_back_to_a_restart_and_learns_the_same(tmp_path, teacher_file, uninterrupted):
    # Rank 1 raises while building its new stage: every rank keeps its old stage, checkpoints
    # after the step, and the supervisor relaunches on the decided partition.
    summary = run_overrides(overrides_for(tmp_path, teacher_file, "failover.replan_mode=live",
                                          "failover.drills=[{step:5,action:replan}]",
                                          "injection.faults=[{kind:raise,rank:1,step:1,phase:repartition}]"))
    assert_identical_states(final_student_state(tmp_path), uninterrupted)
    segments = read_segments(tmp_path)
    assert [(s.reason, s.outcome) for s in segments] == [("start", "stopped"), ("replan", "finished")]
    assert segments[1].start_step == segments[0].end_step >= 5, "the fallback's checkpoint is the step it stopped at"
    failed = read_events(tmp_path / "failover_events.jsonl", "live_replan_failed")
    assert len(failed) == 1 and list(failed[0]["errors"]) == ["1"] and "InjectedFault" in failed[0]["errors"]["1"]
    restart = summary["experiment"]["restarts"][0]
    assert restart["mode"] == "restart" and "live re-partition failed" in restart["cause"]
    assert not read_events(tmp_path / "failover_events.jsonl", "live_replan")


CASCADE_STEPS = 30
# Held-out cascade (issue #15 item 3): device 0 computes 3x slower from step 8 (a slowdown the
# policies may act on), then device 1 is killed at step 23. Checkpoints every 8 steps, so the
# next segment resumes from step 16, behind the hard failure's DEGRADE (decided at step ~22)
# and, with a live REPLAN, maybe behind that too. Device 0 is still slow after the resume, so
# every policy but degrade (which dropped it) is asked again at steps 17.. .
# A short run needs a quick detector; threshold 1.5 (the fault is 3x) and sustain 3 keep this
# shared machine's noise from triggering a second action that would drop device 1 before its kill.
CASCADE = ["checkpoint.every=8", "failover.detector.warmup_steps=2", "failover.detector.baseline_window=6",
           "failover.detector.window=4", "failover.detector.sustain=3", "failover.detector.threshold=1.5",
           "injection.faults=[{kind:slow_compute,rank:0,start:8,factor:3.0},{kind:kill,rank:1,step:23,phase:forward}]"]
POLICY_OVERRIDES = {"eta": ["policy.params.min_saving_s=0.0", "policy.params.cooldown_steps=0"]}


@pytest.fixture(scope="module")
def uninterrupted_cascade(tmp_path_factory, teacher_file):
    run_dir = tmp_path_factory.mktemp("uninterrupted_cascade")
    run_overrides(overrides_for(run_dir, teacher_file, f"trainer.max_steps={CASCADE_STEPS}"))
    return final_student_state(run_dir)


# The default suite runs eta (the default policy); the crash this guards against (issue #15 item 3)
# hit every policy that acts. The others: -m long (about 60 s).
@pytest.mark.parametrize("policy", ["eta", pytest.param("keep", marks=pytest.mark.long),
                                    pytest.param("replan", marks=pytest.mark.long),
                                    pytest.param("degrade", marks=pytest.mark.long),
                                    pytest.param("ski_rental", marks=pytest.mark.long)])
def test_a_kill_after_a_handled_slowdown_finishes_under_every_policy(tmp_path, teacher_file, uninterrupted_cascade,
                                                                   policy):
    summary = run_overrides(overrides_for(tmp_path, teacher_file, f"trainer.max_steps={CASCADE_STEPS}",
                                          f"policy={policy}", *POLICY_OVERRIDES.get(policy, []), *CASCADE))
    assert summary["experiment"]["steps"] == CASCADE_STEPS
    assert_identical_states(final_student_state(tmp_path), uninterrupted_cascade)
    segments = read_segments(tmp_path)
    assert segments[-1].outcome == "finished" and "failed" in [s.outcome for s in segments]
    failed = next(i for i, s in enumerate(segments) if s.outcome == "failed")
    assert segments[failed + 1].start_step == 16 and 1 not in segments[failed + 1].devices
    events = read_events(tmp_path / "failover_events.jsonl")
    assert not [e for e in events if e["event"] == "controller_error"]
    detected = [e for e in events if e["event"] == "slowdown_detected"]
    assert detected
    # Ranks sharing one GPU (SYNAPSE_TEST_SHARED_GPU) take turns on it: each one's clock also counts
    # the others' kernels, so which rank reads slow first is not the device's own (docs/gpu.md).
    if SHARED_GPU is None:
        assert detected[0]["device"] == 0 and detected[0]["kind"] == "compute"
