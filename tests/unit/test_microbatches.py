"""pipeline.microbatches=auto: the micro-batch count chosen with the cuts, from profiles at each size."""
from __future__ import annotations

import math

import pytest

from synapse.partitioning import (
    BlockProfile,
    DeviceFacts,
    DeviceSpec,
    MicrobatchChoiceError,
    ModelProfile,
    StagePlanner,
    StepSpec,
    candidate_counts,
    choose_microbatches,
)

BATCH = 128


def profile(name: str, blocks: int, micro_batch: int, floor_ms: float, per_sample_ms: float,
            backward: bool, activation_kb_per_sample: float = 100.0) -> ModelProfile:
    """Blocks whose time is a fixed floor (launch-bound small batches) plus a per-sample part."""
    forward = floor_ms + per_sample_ms * micro_batch
    rows = [BlockProfile(f"{name}{k}", forward, 2 * forward if backward else 0.0, 1.0,
                         activation_kb_per_sample * micro_batch, activation_kb_per_sample * micro_batch, 10.0)
            for k in range(blocks)]
    return ModelProfile(name, tuple(rows), micro_batch=micro_batch)


def planner_family(floor_ms: float, per_sample_ms: float, memory_bytes: float = math.inf):
    def planner_for(m: int) -> StagePlanner:
        mb = BATCH // m
        return StagePlanner(profile("t", 12, mb, floor_ms, per_sample_ms, backward=False),
                            profile("s", 16, mb, floor_ms, per_sample_ms, backward=True), StepSpec(m),
                            DeviceFacts(memory_bytes=lambda device: memory_bytes))
    return planner_for


def test_candidates_are_the_divisors_from_the_stage_count_up_to_four_times_it():
    assert candidate_counts(128, 2) == (2, 4, 8)
    assert candidate_counts(128, 4) == (4, 8, 16)
    assert candidate_counts(96, 3) == (3, 4, 6, 8, 12)
    assert candidate_counts(7, 2) == (1,)  # 7 micro-batches would hold one sample each
    assert candidate_counts(8, 4) == (4,)  # 8 would too
    assert candidate_counts(5, 8) == (1,)  # no divisor in [8, 32] with two samples each: the largest below
    assert candidate_counts(64, 1) == (1, 2, 4)
    with pytest.raises(MicrobatchChoiceError):
        candidate_counts(0, 2)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_without_a_per_micro_batch_floor_more_micro_batches_always_win(stages):
    # Time proportional to samples (CPU-like): only the bubble differs, so the most micro-batches win.
    family = planner_family(floor_ms=0.0, per_sample_ms=0.1)
    choice = choose_microbatches(family, candidate_counts(BATCH, stages), list(range(stages)))
    assert choice.microbatches == max(candidate_counts(BATCH, stages))


def test_a_launch_bound_floor_makes_fewer_larger_micro_batches_win():
    # 2 ms per block however small the micro-batch (a GPU waiting on the host): the bubble saved by
    # cutting 128 images into 16 is smaller than the floor paid 16 times.
    family = planner_family(floor_ms=2.0, per_sample_ms=0.01)
    choice = choose_microbatches(family, candidate_counts(BATCH, 4), [0, 1, 2, 3])
    assert choice.microbatches == 4
    assert choice.step_time_by_count[4] < choice.step_time_by_count[8] < choice.step_time_by_count[16]


def test_the_choice_is_the_fastest_candidate_and_its_plan():
    family = planner_family(floor_ms=0.3, per_sample_ms=0.05)
    candidates = candidate_counts(BATCH, 3)
    choice = choose_microbatches(family, candidates, [0, 1, 2], alphas=[1.0, 2.0, 1.0])
    direct = {m: family(m).full_plan([0, 1, 2], [1.0, 2.0, 1.0]).step_time_s for m in candidates}
    assert choice.step_time_by_count == pytest.approx(direct)
    assert choice.microbatches == min(direct, key=direct.get)
    assert choice.plan.microbatches == choice.microbatches
    assert choice.plan == family(choice.microbatches).full_plan([0, 1, 2], [1.0, 2.0, 1.0])


def test_a_count_whose_activations_do_not_fit_is_skipped_and_none_fitting_is_an_error():
    # Activations in flight grow with the micro-batch size: few large micro-batches need the most memory.
    family = planner_family(floor_ms=2.0, per_sample_ms=0.01, memory_bytes=55e6)
    choice = choose_microbatches(family, candidate_counts(BATCH, 2), [0, 1])
    assert math.isinf(choice.step_time_by_count[2]) and 2 in choice.reasons
    assert choice.microbatches in (4, 8)
    with pytest.raises(MicrobatchChoiceError, match="no micro-batch count can run"):
        choose_microbatches(planner_family(2.0, 0.01, memory_bytes=1e3), candidate_counts(BATCH, 2), [0, 1])


def test_device_specs_reach_the_planner():
    family = planner_family(floor_ms=0.0, per_sample_ms=0.1)
    assert isinstance(family(4).specs([0, 1])[0], DeviceSpec)
