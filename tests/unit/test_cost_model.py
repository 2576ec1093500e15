"""Cost model: stage time, communication, memory, step time; its input specs."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from synapse.partitioning import BlockProfile, CostModel, CostModelError, DeviceSpec, ModelProfile, Schedule, StepSpec

KB = 1024


def profile(name: str, fwd, bwd, out_kb, accum_kb, param_kb) -> ModelProfile:
    blocks = tuple(
        BlockProfile(f"{name}{k}", f, b, 1.0, o, a, p)
        for k, (f, b, o, a, p) in enumerate(zip(fwd, bwd, out_kb, accum_kb, param_kb))
    )
    return ModelProfile(name, blocks)


# Teacher: forward only. Student: forward + backward. Small numbers that are easy to add by hand.
TEACHER = profile("t", fwd=[1.0, 2.0, 3.0], bwd=[0, 0, 0], out_kb=[10, 20, 30], accum_kb=[99] * 3, param_kb=[1, 2, 3])
STUDENT = profile("s", fwd=[1.0, 1.0], bwd=[2.0, 4.0], out_kb=[5, 7], accum_kb=[100, 200], param_kb=[8, 16])


def two_devices(**first) -> list[DeviceSpec]:
    return [DeviceSpec("gpu0", **first), DeviceSpec("gpu1")]


def test_stage_time_adds_both_nets_and_scales_by_alpha():
    model = CostModel(TEACHER, STUDENT, two_devices(alpha=2.0), StepSpec(microbatches=4))
    # stage 0: teacher blocks 0,1 (1 + 2 ms) + student block 0 (1 + 2 ms); free link
    assert model.stage_time_s(0, 0, 2, 0, 1) == pytest.approx(2.0 * 6e-3)
    # stage 1: teacher block 2 (3 ms) + student block 1 (1 + 4 ms), alpha 1
    assert model.stage_time_s(1, 2, 3, 1, 2) == pytest.approx(8e-3)


def test_communication_sends_both_activations_and_receives_the_student_gradient():
    devices = two_devices(beta=3.0, link_bandwidth_bytes_per_s=1e6)
    model = CostModel(TEACHER, STUDENT, devices, StepSpec(microbatches=4))
    # cut after teacher block 1 (20 KB) and student block 0 (5 KB out, 5 KB gradient back)
    expected_comm = 3.0 * (20 + 2 * 5) * KB / 1e6
    assert model.comm_time_s(0, 2, 1) == pytest.approx(expected_comm)
    assert model.stage_time_s(0, 0, 2, 0, 1) == pytest.approx(6e-3 + expected_comm)


def test_last_stage_sends_nothing():
    devices = [DeviceSpec("a", link_bandwidth_bytes_per_s=1.0), DeviceSpec("b", link_bandwidth_bytes_per_s=1.0)]
    model = CostModel(TEACHER, STUDENT, devices, StepSpec(microbatches=2))
    assert model.comm_time_s(1, 3, 2) == 0.0
    assert model.comm_time_s(0, 3, 2) > 0.0


@pytest.mark.parametrize(
    ("schedule", "held"),
    [(Schedule.ONE_F_ONE_B, (2, 1)), (Schedule.GPIPE, (4, 4))],
)
def test_memory_counts_state_and_in_flight_activations(schedule, held):
    step = StepSpec(microbatches=4, schedule=schedule, optimizer_state_multiplier=2.0)
    model = CostModel(TEACHER, STUDENT, two_devices(), step)
    assert (model.in_flight(0), model.in_flight(1)) == held
    # stage 0: teacher params 1+2, teacher boundary activation 20 KB per micro-batch in flight,
    # student params 8 x (1 param + 1 grad + 2 AdamW), student accum 100 KB per micro-batch
    expected = (3 + held[0] * 20 + 8 * 4 + held[0] * 100) * KB
    assert model.stage_memory_bytes(0, 0, 2, 0, 1) == pytest.approx(expected)


def test_one_f_one_b_never_holds_more_than_m_micro_batches():
    model = CostModel(TEACHER, STUDENT, two_devices(), StepSpec(microbatches=1))
    assert [model.in_flight(r) for r in range(2)] == [1, 1]


def test_step_time_is_fill_plus_steady_state_plus_optimizer():
    step = StepSpec(microbatches=5, optimizer_step_s=0.5)
    model = CostModel(TEACHER, STUDENT, two_devices(), step)
    assert model.step_time_s([1.0, 3.0]) == pytest.approx(4.0 + 4 * 3.0 + 0.5)


def test_evaluate_matches_the_per_stage_methods():
    step = StepSpec(microbatches=3)
    devices = [DeviceSpec("a", alpha=1.5, link_bandwidth_bytes_per_s=2e6), DeviceSpec("b", memory_bytes=1e9)]
    model = CostModel(TEACHER, STUDENT, devices, step)
    cost = model.evaluate([1, 2], [1, 1])
    assert cost.stage_times_s == (model.stage_time_s(0, 0, 1, 0, 1), model.stage_time_s(1, 1, 3, 1, 2))
    assert cost.stage_comm_s[0] == model.comm_time_s(0, 1, 1) and cost.stage_comm_s[1] == 0.0
    assert cost.stage_compute_s[0] == pytest.approx(1.5 * 4e-3)
    assert cost.stage_memory_bytes[1] == model.stage_memory_bytes(1, 1, 3, 1, 2)
    assert cost.step_time_s == model.step_time_s(cost.stage_times_s)


@pytest.mark.parametrize(
    ("teacher_counts", "student_counts", "expected"),
    [
        ([3], [1, 1], "teacher counts [3] have 1 entries for 2 stages"),
        ([1, 1], [1, 1], "teacher counts [1, 1] sum to 2, but the model has 3 blocks"),
        ([3, 0], [1, 1], "must all be integers >= 1"),
        ([1, 2], [2, 0], "student counts [2, 0] must all be integers >= 1"),
    ],
)
def test_evaluate_rejects_bad_counts(teacher_counts, student_counts, expected):
    model = CostModel(TEACHER, STUDENT, two_devices(), StepSpec(microbatches=2))
    with pytest.raises(CostModelError, match=re.escape(expected)):
        model.evaluate(teacher_counts, student_counts)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(alpha=0.0), "alpha=0.0 must be finite and > 0"),
        (dict(alpha=math.inf), "alpha=inf"),
        (dict(beta=-1.0), "beta=-1.0"),
        (dict(memory_bytes=0), "memory_bytes=0 must be > 0"),
        (dict(link_bandwidth_bytes_per_s=math.nan), "link_bandwidth_bytes_per_s=nan"),
    ],
)
def test_device_spec_validation(kwargs, expected):
    with pytest.raises(CostModelError, match=re.escape(expected)):
        DeviceSpec("gpu0", **kwargs)


def test_device_spec_needs_a_name():
    with pytest.raises(ValueError, match="name is empty"):
        DeviceSpec("")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(microbatches=0), "microbatches=0 must be an integer >= 1"),
        (dict(microbatches=True), "microbatches=True"),
        (dict(microbatches=4, schedule="interleaved"), "unknown schedule 'interleaved'; use one of: gpipe, 1f1b"),
        (dict(microbatches=4, optimizer_state_multiplier=-1.0), "SGD 0, momentum 1, AdamW 2"),
        (dict(microbatches=4, optimizer_step_s=-0.1), "optimizer_step_s=-0.1"),
    ],
)
def test_step_spec_validation(kwargs, expected):
    with pytest.raises(CostModelError, match=re.escape(expected)):
        StepSpec(**kwargs)


def test_step_spec_accepts_schedule_names():
    assert StepSpec(4, "gpipe").schedule is Schedule.GPIPE
    assert StepSpec(4, "1f1b").schedule is Schedule.ONE_F_ONE_B


def test_cost_model_needs_devices():
    with pytest.raises(CostModelError, match="no devices"):
        CostModel(TEACHER, STUDENT, [], StepSpec(2))


def random_profile(rng: np.random.Generator, n: int, name: str) -> ModelProfile:
    zeros = rng.random(n) < 0.2  # zero-time blocks make plateaus in the prefix sums
    fwd = np.where(zeros, 0.0, rng.uniform(0.01, 50.0, n))
    bwd, out_kb, accum_kb, param_kb = (rng.uniform(0, high, n) for high in (90, 1e5, 1e6, 1e5))
    return profile(name, fwd, bwd, out_kb, accum_kb, param_kb)


@pytest.mark.parametrize("seed", range(5))
def test_stage_time_and_memory_never_grow_when_a_stage_starts_later(seed):
    """The partitioner's binary searches rely on this, bit for bit (not only approximately)."""
    rng = np.random.default_rng(seed)
    teacher, student = random_profile(rng, 12, "t"), random_profile(rng, 15, "s")
    devices = [DeviceSpec("a", alpha=rng.uniform(0.5, 3), beta=2.0, link_bandwidth_bytes_per_s=1e9), DeviceSpec("b")]
    model = CostModel(teacher, student, devices, StepSpec(4))
    for i0, i1 in [(0, 12), (3, 7), (5, 6)]:
        for j1 in range(1, 16):
            j0 = np.arange(j1 + 1)
            assert np.all(np.diff(model.stage_time_s(0, i0, i1, j0, j1)) <= 0)
            assert np.all(np.diff(model.stage_memory_bytes(0, i0, i1, j0, j1)) <= 0)


def test_cost_models_on_the_same_profiles_share_their_tables_read_only_and_price_each_link_by_its_own_beta():
    link = {"link_bandwidth_bytes_per_s": 1e6}
    first = CostModel(TEACHER, STUDENT, [DeviceSpec("a", **link), DeviceSpec("b")], StepSpec(microbatches=4))
    second = CostModel(TEACHER, STUDENT, [DeviceSpec("a", alpha=2.0, beta=3.0, **link), DeviceSpec("b")],
                       StepSpec(microbatches=4))
    # built once for the profiles, step and stage count (the planner builds thousands of cost models)
    assert second.student_work_prefix_s is first.student_work_prefix_s
    assert second.student_memory_prefix_bytes(0) is first.student_memory_prefix_bytes(0)
    with pytest.raises(ValueError, match="read-only"):
        second.student_work_prefix_s[1] = 0.0  # shared: no cost model may change another's numbers
    # ... but each link's table is its own beta's: 3x the bytes' time, as a fresh table gives
    assert second.comm_time_s(0, 2, 1) == 3.0 * (20 + 2 * 5) * KB / 1e6
    assert first.comm_time_s(0, 2, 1) == 1.0 * (20 + 2 * 5) * KB / 1e6
    other_step = CostModel(TEACHER, STUDENT, [DeviceSpec("a", **link), DeviceSpec("b")],
                           StepSpec(microbatches=4, schedule=Schedule.GPIPE))
    assert other_step.in_flight(1) == 4 and first.in_flight(1) == 1  # a table per step: memory follows it
    assert other_step.student_memory_prefix_bytes(1)[-1] > first.student_memory_prefix_bytes(1)[-1]
