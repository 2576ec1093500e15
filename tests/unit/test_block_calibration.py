"""Online block calibration (synapse.calibration.blocks): pure, no processes, no clocks."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.calibration import (
    AlphaBetaEstimator,
    BlockCalibration,
    CalibrationError,
    CalibrationWindow,
    EstimatorConfig,
    OnlineCalibration,
    StageMeasurement,
    measurements,
)
from synapse.partitioning import BlockProfile, ModelProfile, Placement, StagePlanner, StepSpec


def uniform(name: str, blocks: int, fwd_ms: float = 1.0, bwd_ms: float = 2.0) -> ModelProfile:
    return ModelProfile(name, tuple(BlockProfile(f"{name}{i}", fwd_ms, bwd_ms, 1.0, 1.0, 1.0, 10.0)
                                    for i in range(blocks)))


@pytest.fixture
def planner() -> StagePlanner:
    return StagePlanner(uniform("t", 12), uniform("s", 12), StepSpec(4))


def calibrate(planner: StagePlanner, placement: Placement, measured_over_predicted, slowdowns=None,
              calibration: BlockCalibration | None = None) -> BlockCalibration:
    """Observe ``placement`` measured at the given multiples of the profile's prediction."""
    predicted = planner.per_step_compute_s(*_parts(placement))
    measured = [p * m for p, m in zip(predicted, measured_over_predicted)]
    calibration = calibration or BlockCalibration.neutral(planner.teacher, planner.student)
    return calibration.observe(measurements(placement, predicted, measured, slowdowns))


def _parts(placement: Placement):
    return placement.devices, placement.teacher_counts, placement.student_counts


def test_every_block_of_a_stage_gets_its_stage_ratio(planner):
    placement = Placement((0, 1, 2), (3, 4, 5), (2, 4, 6))
    calibration = calibrate(planner, placement, [1.0, 2.0, 0.5])
    teacher, student = calibration.factors()
    assert teacher.tolist() == pytest.approx([1.0] * 3 + [2.0] * 4 + [0.5] * 5, rel=1e-12)
    assert student.tolist() == pytest.approx([1.0] * 2 + [2.0] * 4 + [0.5] * 6, rel=1e-12)
    assert calibration.observations == 3
    # The calibrated planner predicts each stage as measured.
    calibrated = calibration.calibrated(planner).per_step_compute_s(*_parts(placement))
    base = planner.per_step_compute_s(*_parts(placement))
    assert calibrated == pytest.approx([b * m for b, m in zip(base, [1.0, 2.0, 0.5])], rel=1e-12)


def test_a_stage_measured_twice_as_slow_gets_fewer_blocks(planner):
    running = Placement((0, 1), (6, 6), (6, 6))
    assert planner.plan((0, 1), (1.0, 1.0))[:2] == ((6, 6), (6, 6))
    calibrated = calibrate(planner, running, [1.0, 2.0]).calibrated(planner)
    teacher, student, _ = calibrated.plan((0, 1), (1.0, 1.0))
    assert teacher[1] + student[1] < 12, (teacher, student)
    # Its blocks cost 2x wherever they go: 72 ms of work in all, now 36 ms a stage.
    balanced = calibrated.per_step_compute_s((0, 1), teacher, student)
    assert balanced[0] == pytest.approx(balanced[1], rel=1e-12)
    # The same cut on the same devices with the same alphas:
    # the predictions of the running stages are the measured ones.
    cost = calibrated.predict(*_parts(running))
    assert cost.stage_compute_s[1] == pytest.approx(2 * cost.stage_compute_s[0], rel=1e-12)


def test_a_slowed_device_is_divided_out_by_its_estimated_slowdown(planner):
    running = Placement((0, 1), (6, 6), (6, 6))
    calibration = calibrate(planner, running, [1.0, 2.0], slowdowns=[1.0, 2.0])
    teacher, student = calibration.factors()
    assert set(teacher.tolist()) == {1.0} and set(student.tolist()) == {1.0}
    assert calibration.calibrated(planner).plan((0, 1), (1.0, 1.0))[:2] == ((6, 6), (6, 6))
    # The planner prices that device by its alpha alone: one slowdown, counted once.
    both = calibration.calibrated(planner).predict(*_parts(running), alphas={1: 2.0}).stage_compute_s
    assert both[1] == pytest.approx(2 * both[0], rel=1e-12)


def window(placement: Placement, slowdowns=(1.0, 1.0), warmup=2, steps=5, hold=0):
    return CalibrationWindow(placement, [1.0] * placement.num_stages, list(slowdowns), warmup, steps, hold)


def test_a_device_slowed_inside_its_window_is_not_measured_without_a_slowdown_estimate():
    placement = Placement((0, 1), (6, 6), (6, 6))
    found = {}
    for hold in (0, 3):
        w, found[hold] = window(placement, hold=hold), []
        for step in range(12):
            slow = step >= 4  # the device slows at step 4, inside the window (steps 2-6); flagged at step 8
            found[hold] += w.add([1.0, 3.0 if slow else 2.0], [False, step >= 8])
        assert w.finished
    assert [m.measured_s for m in found[0]] == [1.0, 3.0], "without a hold the slowdown is absorbed"
    assert [(m.teacher_blocks, m.measured_s) for m in found[3]] == [(range(0, 6), 1.0)], \
        "held for the detector's latency, rank 1's window saw its device change speed"


def test_a_window_skips_warmup_and_takes_the_median_divided_by_the_known_slowdown():
    placement = Placement((0, 1), (6, 6), (6, 6))
    w = window(placement, slowdowns=(1.0, 3.0))  # the estimator knew device 1 at 3x (unflagged: e.g. planned for)
    found = []
    for compute in ([50.0, 50.0], [50.0, 50.0], [1.0, 6.0], [1.2, 6.3], [0.9, 5.9], [1.1, 99.0], [1.0, 6.0]):
        found += w.add(compute, [False, False])
    assert [(m.measured_s, m.slowdown) for m in found] == [(1.0, 1.0), (6.0, 3.0)]
    assert [m.ratio for m in found] == [1.0, 2.0]
    assert w.add([1.0, 1.0], [False, False]) == [], "each rank is measured once per placement"


def test_a_device_flagged_slow_is_not_measured_even_with_an_estimate():
    """Its alpha is an estimate still moving: dividing by it would put the difference in its blocks."""
    w = window(Placement((0, 1), (6, 6), (6, 6)), slowdowns=(1.0, 2.4))
    found = []
    for _ in range(8):
        found += w.add([1.0, 3.0], [False, True])
    assert [m.teacher_blocks for m in found] == [range(0, 6)] and w.finished


def test_blocks_measured_in_two_placements_keep_what_the_first_taught():
    profile = uniform("m", 10)
    planner = StagePlanner(profile, uniform("s", 10), StepSpec(1))
    first = calibrate(planner, Placement((0, 1), (5, 5), (5, 5)), [2.0, 1.0])
    # Truth: blocks 0-4 cost 2x, 5-9 as profiled. A second placement measures [0, 3) and [3, 10) truthfully.
    second_placement = Placement((0, 1), (3, 7), (3, 7))
    truth = first.calibrated(planner).per_step_compute_s(*_parts(second_placement))
    profile_s = planner.per_step_compute_s(*_parts(second_placement))
    second = calibrate(planner, second_placement, [t / p for t, p in zip(truth, profile_s)], calibration=first)
    assert second.factors()[0].tolist() == pytest.approx([2.0] * 5 + [1.0] * 5, rel=1e-12)
    # A later measurement that disagrees wins for its range, and keeps the structure inside it.
    third = calibrate(planner, second_placement, [2.0, 2 * 9 / 7], calibration=second)
    assert third.factors()[0].tolist() == pytest.approx([2.0] * 3 + [4.0] * 2 + [2.0] * 5, rel=1e-12)
    assert third.observations == 6


def test_unmeasured_blocks_get_the_median_factor(planner):
    calibration = BlockCalibration.neutral(planner.teacher, planner.student)
    assert calibration.neutral_factor == 1.0 and calibration.factors()[0].tolist() == [1.0] * 12
    one = calibration.observe([StageMeasurement(range(0, 4), range(0, 4), 1.0, 3.0)])
    teacher, student = one.factors()
    assert teacher.tolist() == [3.0] * 12 and student.tolist() == [3.0] * 12
    assert one.teacher_factors[4:] == (None,) * 8
    two = one.observe([StageMeasurement(range(4, 6), range(4, 12), 1.0, 1.0)])
    assert two.neutral_factor == pytest.approx(1.0, rel=1e-12)  # 8 measured blocks at 3, 10 at 1
    assert two.factors()[0].tolist() == pytest.approx([3.0] * 4 + [1.0] * 8, rel=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(measured_s=math.nan), "measured_s=nan must be a finite number > 0"),
    (dict(measured_s=0.0), "measured_s=0.0 must be a finite number > 0"),
    (dict(predicted_s=-1.0), "predicted_s=-1.0"),
    (dict(slowdown=0.0), "slowdown"),
    (dict(teacher_blocks=range(3, 3)), "teacher_blocks=range.3, 3. must be a non-empty range"),
    (dict(student_blocks=[0, 1]), "student_blocks"),
])
def test_bad_measurements_are_refused_with_the_value_named(kwargs, message):
    fields = dict(teacher_blocks=range(0, 2), student_blocks=range(0, 2), predicted_s=1.0, measured_s=1.0)
    with pytest.raises(CalibrationError, match=message):
        StageMeasurement(**{**fields, **kwargs})


def test_bad_observations_and_profiles_are_refused(planner):
    calibration = BlockCalibration.neutral(planner.teacher, planner.student)
    with pytest.raises(CalibrationError, match="teacher blocks range.10, 13. lie outside the model's 12 blocks"):
        calibration.observe([StageMeasurement(range(10, 13), range(0, 2), 1.0, 1.0)])
    with pytest.raises(CalibrationError, match=r"teacher_blocks \[1\] appear in two stages"):
        calibration.observe([StageMeasurement(range(0, 2), range(0, 2), 1.0, 1.0),
                             StageMeasurement(range(1, 3), range(2, 4), 1.0, 1.0)])
    with pytest.raises(CalibrationError, match="non-empty list of StageMeasurement"):
        calibration.observe([])
    with pytest.raises(CalibrationError, match="the profiles 5 / 12"):
        calibration.apply(uniform("t", 5), planner.student)
    with pytest.raises(CalibrationError, match="measured_s has 1 entries for a placement of 2 stages"):
        measurements(Placement((0, 1), (6, 6), (6, 6)), [1.0, 1.0], [1.0])
    with pytest.raises(CalibrationError, match="teacher factor of block 0"):
        BlockCalibration((1.0,), (1.0,), (-2.0,), (None,))
    with pytest.raises(CalibrationError, match="saved factors cover 1 teacher"):
        calibration.load_state({"teacher_factors": [1.0], "student_factors": [1.0], "observations": 1})


def test_a_stage_the_profile_prices_at_zero_is_not_measured():
    w = CalibrationWindow(Placement((0, 1), (6, 6), (6, 6)), [0.0, 1.0], [1.0, 1.0], 0, 2)
    found = w.add([1.0, 2.0], [False, False]) + w.add([1.0, 2.0], [False, False])
    assert [(m.teacher_blocks, m.ratio) for m in found] == [(range(6, 12), 2.0)] and w.finished


def test_bad_windows_are_refused():
    placement = Placement((0, 1), (6, 6), (6, 6))
    with pytest.raises(CalibrationError, match="steps=0 must be an integer >= 1"):
        window(placement, steps=0)
    with pytest.raises(CalibrationError, match="slowdowns has 1 entries for 2 stages"):
        window(placement, slowdowns=(1.0,))
    with pytest.raises(CalibrationError, match=r"slowdowns\[1\]=inf"):
        window(placement, slowdowns=(1.0, math.inf))
    with pytest.raises(CalibrationError, match=r"predicted_s\[0\]=-1.0 must be a finite number of seconds >= 0"):
        CalibrationWindow(placement, [-1.0, 1.0], [1.0, 1.0], 0, 2)
    with pytest.raises(CalibrationError, match="a step of 3 compute values"):
        window(placement).add([1.0, 1.0, 1.0], [False, False])


def test_state_round_trip_and_record(planner):
    calibration = calibrate(planner, Placement((0, 1), (6, 6), (6, 6)), [1.0, 2.0])
    restored = BlockCalibration.neutral(planner.teacher, planner.student).load_state(calibration.state_dict())
    assert restored == calibration
    record = calibration.to_dict()
    assert record["teacher"] == [1.0] * 6 + [2.0] * 6 and record["observations"] == 2 and record["neutral"] == 1.5


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_factors_stay_finite_positive_and_the_last_placement_is_predicted_as_measured(data):
    blocks = data.draw(st.integers(2, 9))
    planner = StagePlanner(uniform("t", blocks, fwd_ms=data.draw(st.floats(0.1, 5))), uniform("s", blocks), StepSpec(2))
    calibration = BlockCalibration.neutral(planner.teacher, planner.student)
    for _ in range(data.draw(st.integers(1, 4))):
        k = data.draw(st.integers(1, blocks))
        cuts = sorted(data.draw(st.sets(st.integers(1, blocks - 1), min_size=k - 1, max_size=k - 1)))
        counts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, blocks]))
        placement = Placement(tuple(range(k)), counts, counts)
        ratios = data.draw(st.lists(st.floats(0.05, 20), min_size=k, max_size=k))
        calibration = calibrate(planner, placement, ratios, calibration=calibration)
        teacher, student = calibration.factors()
        assert all(math.isfinite(f) and f > 0 for f in [*teacher, *student])
        calibrated = calibration.calibrated(planner).per_step_compute_s(*_parts(placement))
        base = planner.per_step_compute_s(*_parts(placement))
        assert calibrated == pytest.approx([b * r for b, r in zip(base, ratios)], rel=1e-9)


def test_the_estimator_rescaled_reads_as_if_it_had_measured_against_the_new_predictions():
    config = EstimatorConfig(warmup_steps=0, baseline_steps=4, median_window=1, ema_weight=1.0)
    old, new = AlphaBetaEstimator(config), AlphaBetaEstimator(config)
    measured, comm = [1.0, 2.0, 1.0], [0.0, 0.0, 0.0]
    old_prediction, new_prediction = [1.0, 1.0, 1.0], [1.0, 2.0, 1.0]  # stage 1's blocks calibrated 2x dearer
    for step in range(6):
        if step == 2:  # the calibration lands inside the baseline
            old.rescale_compute({1: 2.0})
        predicted = old_prediction if step < 2 else new_prediction
        old.update(devices=[0, 1, 2], measured_compute_s=measured, measured_comm_s=comm,
                   predicted_compute_s=predicted, predicted_comm_s=comm)
        new.update(devices=[0, 1, 2], measured_compute_s=measured, measured_comm_s=comm,
                   predicted_compute_s=new_prediction, predicted_comm_s=comm)
    assert old.alphas() == new.alphas() == {0: 1.0, 1: 1.0, 2: 1.0}, "the profile error is not a slow device"
    old.rescale_compute({0: 0.5})  # after the reference: its alpha follows its predictions
    assert old.alpha(0) == 2.0


def test_online_calibration_prices_with_the_run_planner_until_a_stage_is_measured(planner):
    online = OnlineCalibration(planner, warmup_steps=1, steps=2, hold_steps=1)
    assert online.priced is planner and online.observe([1.0, 1.0], [False, False]) == []
    running = Placement((0, 1), (6, 6), (6, 6))
    profile_s = planner.per_step_compute_s(*_parts(running))
    online.begin(running, [1.0, 1.0])
    found = []
    for _ in range(4):
        found += online.observe([profile_s[0], 2 * profile_s[1]], [False, False])
    assert [m.ratio for m in found] == pytest.approx([1.0, 2.0], rel=1e-12)
    assert online.priced is not planner and online.priced.plan((0, 1), (1.0, 1.0))[:2] != ((6, 6), (6, 6))
    assert [row["rank"] for row in online.describe(found)] == [0, 1]
