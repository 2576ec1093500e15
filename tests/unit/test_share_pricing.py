"""A replica's share priced at its own micro-batch: block times read off profiles measured at several
micro-batch sizes (``profile_at_micro_batch``), the planner's ``size_profiles``, and the REBALANCE and
DEGRADE options they price. Pure: plain numbers, no torch."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse.decision import OptionKind, RunningPartition, replica_options
from synapse.partitioning import (
    BlockProfile,
    ModelProfile,
    Placement,
    ProfileError,
    StagePlanner,
    StepSpec,
    scale_to_micro_batch,
)
from synapse.partitioning.profile import profile_at_micro_batch
from synapse.planning import share_micro_batches

BATCH = 64
COSTS = dict.fromkeys(OptionKind, 5.0)


def measured(name: str, micro_batch: int, fixed_ms: float, ms_per_image: float, blocks: int = 4,
             backward: bool = True) -> ModelProfile:
    """A model whose every block pays ``fixed_ms`` a pass whatever it holds, plus ``ms_per_image``."""
    forward = fixed_ms + ms_per_image * micro_batch
    rows = [BlockProfile(f"{name}{k}", forward, 2 * forward if backward else 0.0, 1.0, 10.0 * micro_batch,
                         10.0 * micro_batch, 100.0) for k in range(blocks)]
    return ModelProfile(name, tuple(rows), micro_batch=micro_batch)


# ---------------------------------------------------------------- one block's time at another size
def test_measured_sizes_are_read_back_exactly():
    profiles = [measured("s", b, 3.0, 0.5) for b in (4, 8, 16)]
    for p in profiles:
        assert profile_at_micro_batch(profiles, p.micro_batch) == p


def test_between_two_sizes_a_time_is_on_the_line_through_them():
    profiles = [measured("s", 4, 3.0, 0.5), measured("s", 16, 3.0, 0.5)]
    at = profile_at_micro_batch(profiles, 10)
    assert at.blocks[0].forward_time_ms == pytest.approx(3.0 + 0.5 * 10)
    assert at.blocks[0].backward_time_ms == pytest.approx(2 * (3.0 + 0.5 * 10))
    assert at.blocks[0].output_activation_size_kb == pytest.approx(100.0)  # exactly in proportion
    assert at.blocks[0].parameter_size_kb == 100.0 and at.micro_batch == 10


def test_below_the_smallest_size_per_call_costs_remain():
    profiles = [measured("s", 8, 3.0, 0.5), measured("s", 16, 3.0, 0.5)]
    at = profile_at_micro_batch(profiles, 2).blocks[0].forward_time_ms
    assert at == pytest.approx(3.0 + 0.5 * 2)  # proportional scaling would say 7 * 2 / 8 = 1.75
    # measurements whose time grows faster than the images (noise): never below proportional scaling
    noisy = [measured("s", 8, 0.0, 1.0), measured("s", 16, -4.0, 1.5)]  # 8 ms, then 20 ms
    assert profile_at_micro_batch(noisy, 2).blocks[0].forward_time_ms == pytest.approx(8.0 * 2 / 8)


def test_above_the_largest_size_the_last_line_goes_on_and_never_drops():
    profiles = [measured("s", 4, 3.0, 0.5), measured("s", 8, 3.0, 0.5)]
    assert profile_at_micro_batch(profiles, 32).blocks[0].forward_time_ms == pytest.approx(3.0 + 0.5 * 32)
    falling = [measured("s", 4, 9.0, 0.0), measured("s", 8, 5.0, 0.0)]
    assert profile_at_micro_batch(falling, 32).blocks[0].forward_time_ms == pytest.approx(5.0)


def test_one_measured_size_scales_in_proportion_as_before():
    one = measured("s", 8, 3.0, 0.5)
    assert profile_at_micro_batch([one], 4) == scale_to_micro_batch(one, 4)


@given(st.lists(st.integers(1, 64), min_size=2, max_size=5, unique=True), st.floats(0.0, 5.0),
       st.floats(0.01, 2.0), st.floats(0.5, 128.0))
def test_affine_measurements_are_reproduced_at_every_size(sizes, fixed, per_image, size):
    """Times that are fixed + per image x size (what a pass costs) are read back exactly at any size."""
    profiles = [measured("s", b, fixed, per_image) for b in sizes]
    got = profile_at_micro_batch(profiles, size).blocks[0].forward_time_ms
    assert got == pytest.approx(fixed + per_image * size, rel=1e-9, abs=1e-12)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=5, unique=True), st.floats(0.5, 128.0),
       st.floats(0.5, 128.0))
def test_more_images_never_take_less_time_when_the_measurements_grow(sizes, a, b):
    profiles = [measured("s", s, 1.0, 0.3) for s in sizes]
    small, large = sorted((a, b))
    assert (profile_at_micro_batch(profiles, small).blocks[0].forward_time_ms
            <= profile_at_micro_batch(profiles, large).blocks[0].forward_time_ms + 1e-12)


@pytest.mark.parametrize("profiles, size, words", [
    ([], 4, "no measured profiles"),
    ([measured("s", 4, 1.0, 1.0)], 0, "positive number"),
    ([measured("s", 4, 1.0, 1.0)], float("nan"), "positive number"),
    ([dataclasses.replace(measured("s", 4, 1.0, 1.0), micro_batch=None)], 4, "does not record its micro-batch"),
    ([measured("s", 4, 1.0, 1.0), measured("t", 8, 1.0, 1.0)], 4, "different blocks"),
    ([measured("s", 4, 1.0, 1.0), measured("s", 4, 2.0, 1.0)], 4, "repeat a micro-batch size"),
])
def test_profiles_that_cannot_be_read_at_another_size_are_refused(profiles, size, words):
    with pytest.raises(ProfileError, match=words):
        profile_at_micro_batch(profiles, size)


# ---------------------------------------------------------------- a replica priced at its share
def sized_planner(replicas: int, microbatches: int, fixed_ms: float, sizes=(2, 4, 8, 16, 32)) -> StagePlanner:
    """Planner for ``replicas`` equal shares, with profiles measured at ``sizes`` (fixed + 0.1 ms an image)."""
    own = BATCH // (replicas * microbatches)
    at = {b: (measured("t", b, fixed_ms, 0.1, backward=False), measured("s", b, fixed_ms, 0.1)) for b in sizes}
    teacher, student = at[own]
    return StagePlanner(teacher, student, StepSpec(microbatches), replicas=replicas,
                        size_profiles=tuple(at[b] for b in sizes))


def test_a_replica_at_another_share_is_priced_from_profiles_at_its_micro_batch():
    plan = sized_planner(4, 1, fixed_ms=2.0)
    p = Placement((0, 1, 2, 3), (4,), (4,), 4, (4, 20, 20, 20))
    cost = plan.layout_cost(p)
    for replica, share in enumerate(p.shares):
        at = StagePlanner(measured("t", share, 2.0, 0.1, backward=False), measured("s", share, 2.0, 0.1),
                          StepSpec(1))
        assert cost.replica_step_s[replica] == pytest.approx(at.predict((replica,), (4,), (4,)).step_time_s)
        assert cost.compute_s[replica] == pytest.approx(at.per_step_compute_s((replica,), (4,), (4,))[0])
    # proportional scaling would price the share of 4 at a quarter of 16's time: it is more
    assert cost.replica_step_s[0] > 0.25 * plan.layout_cost(Placement((0, 1, 2, 3), (4,), (4,), 4)).replica_step_s[0]


def test_without_per_call_costs_the_share_is_priced_in_proportion_as_before():
    sized = sized_planner(4, 1, fixed_ms=0.0)
    plain = dataclasses.replace(sized, size_profiles=())
    p = Placement((0, 1, 2, 3), (4,), (4,), 4, (4, 20, 20, 20))
    assert sized.layout_cost(p).replica_step_s == pytest.approx(plain.layout_cost(p).replica_step_s)


def test_a_calibrated_planner_keeps_its_correction_at_the_new_share():
    """The planner's own profiles may be corrected by what the stages measured (2x here); the share
    changes the price by the raw profiles' ratio, so the correction holds at every share."""
    sized = sized_planner(4, 1, fixed_ms=2.0)
    doubled = [dataclasses.replace(p, blocks=tuple(dataclasses.replace(b, forward_time_ms=2 * b.forward_time_ms,
                                                                       backward_time_ms=2 * b.backward_time_ms)
                                                   for b in p.blocks)) for p in (sized.teacher, sized.student)]
    calibrated = sized.with_profiles(*doubled)
    p = Placement((0, 1, 2, 3), (4,), (4,), 4, (4, 20, 20, 20))
    assert calibrated.layout_cost(p).replica_step_s == pytest.approx(
        [2 * t for t in sized.layout_cost(p).replica_step_s])


def test_rebalance_is_priced_with_the_per_call_costs_a_smaller_share_keeps():
    """A replica 4x slow: proportional pricing promises its share of 4 takes a quarter of its time; with
    per-call costs measured it takes more, and REBALANCE's predicted step says so."""
    running = Placement((0, 1, 2, 3), (4,), (4,), 4, (16, 16, 16, 16))
    alphas = {0: 1.0, 1: 1.0, 2: 4.0, 3: 1.0}

    def rebalance(plan: StagePlanner):
        predicted = plan.layout_cost(running, alphas).step_time_s
        options = {o.kind: o for o in replica_options(RunningPartition(running, predicted, predicted), alphas, None,
                                                       2, plan, COSTS)}
        return options[OptionKind.REBALANCE], options[OptionKind.KEEP]

    sized = sized_planner(4, 1, fixed_ms=2.0)
    honest, keep = rebalance(sized)
    linear, _ = rebalance(dataclasses.replace(sized, size_profiles=()))
    assert honest.predicted_step_s > linear.predicted_step_s
    assert honest.predicted_step_s == pytest.approx(sized.layout_cost(honest.placement, alphas).step_time_s)
    assert honest.predicted_step_s < keep.predicted_step_s and sum(honest.placement.shares) == BATCH


def test_degrade_prices_the_survivors_larger_shares_from_the_profiles():
    running = Placement((0, 1, 2, 3), (4,), (4,), 4, (16, 16, 16, 16))
    sized = sized_planner(4, 1, fixed_ms=2.0)
    three = Placement((0, 1, 3), (4,), (4,), 3, (24, 24, 16))
    at_24 = StagePlanner(measured("t", 24, 2.0, 0.1, backward=False), measured("s", 24, 2.0, 0.1), StepSpec(1))
    assert sized.layout_cost(three).replica_step_s[0] == pytest.approx(at_24.predict((0,), (4,), (4,)).step_time_s)
    assert running.replicas == 4


@pytest.mark.parametrize("batch, replicas, microbatches, sizes", [
    (64, 4, 1, [4, 8, 16, 32]),
    (64, 2, 4, [2, 4, 8, 15]),  # one replica holds at most 15 of the 16 micro-batches' worth
    (32, 4, 4, [2, 4]),  # nothing below 2 images: BatchNorm does not train on fewer
    (16, 2, 1, [2, 4, 8, 15]),  # twice the own share would leave the other replica no micro-batch
])
def test_share_sizes_profiled_cover_what_a_share_may_become(batch, replicas, microbatches, sizes):
    assert share_micro_batches(batch, replicas, microbatches) == sizes


def rebalanced_option(plan: StagePlanner, running: Placement, alphas: dict[int, float]):
    predicted = plan.layout_cost(running, alphas).step_time_s
    options = {o.kind: o for o in replica_options(RunningPartition(running, predicted, predicted), alphas, None,
                                                   None, plan, COSTS)}
    return options.get(OptionKind.REBALANCE)


@given(st.floats(1.0, 6.0), st.floats(0.0, 8.0), st.sampled_from([1, 2, 4]))
def test_two_replicas_get_the_best_split_of_all(slowdown, fixed_ms, microbatches):
    """Every split of the batch between two replicas priced: REBALANCE offers the fastest."""
    plan = sized_planner(2, microbatches, fixed_ms, sizes=(1, 2, 4, 8, 16, 32, 64))
    running = Placement((0, 1), (4,), (4,), 2, (32, 32))
    alphas = {0: slowdown, 1: 1.0}
    splits = [Placement((0, 1), (4,), (4,), 2, (a, BATCH - a)) for a in range(microbatches, BATCH, microbatches)]
    best = min(plan.layout_cost(p, alphas).step_time_s for p in splits)
    option = rebalanced_option(plan, running, alphas)
    if option is None:  # nothing to change: the running split is already the fastest
        assert plan.layout_cost(running, alphas).step_time_s == pytest.approx(best)
    else:
        assert plan.layout_cost(option.placement, alphas).step_time_s == pytest.approx(best)
        assert option.placement.shares[0] <= option.placement.shares[1]


@given(st.lists(st.floats(1.0, 5.0), min_size=4, max_size=4), st.floats(0.0, 8.0))
def test_no_single_move_of_images_from_the_slowest_replica_would_be_faster(slowdowns, fixed_ms):
    plan = sized_planner(4, 1, fixed_ms, sizes=(1, 2, 4, 8, 16, 32, 64))
    running = Placement((0, 1, 2, 3), (4,), (4,), 4, (16, 16, 16, 16))
    alphas = dict(enumerate(slowdowns))
    option = rebalanced_option(plan, running, alphas)
    chosen = option.placement if option else running
    step = plan.layout_cost(chosen, alphas)
    assert sum(chosen.shares) == BATCH and min(chosen.shares) >= 1
    slowest = step.replica_step_s.index(max(step.replica_step_s))
    for other in range(4):
        if other != slowest and chosen.shares[slowest] > 1:
            shares = list(chosen.shares)
            shares[slowest] -= 1
            shares[other] += 1
            moved = dataclasses.replace(chosen, shares=tuple(shares))
            assert plan.layout_cost(moved, alphas).step_time_s >= step.step_time_s - 1e-12
    if option is not None:
        assert option.predicted_step_s <= plan.layout_cost(running, alphas).step_time_s


@given(st.lists(st.tuples(st.sampled_from([2, 4, 8, 16, 32]), st.floats(0.0, 50.0)), min_size=1, max_size=5,
                unique_by=lambda x: x[0]), st.sampled_from([(4, 4, 20, 36), (16, 16, 16, 16), (30, 30, 2, 2)]))
def test_noisy_profiles_never_price_a_share_outside_what_its_images_allow(measurements, shares):
    """Whatever the profiles measured (on a loaded machine a block at 16 images took 11.8 ms and 814 ms
    minutes apart), a replica with fewer images than profiled costs no more than at the profiled size and
    no less than in proportion, and one with more no less and no more than in proportion."""
    at = {b: (measured("t", b, fixed, 0.0, backward=False), measured("s", b, fixed, 0.0))
          for b, fixed in measurements}
    own = 16
    profiled = at.get(own, (measured("t", own, 1.0, 0.1, backward=False), measured("s", own, 1.0, 0.1)))
    plan = StagePlanner(*profiled, StepSpec(1), replicas=4, size_profiles=tuple(at.values()))
    p = Placement((0, 1, 2, 3), (4,), (4,), 4, shares)
    equal = plan.layout_cost(Placement((0, 1, 2, 3), (4,), (4,), 4)).replica_step_s
    for replica, share in enumerate(shares):
        scale = share / own
        step = plan.layout_cost(p).replica_step_s[replica]
        low, high = sorted((equal[replica], scale * equal[replica]))
        assert low * (1 - 1e-9) <= step <= high * (1 + 1e-9)


# ---------------------------------------------------------------- the run's planner
def test_a_replicated_run_under_failover_is_profiled_at_the_share_sizes(make_config, tiny_run):
    """Real profiles of the tiny run's models, measured (or read from the cache) at every size a share
    may take; one pipeline, or replicas without failover, measure only their own."""
    from synapse import planning
    from synapse.data import data_kwargs, dataset_info

    def planner_of(replicas: int, failover: bool) -> StagePlanner:
        cfg = make_config(*tiny_run, "trainer.accelerator=cpu", f"trainer.devices={replicas}",
                          f"trainer.replicas={replicas}", "data.batch_size=32", "pipeline.microbatches=1",
                          f"failover.enabled={str(failover).lower()}")
        info = dataset_info(cfg.data.name, **data_kwargs(cfg.data, cfg.seed))
        return planning.build_stage_planner(cfg, info, 1, log=lambda m: None, replicas=replicas)

    replicated = planner_of(4, True)
    assert [s.micro_batch for _, s in replicated.size_profiles] == share_micro_batches(32, 4, 1) == [2, 4, 8, 16]
    assert [t.micro_batch for t, _ in replicated.size_profiles] == [2, 4, 8, 16]
    assert replicated.student.micro_batch == 8
    assert planner_of(4, False).size_profiles == () and planner_of(1, True).size_profiles == ()


@given(st.floats(1.0, 4.0), st.floats(0.0, 8.0), st.sampled_from([2, 4]))
def test_a_shrunk_replica_gets_the_best_split_of_all_priced_at_each_share_s_micro_batch(slowdown, fixed_ms,
                                                                                      microbatches):
    """Replica 1 of 2 x 2 loses a device: SHRINK re-cuts it on the survivor and shares the batch out as the
    REBALANCE search does, each share priced on the profiles at its own micro-batch: the best of every split."""
    plan = sized_planner(2, microbatches, fixed_ms, sizes=(1, 2, 4, 8, 16, 32, 64))
    running = Placement((0, 1, 2, 3), (2, 2), (2, 2), 2, (32, 32))
    alphas = {0: 1.0, 1: 1.0, 2: slowdown, 3: 1.0}
    predicted = plan.layout_cost(running, alphas).step_time_s
    options = {o.kind: o for o in replica_options(RunningPartition(running, predicted, predicted), alphas, None, 3,
                                                   plan, COSTS)}
    shrunk = options[OptionKind.SHRINK].placement
    assert shrunk.replica_stages == (2, 1) and shrunk.replica_devices(1) == (2,)
    splits = [shrunk.with_shares((a, BATCH - a)) for a in range(microbatches, BATCH, microbatches)]
    best = min(plan.layout_cost(p, alphas).step_time_s for p in splits)
    assert options[OptionKind.SHRINK].predicted_step_s == pytest.approx(best)
    assert sum(shrunk.shares) == BATCH and all(s % microbatches == 0 for s in shrunk.shares)
