"""torchft carries the replica level (failover.replica_engine=torchft): R = 2 x K = 1 on CPU ranks (gloo), each
replica a launch of its own under the supervisor's lighthouse.

The reference is the single-device loop over the same global batches (tests/dist/test_replicas.py); the
replicas' weights match it within 1e-5 of each tensor's scale (a LayerNorm student, SGD: the same
tolerance as the restart path's replicas). A replica SIGKILLed mid-run is respawned by its own agent
and heals from its peer; the survivor goes on in the same process, takes the whole batch while alone,
and the step that met the dead peer is done again: nothing learnt changes.
"""
from __future__ import annotations

import json

import pytest

from synapse.app import run
from synapse.failover import read_segments
from synapse.rundir import events_path

from .helpers import SHARED_GPU, final_student_state
from .test_replicas import COMMON, VIT, assert_close_states, compose_config, losses, reference_run

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600),
              pytest.mark.skipif(SHARED_GPU is not None, reason="torchft's replica groups run on gloo CPU ranks here")]

# policy=keep: a slowdown read on a loaded machine is not acted on (these tests are of the replica level)
TORCHFT = ["failover.replica_engine=torchft", "trainer.devices=2", "trainer.replicas=2", "pipeline.microbatches=2",
           "policy=keep"]


def events(run_dir, name: str) -> list[dict]:
    records = [json.loads(line) for line in events_path(run_dir).read_text().splitlines()]
    return [r for r in records if r.get("event") == name]


def test_torchft_replicas_learn_what_one_device_learns(tmp_path, teacher_file):
    """Two replicas of one CPU rank under torchft's quorum: every step's global batch cut in two, the
    gradients summed through the Managers' process groups, committed by vote; one device's weights."""
    reference = reference_run(tmp_path / "reference", teacher_file, 4, VIT)
    run_dir = tmp_path / "torchft"
    run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *TORCHFT]), log=print)
    assert_close_states(final_student_state(run_dir), reference)
    assert losses(run_dir) == pytest.approx(losses(tmp_path / "reference"), rel=1e-5)
    assert [s.outcome for s in read_segments(run_dir)] == ["finished"]
    # one performance record a step of both replicas' ranks (told one step late, with the next reduction; a
    # replica that starts late under load joins a later step's quorum, so the first steps may have none)
    performance = [json.loads(line) for line in (run_dir / "performance.jsonl").read_text().splitlines()]
    assert [r["step"] for r in performance][-1] == 5
    assert all(len(r["compute_s"]) == 2 and r["devices"] == [0, 1] for r in performance)
    assert events(run_dir, "controller_error") == []



KILL_STEP = 8
KILL = f"injection.faults=[{{kind:kill,rank:1,step:{KILL_STEP},phase:forward}}]"


def killed_run(tmp_path, teacher_file, steps: int, extra: list[str]) -> tuple[dict, object, tuple]:
    """The reference over ``steps`` steps, and the torchft run with replica 1's rank killed at step 8."""
    settings = [f"trainer.max_steps={steps}", "checkpoint.every=20"]
    reference = reference_run(tmp_path / "reference", teacher_file, 4, [*VIT, *settings])
    run_dir = tmp_path / "torchft"
    summary = run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *TORCHFT, *settings,
                                           KILL, *extra]), log=print)
    assert [s.outcome for s in read_segments(run_dir)] == ["finished"]
    assert summary["experiment"]["restarts"] == [], "no restart: the survivor went on"
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train if r.get("kind") == "train"] == list(range(1, steps + 1))
    return summary, run_dir, reference


def test_a_lost_replica_s_share_is_taken_by_the_survivor(tmp_path, teacher_file):
    """Replica 1's rank is SIGKILLed in its forward of step 8 and not respawned (failover.replica_respawns=0):
    the survivor's step 8 meets the dead peer, is not committed, and runs again on the quorum of one, which
    now trains on the whole global batch; to the end, without a restart, where one device ends."""
    _, run_dir, reference = killed_run(tmp_path, teacher_file, 24, ["failover.replica_respawns=0"])
    lost = events(run_dir, "replica_lost")
    print(f"replica_lost: {lost}")
    assert len(lost) == 1 and lost[0]["step"] == KILL_STEP and lost[0]["attempts"] >= 2
    assert lost[0]["participants"] == 1 and lost[0]["share"] == 32
    assert events(run_dir, "replica_back") == [] and events(run_dir, "replica_healed") == []
    assert_close_states(final_student_state(run_dir), reference)


def test_a_killed_replica_returns_heals_and_nothing_learnt_changes(tmp_path, teacher_file):
    """The same kill, respawned by replica 1's own agent: the respawned rank heals from the survivor (its
    state sent by torchft) and rejoins while the survivor goes on in the same process; the run ends where
    one device ends, both replicas training again to the end."""
    steps = 120
    _, run_dir, reference = killed_run(tmp_path, teacher_file, steps, [])
    lost, back, healed = (events(run_dir, name) for name in ("replica_lost", "replica_back", "replica_healed"))
    print(f"replica_lost: {lost}\nreplica_back: {back}\nreplica_healed: {healed}")
    assert lost and lost[0]["step"] == KILL_STEP
    assert lost[0]["attempts"] >= 2, "the step that met the dead peer ran again"
    survivor = lost[0]["pid"]
    assert all(e["pid"] == survivor for e in lost + back), "the survivor went on in the same process"
    assert len(healed) == 1 and healed[0]["replica"] == 1 and healed[0]["pid"] != survivor
    assert KILL_STEP - 1 <= healed[0]["step"] < steps
    performance = [json.loads(line) for line in (run_dir / "performance.jsonl").read_text().splitlines()]
    assert performance[-1]["replicas_alive"] == 2, "both replicas train to the end"
    assert_close_states(final_student_state(run_dir), reference)


def test_a_decision_stops_every_replica_after_the_same_step_and_restarts(tmp_path, teacher_file):
    """A forced DEGRADE at step 3 (a fire drill): the stop request is seen by each replica on its own and
    agreed through the next step's reduction, so both stop after the same step with one checkpoint; the
    next segment, one replica, runs on the restart path (what torchft does not carry), and the run ends
    where one device ends."""
    steps = ["trainer.max_steps=16"]  # the request reaches the replicas a few steps after the drill's
    reference = reference_run(tmp_path / "reference", teacher_file, 4, [*VIT, *steps])
    run_dir = tmp_path / "torchft"
    run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *TORCHFT, *steps,
                                 "failover.drills=[{step:3,action:degrade,device:1}]"]), log=print)
    segments = read_segments(run_dir)
    assert [s.outcome for s in segments] == ["stopped", "finished"]
    saved = [e for e in events(run_dir, "checkpoint_saved") if e["segment"] == 0]
    assert {e["step"] for e in saved if e["for_stop"]} == {segments[1].start_step}, "both stopped after one step"
    assert {e["rank"] for e in saved} == {0}, "the first participant (replica 0) writes the checkpoints"
    assert segments[1].placement.replicas == 1 and segments[1].devices == [0]
    composed = (run_dir / "segments" / "1" / "overrides.yaml").read_text()
    assert "failover.replica_engine='restart'" in composed
    assert_close_states(final_student_state(run_dir), reference)



def test_a_torchft_run_resumes_with_resume_auto(tmp_path, teacher_file):
    """3 steps under torchft, stopped with a checkpoint (trainer.stop_after), then the rest with resume=auto:
    the first participant's checkpoint holds one copy of the state; one device's weights at the end."""
    reference = reference_run(tmp_path / "reference", teacher_file, 4, VIT)
    run_dir = tmp_path / "torchft"
    base = [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *TORCHFT]
    run(compose_config(run_dir, [*base, "trainer.stop_after=3"]), log=print)
    run(compose_config(run_dir, [*base, "resume=auto"]), log=print)
    assert [s.start_step for s in read_segments(run_dir)][-1] == 3
    assert_close_states(final_student_state(run_dir), reference)
