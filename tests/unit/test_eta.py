"""Unit tests for synapse.decision.eta and synapse.decision.eta: the options built, ETA arithmetic."""
from __future__ import annotations

import json
import math

import pytest

from synapse.decision import EtaModelError, Option, OptionKind, RunningPartition, build_options
from synapse.partitioning import PartitionError, Placement

# --------------------------------------------------------------------------- analytic planner
# Stage r costs alpha_r * (teacher blocks * T + student blocks * S); a step costs the slowest
# stage. The plan splits blocks in proportion to device speed (1 / alpha).

TEACHER_BLOCKS, STUDENT_BLOCKS = 30, 57
TEACHER_BLOCK_S, STUDENT_BLOCK_S = 0.04, 0.05


def step_seconds(teacher, student, alphas):
    return max(a * (t * TEACHER_BLOCK_S + s * STUDENT_BLOCK_S) for t, s, a in zip(teacher, student, alphas))


def proportional_counts(total, alphas):
    speeds = [1.0 / a for a in alphas]
    exact = [total * s / sum(speeds) for s in speeds]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def analytic_plan(devices, alphas, betas):
    teacher = proportional_counts(TEACHER_BLOCKS, alphas)
    student = proportional_counts(STUDENT_BLOCKS, alphas)
    return teacher, student, step_seconds(teacher, student, alphas)


def running(devices, alphas, calibration=1.0, plan_alphas=None):
    """Partition planned for ``plan_alphas`` (default: nominal), running under ``alphas``."""
    plan_alphas = plan_alphas or [1.0] * len(devices)
    teacher, student, _ = analytic_plan(devices, plan_alphas, None)
    device_alphas = [alphas[d] for d in devices]
    predicted = step_seconds(teacher, student, device_alphas)
    return RunningPartition(Placement(tuple(devices), tuple(teacher), tuple(student)), calibration * predicted,
                            predicted)


COSTS = {OptionKind.KEEP: 0.0, OptionKind.REPLAN: 40.0, OptionKind.DEGRADE: 45.0, OptionKind.REPLACE: 50.0}


def by_kind(options):
    kinds = [o.kind for o in options]
    assert len(set(kinds)) == len(kinds), kinds
    return {o.kind: o for o in options}


# --------------------------------------------------------------------------- Option


@pytest.mark.parametrize(
    "restart_s, step_s, remaining, expected",
    [(0.0, 1.0, 100, 100.0), (30.0, 0.5, 100, 80.0), (45.0, 2.0, 0, 45.0), (12.5, 0.25, 1000, 262.5)],
)
def test_eta_is_restart_plus_remaining_steps_times_step(restart_s, step_s, remaining, expected):
    kind = OptionKind.KEEP if restart_s == 0 else OptionKind.REPLAN
    option = Option(kind, Placement((0, 1), (15, 15), (28, 29)), step_s, restart_s)
    assert option.eta_s(remaining) == pytest.approx(expected)


def test_option_validation():
    with pytest.raises(EtaModelError, match="KEEP does not restart"):
        Option(OptionKind.KEEP, Placement((0,), (30,), (57,)), 1.0, 5.0)
    with pytest.raises(PartitionError, match="one block count per device"):  # the placement refuses it
        Option(OptionKind.REPLAN, Placement((0, 1), (30,), (57,)), 1.0, 5.0)
    with pytest.raises(EtaModelError, match="duplicates"):
        Option(OptionKind.REPLAN, Placement((0, 0), (15, 15), (28, 29)), 1.0, 5.0)
    with pytest.raises(EtaModelError, match="remaining_steps"):
        Option(OptionKind.REPLAN, Placement((0,), (30,), (57,)), 1.0, 5.0).eta_s(-1)
    assert Option("degrade", Placement((0,), (30,), (57,)), 1.0, 5.0).kind is OptionKind.DEGRADE


def test_option_to_dict_is_json_and_carries_eta():
    option = Option(OptionKind.REPLAN, Placement((0, 1), (15, 15), (28, 29)), 0.5, 10.0, {"alphas": [1.0, 2.0]})
    record = json.loads(json.dumps(option.to_dict(remaining_steps=20)))
    assert record["kind"] == "replan" and record["eta_s"] == pytest.approx(20.0)
    assert record["devices"] == [0, 1] and record["inputs"]["alphas"] == [1.0, 2.0]
    assert "eta_s" not in option.to_dict()


# --------------------------------------------------------------------------- build_options

ALPHAS = {0: 1.0, 1: 1.0, 2: 3.0, 3: 1.0}


def test_build_options_kinds_depend_on_k_and_spares():
    four = build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, 2, analytic_plan, COSTS)
    assert [o.kind for o in four] == [OptionKind.KEEP, OptionKind.REPLAN, OptionKind.DEGRADE]
    with_spare = build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, 2, analytic_plan, COSTS, spare_devices=(7,))
    assert OptionKind.REPLACE in by_kind(with_spare)
    single = build_options(running([5], {5: 2.0}), {5: 2.0}, None, 5, analytic_plan, COSTS)
    assert [o.kind for o in single] == [OptionKind.KEEP, OptionKind.REPLAN]


def test_keep_uses_measured_step_and_running_partition():
    current = running([0, 1, 2, 3], ALPHAS, calibration=1.3)
    keep = by_kind(build_options(current, ALPHAS, None, 2, analytic_plan, COSTS))[OptionKind.KEEP]
    assert keep.predicted_step_s == current.measured_step_s and keep.restart_cost_s == 0.0
    assert (keep.devices, keep.teacher_counts, keep.student_counts) == (
        current.devices, current.placement.teacher_counts, current.placement.student_counts)


@pytest.mark.parametrize("bad", [0, 1, 2, 3])
def test_degrade_never_contains_the_bad_device(bad):
    options = by_kind(build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, bad, analytic_plan, COSTS))
    degrade = options[OptionKind.DEGRADE]
    assert bad not in degrade.devices and len(degrade.devices) == 3
    assert degrade.inputs["dropped_device"] == bad
    assert sum(degrade.teacher_counts) == TEACHER_BLOCKS and sum(degrade.student_counts) == STUDENT_BLOCKS


def test_bad_device_defaults_to_slowest():
    options = by_kind(build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, None, analytic_plan, COSTS))
    assert options[OptionKind.DEGRADE].devices == (0, 1, 3)


def test_replace_swaps_bad_device_for_the_fastest_spare_in_place():
    alphas = {**ALPHAS, 8: 1.5}  # spare 8 measured slow; spare 9 unknown, assumed nominal
    current = running([0, 1, 2, 3], alphas)
    options = by_kind(build_options(current, alphas, None, 2, analytic_plan, COSTS, spare_devices=(8, 9)))
    replace = options[OptionKind.REPLACE]
    assert replace.devices == (0, 1, 9, 3)
    assert replace.inputs["alphas"] == [1.0, 1.0, 1.0, 1.0]
    assert replace.restart_cost_s == COSTS[OptionKind.REPLACE]


def test_replanned_predictions_are_scaled_to_measured_wall_time():
    calibration = 1.25
    current = running([0, 1, 2, 3], ALPHAS, calibration=calibration)
    options = by_kind(build_options(current, ALPHAS, None, 2, analytic_plan, COSTS))
    replan = options[OptionKind.REPLAN]
    _, _, raw = analytic_plan((0, 1, 2, 3), (1.0, 1.0, 3.0, 1.0), None)
    assert replan.inputs["planner_step_s"] == pytest.approx(raw)
    assert replan.predicted_step_s == pytest.approx(raw * calibration)
    assert replan.restart_cost_s == COSTS[OptionKind.REPLAN]
    # Sanity of the analytic model: balancing around a 3x device beats both alternatives.
    assert replan.predicted_step_s < options[OptionKind.DEGRADE].predicted_step_s < current.measured_step_s


def test_plan_fn_receives_aligned_alphas_and_betas_untouched():
    calls = []
    betas = {"link": (0, 1)}

    def recording_plan(devices, alphas, given_betas):
        calls.append((devices, alphas, given_betas))
        return analytic_plan(devices, alphas, given_betas)

    build_options(running([3, 1, 2], ALPHAS), ALPHAS, betas, 2, recording_plan, COSTS)
    assert calls[0] == ((3, 1, 2), (1.0, 1.0, 3.0), betas)
    assert calls[1] == ((3, 1), (1.0, 1.0), betas)


def test_build_options_input_errors():
    current = running([0, 1, 2, 3], ALPHAS)
    with pytest.raises(EtaModelError, match="running device 3"):
        build_options(current, {0: 1.0, 1: 1.0, 2: 3.0}, None, 2, analytic_plan, COSTS)
    with pytest.raises(EtaModelError, match="bad_device 9"):
        build_options(current, ALPHAS, None, 9, analytic_plan, COSTS)
    with pytest.raises(EtaModelError, match=r"spare devices \[1\]"):
        build_options(current, ALPHAS, None, 2, analytic_plan, COSTS, spare_devices=(1,))
    with pytest.raises(EtaModelError, match="'replace'"):
        build_options(current, ALPHAS, None, 2, analytic_plan, {OptionKind.REPLAN: 1.0, OptionKind.DEGRADE: 1.0},
                      spare_devices=(7,))
    with pytest.raises(EtaModelError, match="alpha of device 2"):
        build_options(current, {**ALPHAS, 2: 0.0}, None, 2, analytic_plan, COSTS)


def test_build_options_rejects_a_plan_that_loses_blocks():
    def lossy_plan(devices, alphas, betas):
        teacher, student, step_s = analytic_plan(devices, alphas, betas)
        return [*teacher[:-1], teacher[-1] - 1], student, step_s

    with pytest.raises(EtaModelError, match="29 teacher / 57 student blocks"):
        build_options(running([0, 1, 2, 3], ALPHAS), ALPHAS, None, 2, lossy_plan, COSTS)


def test_running_partition_validation():
    with pytest.raises(EtaModelError, match="measured_step_s"):
        RunningPartition(Placement((0,), (30,), (57,)), 0.0, 1.0)
    with pytest.raises(PartitionError, match="one block count per device"):
        RunningPartition(Placement((0, 1), (30,), (57,)), 1.0, 1.0)
    with pytest.raises(EtaModelError, match="needs a Placement"):
        RunningPartition(((0,), (30,), (57,)), 1.0, 1.0)
    assert RunningPartition(Placement((0,), (30,), (57,)), 3.0, 2.0).calibration == pytest.approx(1.5)
