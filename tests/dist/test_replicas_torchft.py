"""torchft carries the replica level (failover.replica_engine=torchft): R = 2 x K = 1 and R = 2 x K = 2 on CPU
ranks (gloo), each replica a launch of its own under the supervisor's lighthouse.

The reference is the single-device loop over the same global batches (tests/dist/test_replicas.py); the
replicas' weights match it within 1e-5 of each tensor's scale (a LayerNorm student, SGD: the same
tolerance as the restart path's replicas). A replica SIGKILLed mid-run is respawned by its own agent
and heals from its peer (every stage of it); the survivor goes on in the same processes, takes the whole
batch while alone, and the step that met the dead peer is done again: nothing learnt changes.
"""
from __future__ import annotations

import json

import pytest

from synapse.app import run
from synapse.failover import read_segments
from synapse.rundir import events_path

from .helpers import SHARED_GPU, assert_close_states, final_student_state
from .test_replicas import COMMON, VIT, compose_config, losses, reference_run

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600),
              pytest.mark.skipif(SHARED_GPU is not None, reason="torchft's replica groups run on gloo CPU ranks here")]

# policy=keep: a slowdown read on a loaded machine is not acted on (these tests are of the replica level)
TORCHFT = ["failover.replica_engine=torchft", "trainer.devices=2", "trainer.replicas=2", "pipeline.microbatches=2",
           "policy=keep"]


def torchft(stages: int) -> list[str]:
    """Two replicas of ``stages`` stages each (replica r's stage s is rank r K + s of the run)."""
    return [*TORCHFT, f"trainer.devices={2 * stages}"]


def launch_attempts(run_dir, replica: int) -> list[str]:
    """The elastic attempts of replica ``replica``'s launch of the first segment (attempt_1: its agent respawned
    every worker of it once)."""
    return sorted(p.name for p in (run_dir / "logs").glob(f"launch_0_replica{replica}/*/attempt_*"))


def events(run_dir, name: str) -> list[dict]:
    records = [json.loads(line) for line in events_path(run_dir).read_text().splitlines()]
    return [r for r in records if r.get("event") == name]


def events_after_the_kill(run_dir, name: str) -> list[dict]:
    """``name``'s events from the step before the kill on: a replica built late under load may join the
    segment's first steps by healing (its quorum request came after torchft's join timeout), which is not
    what these tests are about."""
    return [e for e in events(run_dir, name) if e["step"] >= KILL_STEP - 1]


@pytest.mark.parametrize("stages", [1, 2])
def test_torchft_replicas_learn_what_one_device_learns(tmp_path, teacher_file, stages):
    """Two replicas of one CPU rank, and two pipelines of two, under torchft's quorum: every step's global batch
    cut in two, each stage's gradients summed with the same stage of the other replica through its Manager's
    process group, committed by vote; one device's weights."""
    reference = reference_run(tmp_path / "reference", teacher_file, 4, VIT)
    run_dir = tmp_path / "torchft"
    run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *torchft(stages)]), log=print)
    assert_close_states(final_student_state(run_dir), reference)
    assert losses(run_dir) == pytest.approx(losses(tmp_path / "reference"), rel=1e-5)
    assert [s.outcome for s in read_segments(run_dir)] == ["finished"]
    # one performance record a step of both replicas' ranks (told one step late, with the next reduction; a
    # replica that starts late under load joins a later step's quorum, so the first steps may have none)
    performance = [json.loads(line) for line in (run_dir / "performance.jsonl").read_text().splitlines()]
    assert [r["step"] for r in performance][-1] == 5
    assert all(len(r["compute_s"]) == 2 * stages and r["devices"] == list(range(2 * stages)) for r in performance)
    assert events(run_dir, "controller_error") == []



KILL_STEP = 8


def killed_run(tmp_path, teacher_file, steps: int, stages: int, killed: int,
               extra: list[str]) -> tuple[dict, object, tuple]:
    """The reference over ``steps`` steps, and the torchft run of two replicas of ``stages`` stages with
    rank ``killed`` (one of replica 1's) SIGKILLed in its forward of step 8."""
    settings = [f"trainer.max_steps={steps}", "checkpoint.every=20"]
    kill = f"injection.faults=[{{kind:kill,rank:{killed},step:{KILL_STEP},phase:forward}}]"
    reference = reference_run(tmp_path / "reference", teacher_file, 4, [*VIT, *settings])
    run_dir = tmp_path / "torchft"
    summary = run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *torchft(stages),
                                           *settings, kill, *extra]), log=print)
    assert [s.outcome for s in read_segments(run_dir)] == ["finished"]
    assert summary["experiment"]["restarts"] == [], "no restart: the survivor went on"
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train if r.get("kind") == "train"] == list(range(1, steps + 1))
    return summary, run_dir, reference


# (stages, the rank killed): replica 1's only rank; replica 1's last stage (the survivor's pipeline then meets
# a cut of twice the images: before its stages were made per cut size, stage 1 aborted in gloo on a receive
# buffer of the old size); replica 1's first stage
LOST = [pytest.param(1, 1, id="2x1"), pytest.param(2, 3, id="2x2-last-stage")]
RETURNS = [pytest.param(1, 1, id="2x1"), pytest.param(2, 2, id="2x2-first-stage")]


@pytest.mark.parametrize("stages, killed", LOST)
def test_a_lost_replica_s_share_is_taken_by_the_survivor(tmp_path, teacher_file, stages, killed):
    """A rank of replica 1 is SIGKILLed in its forward of step 8 and not respawned (failover.replica_respawns=0):
    the survivor's step 8 meets the dead peer, is not committed, and runs again on the quorum of one, which
    now trains on the whole global batch (through a pipeline: every stage of the survivor on twice the
    images); to the end, without a restart, where one device ends."""
    _, run_dir, reference = killed_run(tmp_path, teacher_file, 24, stages, killed, ["failover.replica_respawns=0"])
    lost = events(run_dir, "replica_lost")
    print(f"replica_lost: {lost}")
    assert len(lost) == 1 and lost[0]["step"] == KILL_STEP and lost[0]["attempts"] >= 2
    assert lost[0]["participants"] == 1 and lost[0]["share"] == 32
    assert events_after_the_kill(run_dir, "replica_back") == [] == events_after_the_kill(run_dir, "replica_healed")
    assert launch_attempts(run_dir, 0) == ["attempt_0"], "the survivor's workers were never restarted"
    assert_close_states(final_student_state(run_dir), reference)


@pytest.mark.parametrize("stages, killed", RETURNS)
def test_a_killed_replica_returns_heals_and_nothing_learnt_changes(tmp_path, teacher_file, stages, killed):
    """The same kill, respawned by replica 1's own agent: every rank of replica 1 is started again (its
    pipeline's group is its launch's), each heals from the same stage of the survivor (its state sent by
    torchft) and rejoins while the survivor goes on in the same processes; the run ends where one device
    ends, both replicas training again to the end."""
    steps = 120
    _, run_dir, reference = killed_run(tmp_path, teacher_file, steps, stages, killed, [])
    lost, back, healed = (events_after_the_kill(run_dir, name)
                          for name in ("replica_lost", "replica_back", "replica_healed"))
    print(f"replica_lost: {lost}\nreplica_back: {back}\nreplica_healed: {healed}")
    assert lost and lost[0]["step"] == KILL_STEP
    assert lost[0]["attempts"] >= 2, "the step that met the dead peer ran again"
    survivor = lost[0]["pid"]
    assert all(e["pid"] == survivor for e in lost + back), "the survivor went on in the same process"
    assert launch_attempts(run_dir, 0) == ["attempt_0"], "the survivor's workers were never restarted"
    assert launch_attempts(run_dir, 1) == ["attempt_0", "attempt_1"], "replica 1's agent respawned it once"
    assert sorted(e["rank"] for e in healed) == list(range(stages, 2 * stages)), "every stage of replica 1 healed"
    assert {e["replica"] for e in healed} == {1} and survivor not in {e["pid"] for e in healed}
    assert len({e["step"] for e in healed}) == 1 and KILL_STEP - 1 <= healed[0]["step"] < steps
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
