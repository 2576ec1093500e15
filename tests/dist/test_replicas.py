"""R replicas x K stages learn what one device learns on the same global batch, grouped the same way.

The reference is the single-device loop over R x M micro-batches (replica after replica); the
layout runs R pipelines of K CPU ranks (gloo) on their shares, the owners of each block sum the
student's weighted gradients and the replicas merge their BatchNorm statistics after each step. The all-reduce
sums in another order than the reference's accumulation, so the states agree to rounding, not
bit for bit. How far rounding carries depends on the student (docs/layouts.md):

- a LayerNorm student (vit_micro) with SGD keeps it where it is: every tensor within 1e-5 of its
  scale after 6 steps (measured: 4e-7);
- a BatchNorm student (resnet_micro) on micro-batches of 8 amplifies it about tenfold a step (the
  first convolution's momentum at steps 2 and 4: 1.4e-5 and 5e-4 of its scale), so its check, of the
  merged running statistics above all, is after 2 steps, within 1e-4;
- AdamW's first steps divide each gradient element by its own size: an element whose gradient is
  ~0 moves by up to the learning rate either way under a rounding difference, so these runs use SGD.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from synapse.app import run
from synapse.engine import distil_on_one_device
from synapse.failover import read_segments
from synapse.rundir import events_path

from .helpers import SHARED_GPU, assert_close_states, compose_config, final_student_state

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

BATCH = 32
COMMON = [f"data.batch_size={BATCH}", "trainer.max_steps=6", "optim.name=sgd", "checkpoint.every=2"]
# A LayerNorm student: rounding stays small, and its gradients do not depend on how a step's images
# are grouped into micro-batches, so a replica that changes its share still learns what one device learns.
VIT = ["student=vit_micro"]
BATCHNORM_STEPS, BATCHNORM_TOLERANCE = 2, 1e-4


def losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r.get("kind") == "train"]


def evaluations(run_dir) -> list[tuple[float, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["student_top1"], r["student_top5"]) for r in records if r.get("kind") == "eval"]


def reference_run(run_dir, teacher_file, microbatches: int, extra: list[str]) -> tuple[dict, dict]:
    distil_on_one_device(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", "trainer.devices=1", *COMMON,
                                                  f"pipeline.microbatches={microbatches}", *extra]),
                         run_dir, log=lambda m: None)
    return final_student_state(run_dir)


@pytest.fixture(scope="module")
def reference_vit(tmp_path_factory, teacher_file):
    """One device, the global batch in 4 micro-batches of 8."""
    run_dir = tmp_path_factory.mktemp("reference_vit")
    return run_dir, reference_run(run_dir, teacher_file, 4, VIT)


@pytest.mark.parametrize("replicas, stages, microbatches", [(2, 2, 2), (4, 1, 1)])
def test_replicas_learn_what_one_device_learns(tmp_path, teacher_file, reference_vit, replicas, stages, microbatches):
    """R = 2 x K = 2 (M = 2) and R = 4 x K = 1 (pure data parallelism): 4 micro-batches of 8 per step,
    as in the reference; the logged loss is the global batch's."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT,
                                  f"trainer.devices={replicas * stages}", f"trainer.replicas={replicas}",
                                  f"pipeline.microbatches={microbatches}"]), log=lambda m: None)
    reference_dir, reference = reference_vit
    assert_close_states(final_student_state(tmp_path), reference)
    assert losses(tmp_path) == pytest.approx(losses(reference_dir), rel=1e-5)
    # each replica evaluates every R-th validation batch; the counts add up to one device's evaluation
    assert evaluations(tmp_path) == evaluations(reference_dir) and evaluations(tmp_path)
    segment = read_segments(tmp_path)[0]
    assert (segment.placement.replicas, segment.placement.num_stages) == (replicas, stages)
    assert segment.placement.shares == (BATCH // replicas,) * replicas


@pytest.mark.parametrize("layout", [["trainer.devices=4"], ["trainer.devices=3", "partition.replica_stages=[2,1]"]],
                         ids=["2x2", "2+1"])
def test_replicas_merge_batchnorm_statistics_into_one_device_s(tmp_path, teacher_file, layout):
    """A BatchNorm student on R = 2 x K = 2, and on replicas of 2 and 1 stages (merged per group of a block's
    owners): after each step the replicas' running statistics become those of one device that ran all 4
    micro-batches (replica 0's, then replica 1's), not their mean."""
    steps = [f"trainer.max_steps={BATCHNORM_STEPS}"]
    reference = reference_run(tmp_path / "reference", teacher_file, 4, steps)
    run(compose_config(tmp_path / "replicas", [f"teacher.checkpoint={teacher_file}", *COMMON, *steps,
                                               *layout, "trainer.replicas=2", "pipeline.microbatches=2"]),
        log=lambda m: None)
    assert_close_states(final_student_state(tmp_path / "replicas"), reference, BATCHNORM_TOLERANCE)


def test_unequal_shares_still_average_over_the_global_batch(tmp_path, teacher_file, reference_vit):
    """Shares of 24 and 8 images: each replica's gradient is weighted by its share, so the sum
    is still the mean over all 32."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, "trainer.devices=2",
                                  "trainer.replicas=2", "trainer.replica_shares=[24,8]", "pipeline.microbatches=2"]),
        log=lambda m: None)
    reference_dir, reference = reference_vit
    assert_close_states(final_student_state(tmp_path), reference)
    assert losses(tmp_path) == pytest.approx(losses(reference_dir), rel=1e-5)


def test_a_checkpoint_of_replicas_resumes_on_a_pipeline(tmp_path, teacher_file, reference_vit):
    """Checkpoints hold tensors by name, one copy for all replicas: 3 steps as R = 2 x K = 1, then the rest
    as one pipeline of K = 2 (the same 4 micro-batches of 8 per step)."""
    base = [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT]
    run(compose_config(tmp_path, [*base, "trainer.devices=2", "trainer.replicas=2", "pipeline.microbatches=2",
                                  "trainer.stop_after=3"]), log=lambda m: None)
    run(compose_config(tmp_path, [*base, "trainer.devices=2", "pipeline.microbatches=4", "resume=auto"]),
        log=lambda m: None)
    assert_close_states(final_student_state(tmp_path), reference_vit[1])


KILL_RANK_3 = ["trainer.devices=4", "trainer.replicas=2", "pipeline.microbatches=2",
               "injection.faults=[{kind:kill,rank:3,step:5,phase:backward}]"]


def test_a_rank_killed_in_one_replica_shrinks_that_replica_and_loses_nothing(tmp_path, teacher_file, reference_vit):
    """R = 2 x K = 2; rank 3 (replica 1's last stage) is killed at step 5: policy=eta prices SHRINK beside
    dropping the replica, re-cuts replica 1 on its survivor (one stage) with the share at which both
    replicas finish a step together, and the run resumes from its step-4 checkpoint on three devices,
    ending where one device ends."""
    # Ranks sharing one GPU are priced as such, and there eta may prefer dropping the replica: the rule
    # that always shrinks tests the same mechanics
    policy = [] if SHARED_GPU is None else ["policy=shrink"]
    overrides = [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *KILL_RANK_3, *policy]
    summary = run(compose_config(tmp_path, overrides), log=lambda m: None)
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"]
    shrunk = segments[1].placement
    assert shrunk.devices == (0, 1, 2) and shrunk.replica_stages == (2, 1) and shrunk.pipeline(0) == \
        segments[0].placement.pipeline(0)
    assert sum(shrunk.shares) == BATCH and all(share % 2 == 0 for share in shrunk.shares)
    print(f"shares after SHRINK: {list(shrunk.shares)}")
    assert segments[1].start_step == 4
    restart = summary["experiment"]["restarts"][0]
    assert restart["action"] == "shrink", restart
    records = [json.loads(line) for line in events_path(tmp_path).read_text().splitlines()]
    decision = next(r for r in records if r.get("event") == "decision" and r.get("action") == "shrink")
    assert {o["kind"] for o in decision["options"]} >= {"shrink", "degrade"}
    assert_close_states(final_student_state(tmp_path), reference_vit[1])


def test_a_rank_killed_in_one_replica_drops_that_replica_and_loses_nothing(tmp_path, teacher_file, reference_vit):
    """The same kill under policy=degrade, whose rule on a lost device is to drop its replica: the run
    resumes from its step-4 checkpoint on replica 0 alone, which now trains on the whole batch, and ends
    where one device ends."""
    summary = run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *KILL_RANK_3,
                                            "policy=degrade"]),
                  log=lambda m: None)
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"]
    assert segments[1].devices == [0, 1] and segments[1].placement.replicas == 1
    assert segments[1].start_step == 4
    assert summary["experiment"]["restarts"][0]["action"] == "degrade"
    assert_close_states(final_student_state(tmp_path), reference_vit[1])


def test_a_replica_slow_from_the_start_gets_a_smaller_share_and_nothing_learnt_changes(tmp_path, teacher_file):
    """R = 4 x K = 1 with rank 3 four times slower from step 2: the other replicas of its stage show it
    at once (the start check), policy=rebalance shares the batch out by speed (live, the default
    failover.replan_mode: the same processes train on; test_live_rebalance), and the run still learns what
    one device learns (a LayerNorm student: grouping does not matter to its gradients)."""
    if SHARED_GPU is not None:
        pytest.skip("ranks sharing one GPU take turns on it: one rank's slowdown shows on every rank's clock")
    steps = ["trainer.max_steps=32"]
    reference = reference_run(tmp_path / "reference", teacher_file, 4, [*VIT, *steps])
    run_dir = tmp_path / "replicas"
    run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *steps, "trainer.devices=4",
                                 "trainer.replicas=4", "pipeline.microbatches=1", "policy=rebalance",
                                 "injection.faults=[{kind:slow_compute,rank:3,start:2,factor:4}]"]),
        log=lambda m: None)
    segments = read_segments(run_dir)
    assert [s.reason for s in segments] == ["start", "rebalance (live)"]
    shares = segments[1].placement.shares
    assert sum(shares) == BATCH and shares[3] == min(shares) and shares[3] < BATCH // 4, shares
    # found from the first steps (J = 11, then 5 steps and sustain; more when the machine is loaded)
    assert segments[1].start_step < 30
    assert_close_states(final_student_state(run_dir), reference)


@pytest.mark.long  # two launchers; the multi-node tests share the long budget
def test_replicas_across_two_nodes_learn_what_one_device_learns(tmp_path, teacher_file, reference_vit):
    """Two nodes of one CPU device each, trainer.replicas=2: a replica per node, the gradient all-reduce
    between the nodes (two launchers on 127.0.0.1)."""
    import subprocess
    import sys

    from synapse.launch import free_port

    from .helpers import BASE_OVERRIDES

    port, run_dir = free_port(), tmp_path / "two_nodes"
    common = [*BASE_OVERRIDES, *COMMON, *VIT, f"teacher.checkpoint={teacher_file}", f"cache_dir={tmp_path}/cache",
              f"run_dir={run_dir}", "trainer.devices=1", "trainer.nodes=2", "trainer.replicas=2",
              "pipeline.microbatches=2", f"trainer.rdzv_endpoint=127.0.0.1:{port}", "trainer.rdzv_id=replicas-test"]
    repo = Path(__file__).resolve().parents[2]
    nodes = [subprocess.Popen([sys.executable, "train.py", *common, f"trainer.node_rank={rank}"], cwd=repo,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-3000:]
    assert_close_states(final_student_state(run_dir), reference_vit[1])


def test_the_planner_chooses_the_layout_and_the_run_takes_it(tmp_path, teacher_file):
    """trainer.replicas=auto with partition=auto on 2 CPU ranks: both layouts (1 x 2, 2 x 1) priced with
    profiles at their own micro-batch, the choice and every candidate in plan.json, and the run on it."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, "trainer.devices=2",
                                  "trainer.replicas=auto", "partition=auto", "pipeline.microbatches=2",
                                  "trainer.max_steps=2"]), log=lambda m: None)
    layout = json.loads((tmp_path / "plan.json").read_text())["layout"]
    shapes = {(c["replicas"], c["stages"]) for c in layout["candidates"]}
    assert shapes == {(1, 2), (2, 1)} and all(c["step_time_s"] for c in layout["candidates"])
    chosen = layout["chosen"]
    assert chosen["step_time_s"] == min(c["step_time_s"] for c in layout["candidates"])
    placement = read_segments(tmp_path)[0].placement
    assert (placement.replicas, placement.num_stages) == (chosen["replicas"], chosen["stages"])
    assert list(placement.student_counts) == chosen["student"]


def test_replicas_cut_differently_learn_what_one_device_learns(tmp_path, teacher_file, reference_vit):
    """Replica 0 a pipeline of 2, replica 1 one device (partition.replica_stages=[2,1]): no two ranks hold
    the same stage, so the student's gradients are summed per set of a block's owners (blocks of replica
    0's stage 0 between ranks 0 and 2, those of its stage 1 between ranks 1 and 2), each replica's
    weighted by its share; unequal shares (24 / 8) on top."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, "trainer.devices=3",
                                  "trainer.replicas=2", "partition.replica_stages=[2,1]",
                                  "trainer.replica_shares=[24,8]", "pipeline.microbatches=2"]), log=lambda m: None)
    reference_dir, reference = reference_vit
    assert_close_states(final_student_state(tmp_path), reference)
    assert losses(tmp_path) == pytest.approx(losses(reference_dir), rel=1e-5)
    assert evaluations(tmp_path) == evaluations(reference_dir) and evaluations(tmp_path)
    placement = read_segments(tmp_path)[0].placement
    assert placement.replica_stages == (2, 1) and placement.shares == (24, 8)
