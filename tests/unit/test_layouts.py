"""Layouts of R replicas x K stages: the placement's arithmetic, their price, the planner's choice and
the failover options of a replicated run. Pure: plain numbers, no torch."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse.decision import OptionKind, RunningPartition, replica_options
from synapse.partitioning import (
    BlockProfile,
    DeviceFacts,
    ModelProfile,
    PartitionError,
    Placement,
    StagePlanner,
    StepSpec,
    choose_layout,
    equal_shares,
    layout_shapes,
    ring_allreduce_s,
    shares_for_speeds,
)

BATCH = 64
COSTS = dict.fromkeys(OptionKind, 5.0)


# ---------------------------------------------------------------- the placement
def test_ranks_are_replica_major():
    p = Placement((4, 5, 6, 7, 8, 9), (2, 1), (1, 2), replicas=3)
    assert (p.world_size, p.num_stages) == (6, 2)
    assert [(p.replica_of(r), p.stage_of(r)) for r in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert p.replica_devices(1) == (6, 7)
    assert p.pipeline(2) == Placement((8, 9), (2, 1), (1, 2))
    assert p.stage_peers() == [[0, 2, 4], [1, 3, 5]] * 3 and p.pipeline(0).stage_peers() is None


def test_a_mesh_that_does_not_match_the_devices_is_refused():
    with pytest.raises(PartitionError, match="2 replicas x 2 stages need 4 devices, got 3"):
        Placement((0, 1, 2), (1, 1), (1, 1), replicas=2)
    with pytest.raises(PartitionError, match="give one positive image count per replica"):
        Placement((0, 1), (2,), (2,), replicas=2, shares=(32,))


def test_records_of_one_pipeline_keep_their_three_keys_and_layouts_round_trip():
    assert Placement((0, 1), (1, 1), (1, 1)).to_dict() == {"devices": [0, 1], "teacher": [1, 1], "student": [1, 1]}
    layout = Placement((0, 1, 2, 3), (1, 1), (1, 1), replicas=2, shares=(40, 24))
    assert Placement.from_dict(layout.to_dict()) == layout
    assert layout.on((4, 5, 6, 7)) == Placement((4, 5, 6, 7), (1, 1), (1, 1), 2, (40, 24))


def test_equal_shares_come_in_whole_micro_batches():
    assert equal_shares(64, 2, 4) == (32, 32)
    assert equal_shares(64, 3, 4) == (24, 20, 20)  # 16 micro-batch units of 4 over 3 replicas
    with pytest.raises(PartitionError, match="does not split into 3 equal micro-batches"):
        equal_shares(64, 2, 3)
    with pytest.raises(PartitionError, match="less than one micro-batch"):
        equal_shares(8, 4, 4)


@given(replicas=st.integers(1, 8), units=st.integers(1, 40), microbatches=st.integers(1, 4),
       skew=st.integers(0, 3))
def test_a_replica_evaluates_in_an_equal_shares_shape_whatever_its_training_share(replicas, units, microbatches,
                                                                                 skew):
    """Every R-th validation batch, each of the largest equal share: the R replicas' batches together are one
    training batch or a little more, each splits into the run's micro-batches, and a REBALANCE's shares
    do not change it (one size per launch)."""
    batch = max(units, replicas) * microbatches
    one = Placement(tuple(range(replicas)), (1,), (1,), replicas=replicas)
    size = one.evaluation_batch(batch, microbatches)
    assert size % microbatches == 0 and batch <= size * replicas < batch + replicas * microbatches
    shares = list(equal_shares(batch, replicas, microbatches))
    if replicas > 1 and shares[0] > microbatches * skew:  # move some micro-batches from replica 0 to replica 1
        shares[0], shares[1] = shares[0] - microbatches * skew, shares[1] + microbatches * skew
    assert one.with_shares(shares).evaluation_batch(batch, microbatches) == size
    assert Placement((0,), (1,), (1,)).evaluation_batch(batch, microbatches) == batch  # one pipeline: as trained


def test_share_ranges_cover_the_batch_in_replica_order():
    p = Placement((0, 1, 2), (2,), (2,), replicas=3, shares=(24, 20, 20))
    assert [p.share_range(r, 64, 4) for r in range(3)] == [range(0, 24), range(24, 44), range(44, 64)]
    with pytest.raises(PartitionError, match="sum to 64 images, the global batch .* is 32"):
        p.share_sizes(32, 4)
    with pytest.raises(PartitionError, match="do not split into 8 equal micro-batches"):
        p.share_sizes(64, 8)


def test_dropping_a_replica_shares_its_images_among_the_others():
    p = Placement((0, 1, 2, 3, 4, 5), (1, 1), (1, 1), replicas=3, shares=(24, 20, 20))
    dropped = p.without_replica(1, 64, 4)
    assert dropped == Placement((0, 1, 4, 5), (1, 1), (1, 1), 2, (32, 32))
    last = dropped.without_replica(0, 64, 4)
    assert last == Placement((4, 5), (1, 1), (1, 1)) and last.shares == ()
    with pytest.raises(PartitionError, match="no replica to drop"):
        last.without_replica(0, 64, 4)


@given(speeds=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=8), units=st.integers(8, 64),
       microbatches=st.sampled_from([1, 2, 4]))
def test_shares_for_speeds_cover_the_batch_in_whole_micro_batches_and_follow_speed(speeds, units, microbatches):
    batch = units * microbatches
    shares = shares_for_speeds(speeds, batch, microbatches)
    assert sum(shares) == batch and all(s % microbatches == 0 and s >= microbatches for s in shares)
    # the slowest replica finishes no later than with equal shares
    equal = equal_shares(batch, len(speeds), microbatches)
    assert max(s / v for s, v in zip(shares, speeds)) <= max(s / v for s, v in zip(equal, speeds)) + 1e-9
    faster = [(a, b) for a in range(len(speeds)) for b in range(len(speeds)) if speeds[a] > 2 * speeds[b]]
    assert all(shares[a] >= shares[b] for a, b in faster)


# ---------------------------------------------------------------- the price
def profile(name: str, blocks: int, micro_batch: int, ms_per_sample: float, backward: bool,
            param_kb: float = 1000.0) -> ModelProfile:
    forward = ms_per_sample * micro_batch
    rows = [BlockProfile(f"{name}{k}", forward, 2 * forward if backward else 0.0, 1.0, 10.0 * micro_batch,
                         10.0 * micro_batch, param_kb) for k in range(blocks)]
    return ModelProfile(name, tuple(rows), micro_batch=micro_batch)


NOMINAL = DeviceFacts()


def planner(replicas: int, microbatches: int, facts: DeviceFacts = NOMINAL, param_kb: float = 1000.0
            ) -> StagePlanner:
    micro = BATCH // (replicas * microbatches)
    return StagePlanner(profile("t", 8, micro, 0.1, False, param_kb), profile("s", 8, micro, 0.1, True, param_kb),
                        StepSpec(microbatches), facts, replicas=replicas)


def test_one_pipeline_is_priced_as_before():
    p = Placement((0, 1), (4, 4), (4, 4))
    plan = planner(1, 4)
    cost = plan.layout_cost(p)
    assert cost.step_time_s == pytest.approx(plan.predict(p.devices, (4, 4), (4, 4)).step_time_s)
    assert list(cost.compute_s) == pytest.approx(plan.per_step_compute_s(p.devices, (4, 4), (4, 4)))
    assert cost.allreduce_s == 0.0


def test_replicas_wait_for_the_slowest_and_then_all_reduce_the_largest_stage():
    facts = DeviceFacts(link_bandwidth_bytes_per_s=1e9, link_latency_s=1e-5)
    p = Placement((0, 1, 2, 3), (4, 4), (6, 2), replicas=2)
    plan = planner(2, 2, facts)
    cost = plan.layout_cost(p, {0: 1.0, 1: 1.0, 2: 3.0, 3: 1.0})
    one = plan.predict((0, 1), (4, 4), (6, 2)).step_time_s
    assert cost.replica_step_s[0] == pytest.approx(one) and cost.replica_step_s[1] > 2 * one
    assert cost.allreduce_s == pytest.approx(ring_allreduce_s(6 * 1000 * 1024, 2, 1e9, 1e-5))
    assert cost.step_time_s == pytest.approx(max(cost.replica_step_s) + cost.allreduce_s)
    assert len(cost.compute_s) == 4 and cost.compute_s[2] == pytest.approx(3 * cost.compute_s[0])


def test_a_replica_with_a_larger_share_is_priced_in_proportion():
    p = Placement((0, 1), (8,), (8,), replicas=2, shares=(48, 16))
    cost = planner(2, 1).layout_cost(p)
    assert cost.replica_step_s[0] == pytest.approx(3 * cost.replica_step_s[1])
    # a replica dropped: the one left trains on the whole batch, twice its old share
    alone = planner(2, 1).layout_cost(Placement((0,), (8,), (8,)))
    assert alone.step_time_s == pytest.approx(2 * planner(2, 1).layout_cost(Placement((0, 1), (8,), (8,), 2))
                                              .replica_step_s[0])


def test_ring_all_reduce():
    assert ring_allreduce_s(1e9, 1, 1e9) == 0.0
    assert ring_allreduce_s(1e9, 2, 1e9) == pytest.approx(1.0)
    assert ring_allreduce_s(1e9, 4, 1e9, 1e-3) == pytest.approx(1.5 + 6e-3)


# ---------------------------------------------------------------- the choice
def test_layout_shapes_divide_devices_and_batch():
    assert layout_shapes(4, 64, 8, microbatches=2) == [(1, 4, 2), (2, 2, 2), (4, 1, 2)]
    assert layout_shapes(4, 64, 2, microbatches=2) == [(2, 2, 2), (4, 1, 2)]  # at most 2 stages
    assert all(64 % (r * m) == 0 for r, _, m in layout_shapes(6, 64, 8))
    assert (3, 2, 1) not in layout_shapes(6, 64, 8)  # 64 images do not share out over 3 replicas


def test_data_parallelism_wins_when_the_models_fit_and_links_are_fast():
    choice = choose_layout(lambda r, m: planner(r, m), [0, 1, 2, 3], BATCH, layout_shapes(4, BATCH, 8))
    assert (choice.chosen.replicas, choice.chosen.stages) == (4, 1)
    assert choice.chosen.placement == Placement((0, 1, 2, 3), (8,), (8,), 4, (16, 16, 16, 16))


def test_a_pipeline_wins_when_one_device_cannot_hold_the_models():
    # each block's parameters take 1 GB: the 16 blocks (and their optimizer state) fit only when split
    facts = DeviceFacts(memory_bytes=lambda d: 12e9)
    choice = choose_layout(lambda r, m: planner(r, m, facts, param_kb=1e6), [0, 1, 2, 3], BATCH,
                           layout_shapes(4, BATCH, 8))
    assert choice.chosen.stages > 1
    assert all(not math.isfinite(c.step_time_s) and c.reason for c in choice.candidates if c.stages == 1)


def test_gradient_traffic_over_a_slow_link_turns_the_choice_to_a_pipeline():
    slow = DeviceFacts(link_bandwidth_bytes_per_s=1e8)
    choice = choose_layout(lambda r, m: planner(r, m, slow, param_kb=1e5), [0, 1], BATCH, layout_shapes(2, BATCH, 8))
    assert choice.chosen.replicas == 1


def test_a_slow_device_gets_a_smaller_share():
    choice = choose_layout(lambda r, m: planner(r, m), [0, 1], BATCH, [(2, 1, 1)], {0: 3.0})
    shares = choice.chosen.placement.shares
    assert shares[0] < shares[1] and sum(shares) == BATCH


# ---------------------------------------------------------------- failover options
def options_for(running: Placement, bad: int, alphas: dict[int, float], spares=(), lost=(),
                plan: StagePlanner | None = None):
    plan = plan or planner(running.replicas, 1)
    predicted = plan.layout_cost(running, alphas).step_time_s
    return {o.kind: o for o in replica_options(RunningPartition(running, predicted, predicted), alphas, None, bad,
                                                plan, COSTS, spares, lost)}


def test_a_failed_device_drops_its_replica_and_the_others_take_its_images():
    running = Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (32, 32))
    options = options_for(running, 3, dict.fromkeys(range(4), 1.0))
    assert options[OptionKind.DEGRADE].placement == Placement((0, 1), (4, 4), (4, 4))
    assert options[OptionKind.DEGRADE].inputs["dropped_replicas"] == [1]
    assert OptionKind.REPLACE not in options  # no spare


def test_a_slow_replica_is_offered_a_smaller_share_and_a_spare():
    running = Placement((0, 1, 2, 3), (8,), (8,), 4, (16, 16, 16, 16))
    options = options_for(running, 2, {0: 1.0, 1: 1.0, 2: 3.0, 3: 1.0}, spares=(7,))
    shares = options[OptionKind.REBALANCE].placement.shares
    assert shares[2] < 16 and sum(shares) == BATCH
    assert options[OptionKind.REBALANCE].predicted_step_s < options[OptionKind.KEEP].predicted_step_s
    assert options[OptionKind.REPLACE].placement.devices == (0, 1, 7, 3)
    assert options[OptionKind.DEGRADE].placement.replicas == 3


def test_a_lost_node_drops_every_replica_it_held():
    running = Placement((0, 1, 2, 3), (8,), (8,), 4, (16, 16, 16, 16))
    options = options_for(running, 2, dict.fromkeys(range(4), 1.0), lost=(3,))
    assert options[OptionKind.DEGRADE].placement == Placement((0, 1), (8,), (8,), 2, (32, 32))
    assert OptionKind.REBALANCE not in options and OptionKind.REPLACE not in options


def test_replicas_are_priced_as_they_run_eagerly_on_a_gpu():
    """Replicas run eagerly (graphs with replicas were not tried), so their blocks are profiled eagerly;
    one pipeline with pipeline.cuda_graphs, graphed."""
    from synapse.config import PipelineConfig, TrainerConfig
    from synapse.planning import profile_launch

    gpu, graphs = TrainerConfig(accelerator="cuda"), PipelineConfig(cuda_graphs=True)
    assert profile_launch(gpu, graphs) == "graphed"
    assert profile_launch(gpu, graphs, replicas=2) == "eager"
    assert profile_launch(TrainerConfig(accelerator="cpu"), graphs) == "eager"


# ---------------------------------------------------------------- replicas cut differently
SHRUNK = Placement.of_pipelines([Placement((0, 1), (4, 4), (5, 3)), Placement((2,), (8,), (8,))], (40, 24))


def test_replicas_cut_differently_answer_by_rank():
    p = SHRUNK
    assert (p.world_size, p.replicas, p.replica_stages) == (3, 2, (2, 1)) and not p.cut_alike
    assert [(p.replica_of(r), p.stage_of(r), p.stages_of_rank(r)) for r in range(3)] == [(0, 0, 2), (0, 1, 2),
                                                                                         (1, 0, 1)]
    assert [p.student_range(r) for r in range(3)] == [range(0, 5), range(5, 8), range(0, 8)]
    assert [p.teacher_range(r) for r in range(3)] == [range(0, 4), range(4, 8), range(0, 8)]
    assert p.pipeline(1) == Placement((2,), (8,), (8,)) and p.replica_devices(0) == (0, 1)
    assert p.stage_peers() == [[0], [1], [2]]  # no rank runs the blocks another runs
    with pytest.raises(PartitionError, match=r"replicas of \[2, 1\] stages have no one stage count"):
        _ = p.num_stages
    with pytest.raises(PartitionError, match="rank 3 is not one of this layout's 3 ranks"):
        p.replica_of(3)


def test_gradient_groups_are_the_owners_of_each_run_of_blocks():
    """2 x 2 with replica 1 shrunk to one stage: blocks of stage 0 between ranks {0, 2}, of stage 1 between
    {1, 2}; cut alike, a stage's ranks across replicas; cuts that do not line up split the groups further."""
    assert SHRUNK.student_groups() == [((0, 2), range(0, 5)), ((1, 2), range(5, 8))]
    assert Placement((0, 1, 2, 3), (4, 4), (6, 2), 2).student_groups() == [((0, 2), range(0, 6)),
                                                                           ((1, 3), range(6, 8))]
    odd = Placement.of_pipelines([Placement((0, 1), (4, 4), (5, 3)), Placement((2, 3), (4, 4), (2, 6))])
    assert odd.student_groups() == [((0, 2), range(0, 2)), ((0, 3), range(2, 5)), ((1, 3), range(5, 8))]


@given(st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=2, max_size=4))
def test_every_block_has_one_owner_per_replica_and_each_rank_meets_its_groups_in_block_order(cuts):
    blocks = 16
    pipelines = []
    start = 0
    for stages in cuts:
        counts = list(stages[:-1]) + [blocks - sum(stages[:-1])] if sum(stages[:-1]) < blocks else [blocks]
        pipelines.append(Placement(tuple(range(start, start + len(counts))), tuple(counts), tuple(counts)))
        start += len(counts)
    layout = Placement.of_pipelines(pipelines)
    groups = layout.student_groups()
    assert [b for _, blocks_of in groups for b in blocks_of] == list(range(blocks))  # every block once, in order
    for owners, blocks_of in groups:
        assert [layout.replica_of(r) for r in owners] == list(range(layout.replicas))
        assert all(set(blocks_of) <= set(layout.student_range(r)) for r in owners)


def test_cuts_alike_are_written_one_way_and_records_round_trip():
    alike = Placement.of_pipelines([Placement((0, 1), (4, 4), (4, 4)), Placement((2, 3), (4, 4), (4, 4))])
    assert alike == Placement((0, 1, 2, 3), (4, 4), (4, 4), 2) and alike.cut_alike
    assert SHRUNK.to_dict()["replica_stages"] == [2, 1] and Placement.from_dict(SHRUNK.to_dict()) == SHRUNK
    with pytest.raises(PartitionError, match="need 3 devices and 3 block counts"):
        Placement((0, 1), (4, 4, 8), (5, 3, 8), 2, replica_stages=(2, 1))
    with pytest.raises(PartitionError, match="one stage count"):
        Placement((0, 1, 2), (4, 4, 8), (5, 3, 8), 2, replica_stages=(3,))
    with pytest.raises(PartitionError, match=r"partition.student=\[8, 1\] \(replica 1\) covers 9 blocks"):
        Placement((0, 1, 2, 3), (4, 4, 4, 4), (5, 3, 8, 1), 2, replica_stages=(2, 2)).check_block_counts(8, 8)
    assert SHRUNK.without_replica(0, 64, 4) == Placement((2,), (8,), (8,))
    assert SHRUNK.on((5, 6, 7)).replica_devices(1) == (7,)


def test_a_slow_link_slows_the_all_reduce_of_the_groups_it_is_in_and_no_other():
    """A ring moves at its slowest link's pace: device 3's link at beta 4 slows stage 1's group (devices 1
    and 3) four times in its bytes, not stage 0's (devices 0 and 2); the step waits for the slower one."""
    facts = DeviceFacts(link_bandwidth_bytes_per_s=1e9, link_latency_s=1e-5)
    p = Placement((0, 1, 2, 3), (4, 4), (6, 2), replicas=2)
    plan = planner(2, 2, facts)
    healthy = plan.layout_cost(p).allreduce_s
    stage_0 = ring_allreduce_s(6 * 1000 * 1024, 2, 1e9, 1e-5)
    stage_1_slow = ring_allreduce_s(2 * 1000 * 1024, 2, 1e9 / 4, 1e-5)
    assert healthy == pytest.approx(stage_0)
    assert plan.layout_cost(p, betas={3: 4.0}).allreduce_s == pytest.approx(max(stage_0, stage_1_slow))
    assert plan.layout_cost(p, betas={3: 8.0}).allreduce_s == pytest.approx(
        ring_allreduce_s(2 * 1000 * 1024, 2, 1e9 / 8, 1e-5))  # now the slower group
    assert plan.layout_cost(p, betas={2: 4.0}).allreduce_s == pytest.approx(
        ring_allreduce_s(6 * 1000 * 1024, 2, 1e9 / 4, 1e-5))
    assert plan.layout_cost_by_replica(p, betas={2: 4.0}).allreduce_s == plan.layout_cost(p, betas={2: 4.0}).allreduce_s
    assert plan.layout_cost(p, betas={3: 1.0}).allreduce_s == healthy


def test_replicas_cut_differently_are_priced_pipeline_by_pipeline():
    facts = DeviceFacts(link_bandwidth_bytes_per_s=1e9, link_latency_s=1e-5)
    plan = planner(2, 2, facts)
    cost = plan.layout_cost(SHRUNK.with_shares((32, 32)), {0: 1.0, 1: 1.0, 2: 2.0})
    assert cost.replica_step_s[0] == pytest.approx(plan.predict((0, 1), (4, 4), (5, 3)).step_time_s)
    assert cost.replica_step_s[1] == pytest.approx(plan.predict((2,), (8,), (8,), {2: 2.0}).step_time_s)
    assert len(cost.compute_s) == 3
    # rank 2 owns both groups' blocks and reduces them one after the other: 5 + 3 blocks' gradients
    both = ring_allreduce_s(5 * 1000 * 1024, 2, 1e9, 1e-5) + ring_allreduce_s(3 * 1000 * 1024, 2, 1e9, 1e-5)
    assert cost.allreduce_s == pytest.approx(both)
    assert cost.step_time_s == pytest.approx(max(cost.replica_step_s) + both)


def test_a_lost_device_shrinks_its_replica_over_the_survivors_with_the_share_that_finishes_together():
    running = Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (32, 32))
    alphas = dict.fromkeys(range(4), 1.0)
    plan = planner(2, 4)  # 4 micro-batches: a pipeline of 2 is faster than one device
    options = options_for(running, 3, alphas, plan=plan)
    shrink = options[OptionKind.SHRINK]
    assert shrink.placement.replica_stages == (2, 1) and shrink.placement.devices == (0, 1, 2)
    assert shrink.placement.pipeline(0) == running.pipeline(0)  # the other replica keeps its cut
    teacher, student, _ = plan.plan((2,), (1.0,))
    assert shrink.placement.replica_cut(1) == (teacher, student)
    # the shares: the best of every split of the batch between the two (the replicas finish together)
    splits = [shrink.placement.with_shares((a, BATCH - a)) for a in range(4, BATCH, 4)]
    best = min(plan.layout_cost(p, alphas).step_time_s for p in splits)
    assert shrink.predicted_step_s == pytest.approx(best)
    assert shrink.placement.shares[1] < shrink.placement.shares[0]  # one device gets fewer images
    assert shrink.inputs["shrunk_replicas"] == [1] and shrink.inputs["dropped_devices"] == [3]
    # beside it, the other options stay priced: the whole replica dropped is slower than shrinking it
    assert shrink.predicted_step_s < options[OptionKind.DEGRADE].predicted_step_s


def test_a_replica_of_one_device_cannot_shrink_and_a_lost_node_shrinks_each_replica_it_touched():
    assert OptionKind.SHRINK not in options_for(Placement((0, 1), (8,), (8,), 2, (32, 32)), 1, {0: 1.0, 1: 1.0})
    options = options_for(SHRUNK.with_shares((32, 32)), 2, {0: 1.0, 1: 1.0, 2: 1.0})
    assert OptionKind.SHRINK not in options and options[OptionKind.DEGRADE].placement.devices == (0, 1)
    running = Placement((0, 1, 2, 3, 4, 5), (3, 3, 2), (3, 3, 2), 2, (32, 32))
    lost = options_for(running, 2, dict.fromkeys(range(6), 1.0), lost=(3,))  # replica 0's last, replica 1's first
    both = lost[OptionKind.SHRINK].placement  # both re-cut alike on two devices: a 2 x 2 mesh again
    assert both.devices == (0, 1, 4, 5) and (both.replicas, both.num_stages) == (2, 2)
    everything = options_for(running, 0, dict.fromkeys(range(6), 1.0), lost=(1, 2, 3, 4, 5))
    assert OptionKind.SHRINK not in everything and OptionKind.DEGRADE not in everything
    # a node of devices 0-2 lost under 3 x 2: replica 0 goes whole, replica 1 keeps device 3. The shrunk layout
    # drops the one and shrinks the other (it was not offered: DEGRADE onto (4, 5) left device 3 idle)
    three = Placement(tuple(range(6)), (4, 4), (4, 4), 3, (22, 22, 20))
    node = options_for(three, 0, dict.fromkeys(range(6), 1.0), lost=(1, 2))
    assert node[OptionKind.DEGRADE].placement.devices == (4, 5)
    shrunk = node[OptionKind.SHRINK].placement
    assert shrunk.devices == (3, 4, 5) and shrunk.replica_stages == (1, 2) and sum(shrunk.shares) == BATCH
    assert node[OptionKind.SHRINK].inputs["dropped_devices"] == [0, 1, 2]


def test_a_shrunk_layout_is_replanned_replica_by_replica_and_shrinks_again():
    alphas = {0: 1.0, 1: 3.0, 2: 1.0}
    options = options_for(SHRUNK.with_shares((32, 32)), 1, alphas)
    plan = planner(2, 1)
    replan = options[OptionKind.REPLAN].placement
    assert replan.replica_cut(0) == plan.plan((0, 1), (1.0, 3.0))[:2] and replan.replica_stages == (2, 1)
    again = options[OptionKind.SHRINK].placement  # replica 0 loses device 1: both replicas are one device
    assert again == Placement((0, 2), (8,), (8,), 2, again.shares) and sum(again.shares) == BATCH


def test_on_a_hard_failure_eta_and_shrink_shrink_and_the_other_baselines_drop_the_replica():
    from synapse.decision import DecisionContext, make_policy

    running = Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (32, 32))
    options = tuple(options_for(running, 3, dict.fromkeys(range(4), 1.0)).values())
    ctx = DecisionContext(step=5, remaining_steps=100, options=options, hard_failure=True, failed_device=3)
    assert make_policy("eta").decide(ctx).action is OptionKind.SHRINK
    assert make_policy("degrade").decide(ctx).action is OptionKind.DEGRADE
    assert make_policy("keep").decide(ctx).action is OptionKind.DEGRADE
    assert make_policy("shrink").decide(ctx).action is OptionKind.SHRINK
    one_device_replicas = Placement((0, 1), (8,), (8,), 2, (32, 32))  # nothing to shrink to: the replica goes
    alone = tuple(options_for(one_device_replicas, 1, dict.fromkeys(range(2), 1.0)).values())
    lost = DecisionContext(step=5, remaining_steps=100, options=alone, hard_failure=True, failed_device=1)
    assert make_policy("shrink").decide(lost).action is OptionKind.DEGRADE


def test_policy_shrink_shrinks_the_slow_replica_once_per_slowdown():
    from synapse.decision import DecisionContext, make_policy

    running = Placement((0, 1, 2, 3), (4, 4), (4, 4), 2, (32, 32))
    options = tuple(options_for(running, 3, {0: 1.0, 1: 1.0, 2: 1.0, 3: 3.0}, plan=planner(2, 4)).values())
    ctx = DecisionContext(step=50, remaining_steps=100, options=options, slowdown_detected=True,
                          consecutive_detections=1)
    decision = make_policy("shrink").decide(ctx)
    assert decision.action is OptionKind.SHRINK and 3 not in decision.chosen.placement.devices
    again = DecisionContext(step=60, remaining_steps=90, options=options, slowdown_detected=True,
                            consecutive_detections=2, actions_in_episode=1)
    assert make_policy("shrink").decide(again).action is OptionKind.KEEP
