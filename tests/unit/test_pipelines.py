"""All replicas of a layout priced at once (``StagePlanner.layout_cost``, ``partitioning.pipelines``) give
exactly the numbers of a cost model per replica (``layout_cost_by_replica``): on random layouts (some
replicas re-cut on fewer devices, as a SHRINK does: those cut alike priced together), cuts,
shares, devices across nodes, schedules, CPU terms and factors, with and without profiles at several
micro-batch sizes. Pure: plain numbers, no torch."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synapse.partitioning.pipelines as pipelines_module
import synapse.partitioning.planner as planner_module
from synapse.partitioning import (
    BlockProfile,
    CostModel,
    CostModelError,
    DeviceFacts,
    ModelProfile,
    Placement,
    StagePlanner,
    StepSpec,
)

positive = st.floats(0.05, 20.0, allow_nan=False, allow_infinity=False)


def measured(name: str, micro_batch: int, fixed_ms: list[float], ms_per_image: list[float], kb: list[float],
             backward: bool) -> ModelProfile:
    """A model whose block k pays ``fixed_ms[k]`` a pass plus ``ms_per_image[k]`` an image."""
    rows = []
    for k, (fixed, per_image, size) in enumerate(zip(fixed_ms, ms_per_image, kb)):
        forward = fixed + per_image * micro_batch
        rows.append(BlockProfile(f"{name}{k}", forward, 2 * forward if backward else 0.0, size * micro_batch,
                                 size * micro_batch, 3 * size * micro_batch, 7 * size))
    return ModelProfile(name, tuple(rows), micro_batch=micro_batch)


def cuts(draw, blocks: int, stages: int) -> tuple[int, ...]:
    """A random partition of ``blocks`` into ``stages`` counts, each at least 1."""
    inner = sorted(draw(st.lists(st.integers(1, blocks - 1), min_size=stages - 1, max_size=stages - 1,
                                 unique=True))) if stages > 1 else []
    bounds = [0, *inner, blocks]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@st.composite
def priced_layouts(draw):
    replicas, stages = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    teacher_blocks, student_blocks = draw(st.integers(stages, stages + 4)), draw(st.integers(stages, stages + 4))
    micro = draw(st.sampled_from([4, 8, 16]))

    def model(name: str, blocks: int, backward: bool) -> list[ModelProfile]:
        fixed = draw(st.lists(st.floats(0.0, 5.0), min_size=blocks, max_size=blocks))
        per_image = draw(st.lists(st.floats(0.01, 3.0), min_size=blocks, max_size=blocks))
        kb = draw(st.lists(st.floats(0.5, 500.0), min_size=blocks, max_size=blocks))
        sizes = sorted({2, micro // 2, micro, 2 * micro})
        return [measured(name, size, fixed, per_image, kb, backward) for size in sizes]

    teachers, students = model("t", teacher_blocks, False), model("s", student_blocks, True)
    node_size = draw(st.integers(1, 4))
    facts = DeviceFacts(
        link_bandwidth_bytes_per_s=draw(st.sampled_from([math.inf, 1e6, 3.3e7, 1e9])),
        contention=draw(st.sampled_from([1.0, 1.5, 3.0])), link_latency_s=draw(st.sampled_from([0.0, 2e-5, 1e-3])),
        node_of=lambda device: device // node_size,
        cross_node_bandwidth_bytes_per_s=draw(st.sampled_from([math.inf, 5e5, 2e8])),
        cross_node_latency_s=draw(st.sampled_from([0.0, 3e-4])))
    step = StepSpec(draw(st.integers(1, 6)), schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
                    optimizer_step_s=draw(st.sampled_from([0.0, 0.013])),
                    per_microbatch_overhead_s=draw(st.sampled_from([0.0, 0.0021])),
                    loss_s=draw(st.sampled_from([0.0, 0.0007])))
    sized = draw(st.booleans())
    profiled = [p.micro_batch for p in teachers].index(micro)
    planner = StagePlanner(teachers[profiled], students[profiled], step, facts, replicas=draw(st.integers(1, 4)),
                           size_profiles=tuple(zip(teachers, students)) if sized else ())
    devices = draw(st.lists(st.integers(0, 40), min_size=replicas * stages, max_size=replicas * stages, unique=True))
    shares = draw(st.one_of(st.just(()), st.lists(st.integers(1, 64), min_size=replicas, max_size=replicas)))
    placement = Placement(tuple(devices), cuts(draw, teacher_blocks, stages), cuts(draw, student_blocks, stages),
                          replicas, tuple(shares))
    for replica in draw(st.lists(st.integers(0, replicas - 1), unique=True)):  # re-cut on fewer devices, as SHRINK
        kept = draw(st.integers(1, stages))
        placement = placement.with_replica(replica, Placement(placement.replica_devices(replica)[:kept],
                                                              cuts(draw, teacher_blocks, kept),
                                                              cuts(draw, student_blocks, kept)))
    devices = list(placement.devices)
    some = st.lists(st.sampled_from([*devices, 99]), unique=True)  # 99: a spare, not in the placement
    alphas = draw(st.one_of(st.none(), some.flatmap(lambda ds: st.fixed_dictionaries({d: positive for d in ds})),
                            st.lists(positive, min_size=len(devices), max_size=len(devices))))
    betas = draw(st.one_of(st.none(), some.flatmap(lambda ds: st.fixed_dictionaries({d: positive for d in ds}))))
    return planner, placement, alphas, betas


@settings(max_examples=300, deadline=None)
@given(priced_layouts(), st.lists(positive, min_size=1, max_size=3))
def test_all_replicas_at_once_are_priced_exactly_as_one_cost_model_per_replica(layout, slowdowns):
    planner, placement, alphas, betas = layout
    assert planner.layout_cost(placement, alphas, betas) == planner.layout_cost_by_replica(placement, alphas, betas)
    # the kept terms at factors that move every step (as an estimate does): still exact
    for slowdown in slowdowns:
        moved = {d: slowdown * (1 + i / 7) for i, d in enumerate(placement.devices)}
        assert planner.layout_cost(placement, moved, betas) == planner.layout_cost_by_replica(placement, moved, betas)
        assert planner.layout_cost(placement, None, moved) == planner.layout_cost_by_replica(placement, None, moved)


def hundred_replicas() -> tuple[StagePlanner, Placement]:
    teacher = measured("t", 8, [1.0] * 3, [0.2] * 3, [10.0] * 3, False)
    student = measured("s", 8, [1.0] * 4, [0.3] * 4, [10.0] * 4, True)
    planner = StagePlanner(teacher, student, StepSpec(4), DeviceFacts(link_bandwidth_bytes_per_s=1e9), replicas=50)
    return planner, Placement(tuple(range(100)), (2, 1), (1, 3), replicas=50)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("which", ["alphas", "betas"])
def test_a_factor_the_cost_model_refuses_is_refused_with_its_error(bad, which):
    planner, placement = hundred_replicas()
    factors = {d: 1.0 for d in placement.devices} | {37: bad}
    with pytest.raises(CostModelError, match=f"device 'cpu:37': {which[:-1]}=.* must be finite and > 0"):
        planner.layout_cost(placement, **{which: factors})


def test_moving_factors_build_no_cost_model_once_a_placement_is_known(monkeypatch):
    """What makes it fast: the factor-free terms are kept per devices and cut, and shares do not enter."""
    planner, placement = hundred_replicas()
    planner.layout_cost(placement)
    built = []

    class Counted(CostModel):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(planner_module, "CostModel", Counted)
    monkeypatch.setattr(pipelines_module, "CostModel", Counted)
    for step in range(20):
        alphas = {d: 1.0 + (d * step % 13) / 10 for d in placement.devices}
        shares = tuple(8 + 8 * ((r + step) % 3) for r in range(placement.replicas))
        planner.layout_cost(Placement(placement.devices, placement.teacher_counts, placement.student_counts,
                                      placement.replicas, shares), alphas, alphas)
    assert built == []
