"""The partitioner's exact shortcuts against its plain path: DP values kept across searches
(`KeptStageValues`), windows read from their ends, window starts read from a coarse index of the
prefix sums. Same plans, same DP counts, on sequences of related cost models as a controller asks
them (a stage's speed, link, memory or contention changed, earlier devices asked again)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.partitioning import CostModel, DeviceSpec, PlanError, StepSpec, even_partition
from synapse.partitioning.partitioner import (
    KeptStageValues,
    PartitionDP,
    _BottleneckSearch,
    _clear_buckets_per_s,
    _clear_sum_index,
    _WindowMin,
)
from tests.unit.test_partitioner import compositions, random_case, random_profile

FIELDS = ("alpha", "beta", "memory_bytes", "contention", "link_latency_s")


def related_models(seed: int, changes: list[tuple[int, str, float]], stages: int) -> list[CostModel]:
    """A cost model, then one per change (a stage's field set to a value from a few, so values repeat);
    a change of stage -1 goes back to the first model's devices (its prefixes and bounds asked again)."""
    rng = np.random.default_rng(seed)
    teacher = random_profile(rng, stages + int(rng.integers(0, 4)), "t", forward_only=True)
    student = random_profile(rng, stages + int(rng.integers(0, 5)), "s", forward_only=False)
    step = StepSpec(microbatches=int(rng.choice([2, 4, 8])), schedule=str(rng.choice(["gpipe", "1f1b"])),
                    optimizer_state_multiplier=1.0)
    devices = [DeviceSpec(f"d{r}", alpha=float(rng.choice([1.0, 1.5, 3.0])), link_bandwidth_bytes_per_s=1e8)
               for r in range(stages)]
    first = CostModel(teacher, student, devices, step)
    even_memory = max(first.evaluate(even_partition(len(teacher), stages),
                                     even_partition(len(student), stages)).stage_memory_bytes)
    models = [first]
    for stage, field, value in changes:
        if stage < 0:
            devices = list(first.devices)
        else:
            stage %= stages
            setting = {"alpha": value, "beta": value, "contention": max(1.0, value), "link_latency_s": value * 1e-3,
                       "memory_bytes": math.inf if value > 2.5 else even_memory * (0.8 + value)}[field]
            devices = [dataclasses.replace(d, **{field: setting}) if r == stage else d for r, d in enumerate(devices)]
        models.append(CostModel(teacher, student, devices, step))
    return models


def search(model: CostModel, kept: KeptStageValues | None) -> tuple[str, int]:
    dp = PartitionDP(model, kept)
    try:
        return repr(_BottleneckSearch(dp, model).run()), dp.solves
    except PlanError as error:
        return f"PlanError: {error}", dp.solves


change = st.tuples(st.integers(-1, 7), st.sampled_from(FIELDS), st.sampled_from([0.5, 1.0, 1.25, 2.0, 3.0]))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), stages=st.integers(1, 5), changes=st.lists(change, min_size=1, max_size=10),
       budget=st.sampled_from([0, 40_000, 32 << 20]))
def test_searches_with_kept_values_return_the_plain_searches_plans(seed, stages, changes, budget):
    """Every search of a sequence, sharing one `KeptStageValues` (sometimes too small to keep much), returns
    the plan and DP count of a search from scratch."""
    kept = KeptStageValues(budget)
    for model in related_models(seed, changes, stages):
        assert search(model, kept) == search(model, None)
    assert kept.kept_bytes <= budget


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), stages=st.integers(2, 5), changes=st.lists(change, min_size=1, max_size=8))
def test_bounded_dps_with_kept_values_answer_as_plain_ones_at_the_same_bounds(seed, stages, changes):
    """The same bounds asked of every model (the first model's stage times, a hair either side, strict and
    not; the min-max too): a kept stage is reused only where the first stages and the question match."""
    models = related_models(seed, changes, stages)
    first = PartitionDP(models[0])
    try:
        plan = _BottleneckSearch(first, models[0]).run()
    except PlanError:
        return
    near = (plan.max_s, plan.sum_s / stages)
    bounds = {b for t in near for b in (t, np.nextafter(t, 0.0), np.nextafter(t, math.inf))}
    kept = KeptStageValues()
    for model in models:
        with_kept, plain = PartitionDP(model, kept), PartitionDP(model)
        assert with_kept.min_bottleneck() == plain.min_bottleneck()
        for bound in sorted(bounds):
            for strict in (False, True):
                assert repr(with_kept.min_sum(float(bound), strict)) == repr(plain.min_sum(float(bound), strict))


def test_kept_values_are_reused_across_models_that_share_first_stages():
    """Not a tautology of the tests above: the second model (its last stage slower) starts after the first
    stages it shares with the first, so its min-max DP advances one stage, not all of them."""
    models = related_models(7, [(3, "alpha", 2.0)], stages=4)
    kept = KeptStageValues()
    PartitionDP(models[0], kept).min_bottleneck()
    advanced = []
    dp = PartitionDP(models[1], kept)
    original = dp._advance_max
    dp._advance_max = lambda stage, values: advanced.append(stage) or original(stage, values)  # type: ignore
    dp.min_bottleneck()
    assert advanced == [3]


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_windows_read_from_their_ends_are_the_plain_minima(n):
    rng = np.random.default_rng(n)
    rows = np.where(rng.random((3, n + 1)) < 0.2, np.inf, rng.normal(size=(3, n + 1)))
    row, end = (np.array(v)[:, None] for v in zip(*[(r, e) for r in range(3) for e in range(1, n + 1)]))
    table = _WindowMin(rows, row)
    for width in range(0, n + 1):
        lo = np.maximum(end - width, 0)
        expected = [[np.min(rows[r, a:e], initial=np.inf)] for r, a, e in zip(row[:, 0], lo[:, 0], end[:, 0])]
        assert table.query_to_ends(lo, end, row * (n + 1) + end).tolist() == expected


@given(sums=st.lists(st.floats(0.0, 50.0), min_size=1, max_size=30), thresholds=st.lists(
    st.floats(-10.0, 1000.0), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_the_coarse_index_counts_the_sums_below_a_threshold_wherever_it_is_not_in_doubt(sums, thresholds):
    """`_clear_sum_index`: where an index is not in doubt, the count is np.searchsorted's, for every threshold
    within a quarter bucket of the one read (a margin the DP allows)."""
    prefix = np.concatenate(([0.0], np.cumsum(sums)))
    below, in_doubt = _clear_sum_index(prefix)
    buckets_per_s = _clear_buckets_per_s(prefix)
    if buckets_per_s == 0.0:  # no index: every threshold in doubt
        assert in_doubt.all()
        return
    for x in thresholds:
        index = int(np.clip(x * buckets_per_s + 2.0, 0, len(below) - 1))
        if in_doubt[index]:
            continue
        for near in (x - 0.25 / buckets_per_s, x, x + 0.25 / buckets_per_s):
            assert below[index] == np.searchsorted(prefix, near), (x, near)


@pytest.mark.parametrize("batch", range(2))
def test_the_min_max_dp_is_the_exact_smallest_bottleneck_of_brute_force(batch):
    """The min-max DP reads max(h, t) as h at the crossing and t just before it: exactly the smallest
    largest canonical stage time over every partition that fits memory (no rounding: max and min only)."""
    checked = 0
    for seed in range(batch * 60, batch * 60 + 60):
        model = random_case(seed)
        t_cuts = compositions(model.num_teacher_blocks, model.num_stages)[:, None, :]
        s_cuts = compositions(model.num_student_blocks, model.num_stages)[None, :, :]
        worst, fits = np.full((t_cuts.shape[0], s_cuts.shape[1]), -np.inf), True
        for r, device in enumerate(model.devices):
            args = (t_cuts[..., r], t_cuts[..., r + 1], s_cuts[..., r], s_cuts[..., r + 1])
            worst = np.maximum(worst, model.stage_time_s(r, *args))
            fits = fits & (model.stage_memory_bytes(r, *args) <= device.memory_bytes)
        expected = float(np.where(fits, worst, np.inf).min())
        assert PartitionDP(model).min_bottleneck() == expected, seed
        checked += math.isfinite(expected)
    assert checked > 20
