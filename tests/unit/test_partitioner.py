"""Partitioner: exact agreement with brute force, edge cases, errors, behaviour on the shared profiles."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from synapse.partitioning import (
    BlockProfile,
    CostModel,
    DeviceSpec,
    ModelProfile,
    PlanError,
    StepSpec,
    even_partition,
    load_profile_csv,
    plan_partition,
    plan_with_cost_model,
)

SHARED = Path(__file__).resolve().parents[1] / "data" / "synapse_profiles"
GIB = 1 << 30


def make_profile(name: str, fwd, bwd, out_kb, accum_kb, param_kb) -> ModelProfile:
    rows = enumerate(zip(fwd, bwd, out_kb, accum_kb, param_kb))
    blocks = (BlockProfile(f"{name}{k}", *map(float, (f, b, 1.0, o, a, p))) for k, (f, b, o, a, p) in rows)
    return ModelProfile(name, tuple(blocks))


def random_profile(rng: np.random.Generator, n: int, name: str, forward_only: bool) -> ModelProfile:
    fwd = np.where(rng.random(n) < 0.15, 0.0, rng.uniform(0.1, 40.0, n))  # some zero-time blocks
    bwd = np.zeros(n) if forward_only else rng.uniform(0.1, 80.0, n)
    return make_profile(name, fwd, bwd, rng.uniform(0, 5e4, n), rng.uniform(0, 4e5, n), rng.uniform(0, 2e5, n))


def compositions(n: int, k: int) -> np.ndarray:
    """All cut vectors [0, c1, ..., n] with k parts of >= 1 block, shape (count, k + 1)."""
    combos = list(itertools.combinations(range(1, n), k - 1))
    inner = np.array(combos, dtype=int).reshape(len(combos), k - 1)
    return np.hstack([np.zeros((len(inner), 1), int), inner, np.full((len(inner), 1), n)])


def brute_force(model: CostModel) -> float:
    """Best step time over every partition that fits memory (inf if none), vectorised."""
    t_cuts = compositions(model.num_teacher_blocks, model.num_stages)[:, None, :]
    s_cuts = compositions(model.num_student_blocks, model.num_stages)[None, :, :]
    shape = (t_cuts.shape[0], s_cuts.shape[1])
    times, fits = np.zeros(shape + (model.num_stages,)), np.ones(shape, dtype=bool)
    for r, device in enumerate(model.devices):
        args = (t_cuts[..., r], t_cuts[..., r + 1], s_cuts[..., r], s_cuts[..., r + 1])
        times[..., r] = model.stage_time_s(r, *args)
        fits &= model.stage_memory_bytes(r, *args) <= device.memory_bytes
    step = times.sum(axis=-1) + (model.step.microbatches - 1) * times.max(axis=-1) + model.step.optimizer_step_s
    return float(np.where(fits, step, np.inf).min())


def random_case(seed: int) -> CostModel:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 5))
    teacher = random_profile(rng, int(rng.integers(k, k + 5)), "t", forward_only=True)
    student = random_profile(rng, int(rng.integers(k, k + 6)), "s", forward_only=False)
    heterogeneous = rng.random() < 0.7
    devices = [
        DeviceSpec(
            f"d{r}",
            alpha=float(rng.uniform(0.5, 4.0)) if heterogeneous else 1.0,
            beta=float(rng.uniform(0.5, 2.0)),
            link_bandwidth_bytes_per_s=float(rng.choice([math.inf, 1e8, 1e10])),
        )
        for r in range(k)
    ]
    step = StepSpec(
        microbatches=int(rng.choice([1, 2, 3, 4, 8, 32])),
        schedule=str(rng.choice(["gpipe", "1f1b"])),
        optimizer_state_multiplier=float(rng.choice([0.0, 1.0, 2.0])),
        optimizer_step_s=float(rng.choice([0.0, 0.01])),
    )
    model = CostModel(teacher, student, devices, step)
    if rng.random() < 0.5:  # tight memory: caps near the memory of a random plan, sometimes infeasible
        t_counts = even_partition(len(teacher), k)
        s_counts = even_partition(len(student), k)
        even_memory = model.evaluate(t_counts, s_counts).stage_memory_bytes
        caps = [m * rng.uniform(0.6, 1.3) for m in even_memory]
        devices = [dataclasses.replace(d, memory_bytes=cap) for d, cap in zip(devices, caps)]
        model = CostModel(teacher, student, devices, step)
    if rng.random() < 0.4:  # CPU terms: ranks sharing cores, per-micro-batch overhead, KD loss, link latency
        devices = [dataclasses.replace(d, contention=float(rng.choice([1.0, 1.5, 3.0])),
                                       link_latency_s=float(rng.choice([0.0, 1e-3]))) for d in model.devices]
        step = dataclasses.replace(step, per_microbatch_overhead_s=float(rng.choice([0.0, 5e-3])),
                                   loss_s=float(rng.choice([0.0, 0.02])))
        model = CostModel(teacher, student, devices, step)
    return model


@pytest.mark.parametrize("batch", range(8))
def test_plan_matches_brute_force_on_random_cases(batch):
    infeasible = 0
    for seed in range(batch * 50, batch * 50 + 50):
        model = random_case(seed)
        expected = brute_force(model)
        if math.isinf(expected):
            infeasible += 1
            with pytest.raises(PlanError, match="fits in memory"):
                plan_with_cost_model(model)
            continue
        plan = plan_with_cost_model(model)
        assert plan.step_time_s == pytest.approx(expected, rel=1e-9), f"seed {seed}"
        cost = model.evaluate(plan.teacher_counts, plan.student_counts)
        assert plan.step_time_s == cost.step_time_s and plan.stage_times_s == cost.stage_times_s
        assert all(m <= d.memory_bytes for m, d in zip(plan.stage_memory_bytes, model.devices))
    assert infeasible < 50  # the batch exercised the search, not only the error path


def test_random_cases_cover_what_the_brief_asks_for():
    """Guard for the generator above: heterogeneous alphas, tight memory and every K from 1 to 4 occur."""
    models = [random_case(seed) for seed in range(400)]
    assert {m.num_stages for m in models} == {1, 2, 3, 4}
    assert sum(len({d.alpha for d in m.devices}) > 1 for m in models) > 150
    assert sum(math.isinf(brute_force(m)) for m in models) > 10
    assert sum(any(math.isfinite(d.memory_bytes) for d in m.devices) for m in models) > 150
    assert sum(len({d.contention for d in m.devices}) > 1 for m in models) > 50
    assert sum(m.step.per_microbatch_overhead_s > 0 and m.step.loss_s > 0 for m in models) > 20
    assert sum(any(d.link_latency_s > 0 for d in m.devices) for m in models) > 50


def uniform_profile(name: str, n: int, fwd: float, bwd: float) -> ModelProfile:
    return make_profile(name, [fwd] * n, [bwd] * n, [1.0] * n, [1.0] * n, [1.0] * n)


def test_single_device_gets_everything():
    teacher, student = uniform_profile("t", 5, 1.0, 0.0), uniform_profile("s", 7, 1.0, 2.0)
    plan = plan_partition(teacher, student, [DeviceSpec("only")], microbatches=4)
    assert (plan.teacher_counts, plan.student_counts) == ((5,), (7,))
    assert plan.step_time_s == pytest.approx(4 * (5 + 21) * 1e-3)


def test_one_block_per_stage_when_k_equals_the_number_of_blocks():
    teacher, student = uniform_profile("t", 4, 1.0, 0.0), uniform_profile("s", 4, 1.0, 1.0)
    plan = plan_partition(teacher, student, [DeviceSpec(f"d{r}") for r in range(4)], microbatches=2)
    assert plan.teacher_counts == plan.student_counts == (1, 1, 1, 1)
    assert plan.teacher_cuts == (0, 1, 2, 3, 4)


def test_identical_blocks_on_identical_devices_split_evenly():
    teacher, student = uniform_profile("t", 12, 2.0, 0.0), uniform_profile("s", 24, 1.0, 2.0)
    plan = plan_partition(teacher, student, [DeviceSpec(f"d{r}") for r in range(4)], microbatches=8)
    assert plan.teacher_counts == even_partition(12, 4)
    assert plan.student_counts == even_partition(24, 4)


def test_more_devices_than_blocks_is_a_plan_error_with_the_numbers():
    teacher, student = uniform_profile("t", 3, 1.0, 0.0), uniform_profile("s", 8, 1.0, 1.0)
    with pytest.raises(PlanError, match="4 devices but the teacher has only 3 blocks.*at most 3 devices"):
        plan_partition(teacher, student, [DeviceSpec(f"d{r}") for r in range(4)], microbatches=2)


def test_memory_infeasible_is_a_plan_error_with_capacities_and_a_fix():
    teacher, student = uniform_profile("t", 4, 1.0, 0.0), uniform_profile("s", 4, 1.0, 1.0)
    devices = [DeviceSpec(f"d{r}", memory_bytes=1024.0) for r in range(2)]
    with pytest.raises(PlanError) as error:
        plan_partition(teacher, student, devices, microbatches=2)
    message = str(error.value)
    assert "capacities [0.00, 0.00] GiB" in message and "Fix:" in message and "micro-batch" in message


def test_gpipe_needs_more_memory_than_1f1b():
    teacher, student = uniform_profile("t", 4, 1.0, 0.0), uniform_profile("s", 4, 1.0, 1.0)
    # 1F1B with K = 2, M = 8 holds at most 2 micro-batches per stage; GPipe holds all 8.
    devices = [DeviceSpec(f"d{r}", memory_bytes=20 * 1024.0) for r in range(2)]
    assert plan_partition(teacher, student, devices, microbatches=8, schedule="1f1b").step_time_s > 0
    with pytest.raises(PlanError):
        plan_partition(teacher, student, devices, microbatches=8, schedule="gpipe")


def test_memory_cap_moves_blocks_off_a_small_device():
    teacher, student = uniform_profile("t", 6, 1.0, 0.0), uniform_profile("s", 6, 1.0, 1.0)
    free = plan_partition(teacher, student, [DeviceSpec("a"), DeviceSpec("b")], microbatches=4)
    small = [DeviceSpec("a", memory_bytes=12 * 1024.0), DeviceSpec("b")]
    capped = plan_partition(teacher, student, small, microbatches=4)
    assert capped.stage_memory_bytes[0] <= 12 * 1024.0 < free.stage_memory_bytes[0]
    assert capped.step_time_s > free.step_time_s


def test_optimizer_step_adds_a_constant():
    teacher, student = uniform_profile("t", 6, 1.0, 0.0), uniform_profile("s", 6, 1.0, 1.0)
    devices = [DeviceSpec("a"), DeviceSpec("b", alpha=2.0)]
    base = plan_partition(teacher, student, devices, microbatches=4)
    slower = plan_partition(teacher, student, devices, microbatches=4, optimizer_step_s=0.25)
    assert slower.step_time_s == pytest.approx(base.step_time_s + 0.25)


def test_plan_serialises_to_json():
    teacher, student = uniform_profile("t", 6, 1.0, 0.0), uniform_profile("s", 6, 1.0, 1.0)
    plan = plan_partition(teacher, student, [DeviceSpec("a"), DeviceSpec("b")], microbatches=4)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["teacher_cuts"][-1] == 6 and data["device_names"] == ["a", "b"] and data["schedule"] == "1f1b"


@pytest.mark.parametrize(
    ("n", "k", "expected"), [(10, 3, (4, 3, 3)), (9, 3, (3, 3, 3)), (5, 5, (1,) * 5), (7, 1, (7,))]
)
def test_even_partition(n, k, expected):
    assert even_partition(n, k) == expected


@pytest.mark.parametrize(("n", "k"), [(3, 4), (5, 0)])
def test_even_partition_rejects_impossible_splits(n, k):
    with pytest.raises(PlanError, match=f"cannot split {n} blocks into {k} stages"):
        even_partition(n, k)


@pytest.fixture(scope="module")
def shared_profiles() -> tuple[ModelProfile, ModelProfile]:
    return load_profile_csv(SHARED / "tnet_vit_large.csv"), load_profile_csv(SHARED / "snet_resnet152.csv")


def work_per_stage(plan, teacher: ModelProfile, student: ModelProfile) -> list[float]:
    t_work = np.cumsum([0, *teacher.column("forward_time_ms")])
    s_work = np.cumsum([0, *(student.column("forward_time_ms") + student.column("backward_time_ms"))])
    t_cuts, s_cuts = plan.teacher_cuts, plan.student_cuts
    stages = range(len(t_cuts) - 1)
    return [t_work[t_cuts[r + 1]] - t_work[t_cuts[r]] + s_work[s_cuts[r + 1]] - s_work[s_cuts[r]] for r in stages]


@pytest.mark.parametrize("slow", [1.5, 3.0])
def test_a_slowed_device_gets_fewer_blocks(shared_profiles, slow):
    teacher, student = shared_profiles
    devices = [DeviceSpec(f"gpu{r}", alpha=slow if r == 1 else 1.0, memory_bytes=80 * GIB) for r in range(4)]
    plan = plan_partition(teacher, student, devices, microbatches=8)
    work = work_per_stage(plan, teacher, student)
    assert work[1] < min(work[0], work[2], work[3])
    assert plan.teacher_counts[1] <= min(plan.teacher_counts[0], plan.teacher_counts[2], plan.teacher_counts[3])


def test_shared_profiles_beat_the_even_split(shared_profiles):
    teacher, student = shared_profiles
    devices = [DeviceSpec(f"gpu{r}") for r in range(4)]
    plan = plan_partition(teacher, student, devices, microbatches=8)
    model = CostModel(teacher, student, devices, StepSpec(8))
    even = model.evaluate(even_partition(30, 4), even_partition(57, 4)).step_time_s
    assert plan.step_time_s < even
    assert max(plan.stage_times_s) / min(plan.stage_times_s) < 1.1  # nearly balanced


def test_eight_devices_on_the_shared_profiles(shared_profiles):
    teacher, student = shared_profiles
    devices = [DeviceSpec(f"gpu{r}", alpha=1.0 + 0.1 * r, link_bandwidth_bytes_per_s=25e9) for r in range(8)]
    plan = plan_partition(teacher, student, devices, microbatches=16)
    assert sum(plan.teacher_counts) == 30 and sum(plan.student_counts) == 57 and min(plan.teacher_counts) >= 1
    model = CostModel(teacher, student, devices, StepSpec(16))
    assert plan.step_time_s <= model.evaluate(even_partition(30, 8), even_partition(57, 8)).step_time_s


def test_window_minima_are_the_plain_minimum_of_every_window_empty_ones_included():
    """The DPs' sparse table: every window [lo, hi] of every row, with ties, infinities and empty
    windows (lo = hi + 1, up to lo = n), read as the plain minimum (inf where empty)."""
    from synapse.partitioning.partitioner import _WindowMin

    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 5, 8, 13, 58):
        rows = np.round(rng.normal(size=(4, n)), 1)  # rounded: ties
        rows[rng.random(rows.shape) < 0.2] = np.inf
        lo, hi, row = (np.array([[x] for x in column]) for column in zip(*[
            (a, b, r) for r in range(4) for a in range(n + 1) for b in range(a - 1, n)]))
        expected = [np.min(rows[r, a : b + 1], initial=np.inf) for a, b, r in zip(lo[:, 0], hi[:, 0], row[:, 0])]
        got = _WindowMin(rows, row).query(lo, hi)
        assert got[:, 0].tolist() == expected, n


@pytest.mark.parametrize("batch", range(4))
def test_the_first_fast_enough_start_is_the_canonical_one_also_at_bounds_equal_to_stage_times(batch):
    """The min-sum DP's windows start where the canonical stage time is first within the bound; they
    are found from the prefix sums and checked by the canonical time only near the bound. Against the
    plain binary search of the canonical time, with bounds equal to stage times of the grid (ties, as
    the search asks), a hair either side of them, and random ones; strict and not."""
    from synapse.partitioning.partitioner import PartitionDP, _first_true, _within

    checked = 0
    for seed in range(batch * 40, batch * 40 + 40):
        model = random_case(seed)
        dp = PartitionDP(model)  # random_case gives every stage a block: any error here is the DP's
        rng = np.random.default_rng(seed)
        for stage, grid in enumerate(dp.grids):
            lo, hi = dp._memory_lo[stage], grid.j1_cells
            times = model.stage_time_s(stage, grid.i0, grid.i1, np.maximum(lo - 1, 0) + (lo < hi), grid.j1)
            ties = rng.choice(times.ravel(), size=3)
            for bound in (*ties, *np.nextafter(ties, np.inf), *np.nextafter(ties, -np.inf),
                          *rng.uniform(0, 2 * float(times.max()), 2)):
                for strict in (False, True):
                    def within(j0, model=model, stage=stage, grid=grid, bound=bound, strict=strict):
                        return _within(model.stage_time_s(stage, grid.i0, grid.i1, j0, grid.j1), bound, strict)

                    expected = _first_true(within, lo, hi)
                    assert np.array_equal(dp._first_fast_enough(stage, lo, float(bound), strict), expected), seed
                    checked += 1
    assert checked > 500
