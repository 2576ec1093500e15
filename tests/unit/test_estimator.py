"""AlphaBetaEstimator on synthetic measurements: measured = predicted * scale * factor * noise."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import pytest

from synapse.calibration import (
    COMM,
    COMPUTE,
    AlphaBetaEstimator,
    EstimatorConfig,
    EstimatorConfigError,
    EstimatorInputError,
)

CONFIG = EstimatorConfig()
NOMINAL = lambda step, device: 1.0  # noqa: E731


def run(estimator: AlphaBetaEstimator, steps: range, devices: list[int], *, seed: int,
        alpha: Callable[[int, int], float] = NOMINAL, beta: Callable[[int, int], float] = NOMINAL,
        compute_scale: float = 1.0, comm_scale: float = 1.0, noise: float = 0.15,
        predicted_compute: list[float] | None = None, predicted_comm: list[float] | None = None,
        spike: Callable[[int, int], float] = NOMINAL) -> None:
    rng = random.Random(seed)
    predicted_compute = predicted_compute or [0.2 + 0.1 * r for r in range(len(devices))]
    predicted_comm = predicted_comm or [0.05 + 0.01 * r for r in range(len(devices))]

    def measure(step: int, predicted: list[float], scale: float, factor: Callable[[int, int], float]) -> list[float]:
        return [p * scale * factor(step, d) * spike(step, d) * rng.uniform(1 - noise, 1 + noise)
                for p, d in zip(predicted, devices)]

    for step in steps:
        estimator.update(devices=devices,
                         measured_compute_s=measure(step, predicted_compute, compute_scale, alpha),
                         measured_comm_s=measure(step, predicted_comm, comm_scale, beta),
                         predicted_compute_s=predicted_compute, predicted_comm_s=predicted_comm)


def test_a_uniformly_mis_scaled_profile_reads_as_no_slowdown():
    estimator = AlphaBetaEstimator()
    run(estimator, range(300), [0, 1, 2, 3], seed=1, compute_scale=0.37, comm_scale=4.2)
    assert estimator.reference(COMPUTE) == pytest.approx(0.37, rel=0.05)
    assert estimator.reference(COMM) == pytest.approx(4.2, rel=0.05)
    for device in range(4):
        assert estimator.alpha(device) == pytest.approx(1.0, abs=0.08)
        assert estimator.beta(device) == pytest.approx(1.0, abs=0.08)


def test_recovers_known_alphas_and_betas_under_noise():
    devices = [3, 5, 7, 11]  # device ids need not be ranks

    def alpha(step: int, device: int) -> float:
        if device == 7:
            return 1.5  # heterogeneous from the start
        return 3.0 if device == 3 and step >= 150 else 1.0

    def beta(step: int, device: int) -> float:
        return 2.5 if device == 11 and step >= 150 else 1.0

    estimator = AlphaBetaEstimator()
    run(estimator, range(400), devices, seed=2, alpha=alpha, beta=beta, compute_scale=2.0, comm_scale=0.5)
    expected_alpha = {3: 3.0, 5: 1.0, 7: 1.5, 11: 1.0}
    expected_beta = {3: 1.0, 5: 1.0, 7: 1.0, 11: 2.5}
    assert estimator.alphas() == pytest.approx(expected_alpha, rel=0.1)
    assert estimator.betas() == pytest.approx(expected_beta, rel=0.1)


def test_a_device_slow_from_the_start_does_not_move_the_reference():
    estimator = AlphaBetaEstimator()
    slow_device = lambda step, d: 3.0 if d == 4 else 1.0  # noqa: E731
    run(estimator, range(CONFIG.warmup_steps + CONFIG.baseline_steps), list(range(5)), seed=3, alpha=slow_device)
    assert estimator.reference(COMPUTE) == pytest.approx(1.0, rel=0.05)
    expected = {0: 1, 1: 1, 2: 1, 3: 1, 4: 3.0}
    assert estimator.alphas() == pytest.approx(expected, rel=0.1)  # known as soon as the baseline ends
    run(estimator, range(100, 200), list(range(5)), seed=4, alpha=slow_device)
    assert estimator.alphas() == pytest.approx(expected, rel=0.1)


def test_a_lone_device_slow_from_the_start_reads_its_slowdown_against_an_assumed_reference():
    """Alone, its own baseline is the reference (alpha 1 whatever its speed); the detector's plan
    check knows better, and the phase ends at once on that reference."""
    slow = lambda step, d: 3.0  # noqa: E731
    alone = AlphaBetaEstimator()
    run(alone, range(CONFIG.warmup_steps + CONFIG.baseline_steps), [0], seed=5, alpha=slow)
    assert alone.alphas() == pytest.approx({0: 1.0}, rel=0.1)
    told = AlphaBetaEstimator()
    run(told, range(CONFIG.warmup_steps + 15), [0], seed=5, alpha=slow)
    assert told.assume_compute_reference(1.0) and told.reference(COMPUTE) == 1.0
    assert told.alphas() == pytest.approx({0: 3.0}, rel=0.1)
    assert not told.assume_compute_reference(2.0) and told.reference(COMPUTE) == 1.0  # known: kept
    run(told, range(100, 150), [0], seed=6, alpha=slow)
    assert told.alphas() == pytest.approx({0: 3.0}, rel=0.1)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(EstimatorInputError, match="reference"):
            AlphaBetaEstimator().assume_compute_reference(bad)


@pytest.mark.parametrize("spike_factor", [3.0, 10.0])
def test_single_step_spikes_barely_move_the_estimate(spike_factor):
    def spike(step: int, device: int) -> float:
        return spike_factor if device == 1 and step >= 200 and step % 17 == 0 else 1.0

    def deviation(config: EstimatorConfig) -> float:
        estimator, worst = AlphaBetaEstimator(config), 0.0
        run(estimator, range(200), [0, 1, 2], seed=4, noise=0.0)
        for step in range(200, 300):
            run(estimator, range(step, step + 1), [0, 1, 2], seed=step, noise=0.0, spike=spike)
            worst = max(worst, abs(estimator.alpha(1) - 1.0), abs(estimator.beta(1) - 1.0))
        return worst

    assert deviation(CONFIG) < 1e-9  # the window median never lets a lone spike through
    assert deviation(EstimatorConfig(median_window=1)) > 0.3  # control: the EMA alone is moved


def test_factors_are_clipped_to_the_configured_bounds():
    def alpha(step: int, device: int) -> float:
        return {0: 1.0, 1: 1.0, 2: 500.0 if step >= 100 else 1.0, 3: 0.001 if step >= 100 else 1.0}[device]

    estimator = AlphaBetaEstimator()
    run(estimator, range(300), [0, 1, 2, 3], seed=5, alpha=alpha,
        beta=lambda step, d: 2 * CONFIG.max_beta if d == 0 else 1.0)
    assert estimator.alpha(2) == pytest.approx(CONFIG.max_alpha)
    assert estimator.alpha(3) == pytest.approx(CONFIG.min_alpha)
    # beta of device 0 was 2 x max_beta from the start, but the reference is the other devices' median
    assert estimator.beta(0) == pytest.approx(CONFIG.max_beta)


def test_alpha_follows_the_device_across_a_repartition():
    slow = lambda step, d: 2.0 if d == 2 else 1.0  # noqa: E731
    estimator = AlphaBetaEstimator()
    run(estimator, range(300), [0, 1, 2, 3], seed=6, alpha=slow, compute_scale=1.3)
    before = estimator.alphas()
    assert before[2] == pytest.approx(2.0, rel=0.1)
    # DEGRADE: device 1 dropped, the others get other blocks; predictions change a lot
    run(estimator, range(300, 340), [0, 2, 3], seed=7, alpha=slow, compute_scale=1.3,
        predicted_compute=[0.9, 0.15, 0.4], predicted_comm=[0.2, 0.03, 0.01])
    after = estimator.alphas()
    assert after[0] == pytest.approx(1.0, abs=0.1) and after[3] == pytest.approx(1.0, abs=0.1)
    assert after[2] == pytest.approx(2.0, rel=0.1)
    assert after[1] == before[1]  # not measured any more: kept as it was


@pytest.mark.parametrize("share, stays", [(0.1, True), (0.0, False)])
def test_a_stage_predicted_too_small_to_measure_keeps_its_devices_alpha(share, stays):
    """A re-plan leaves the 3x slow device the heads only: predicted 1/50 of its peers, measured
    mostly what the profiles do not hold (0.05 s of dispatch and loss, also 3x slower)."""
    slow = lambda step, d: 3.0 if d == 2 else 1.0  # noqa: E731
    estimator = AlphaBetaEstimator(EstimatorConfig(min_predicted_share=share))
    run(estimator, range(100), [0, 1, 2], seed=9, alpha=slow, predicted_compute=[0.5, 0.5, 0.5])
    assert estimator.alpha(2) == pytest.approx(3.0, rel=0.1)
    for _ in range(100, 160):
        estimator.update(devices=[0, 1, 2], measured_compute_s=[0.5, 0.5, 3.0 * (0.01 + 0.05)],
                         measured_comm_s=[0.05, 0.05, 0.05], predicted_compute_s=[0.5, 0.5, 0.01],
                         predicted_comm_s=[0.05, 0.05, 0.05])
    assert (estimator.alpha(2) == pytest.approx(3.0, rel=0.1)) is stays, estimator.alpha(2)


def test_unmeasured_factors_read_one():
    estimator = AlphaBetaEstimator()
    assert estimator.alpha(0) == 1.0 and not estimator.ready
    run(estimator, range(CONFIG.warmup_steps + CONFIG.baseline_steps - 1), [0], seed=8, alpha=lambda s, d: 2.0)
    assert estimator.alpha(0) == 1.0 and not estimator.ready  # one step short of the reference
    run(estimator, range(100, 200), [0, 1], seed=9, predicted_comm=[0.05, 0.0])  # the last stage sends nothing
    assert estimator.ready
    assert estimator.beta(1) == 1.0 and 1 not in estimator.betas()


def test_comm_gets_its_reference_once_comm_is_first_predicted():
    estimator = AlphaBetaEstimator()
    run(estimator, range(100), [0], seed=10, predicted_comm=[0.0])  # one device: no comm at all
    assert estimator.reference(COMM) is None and estimator.ready
    run(estimator, range(100, 100 + CONFIG.baseline_steps), [0, 1], seed=11, comm_scale=3.0,
        predicted_comm=[0.05, 0.0])
    assert estimator.reference(COMM) == pytest.approx(3.0, rel=0.1)


def test_comm_measured_as_zero_gives_no_reference_and_no_crash():
    estimator = AlphaBetaEstimator()
    run(estimator, range(200), [0, 1], seed=15, comm_scale=0.0)
    assert estimator.reference(COMM) is None and estimator.betas() == {}
    assert estimator.reference(COMPUTE) is not None


def test_state_round_trips_through_json_and_skips_the_restart_warm_up():
    slow = lambda step, d: 2.0 if d == 1 else 1.0  # noqa: E731
    estimator = AlphaBetaEstimator()
    run(estimator, range(200), [0, 1, 2], seed=12, alpha=slow)
    restored = AlphaBetaEstimator()
    restored.load_state_dict(json.loads(json.dumps(estimator.state_dict())))
    assert restored.state_dict() == estimator.state_dict()
    assert restored.alphas() == estimator.alphas()
    # the restarted process's warm-up steps are 5x slow everywhere: ignored
    run(restored, range(200, 200 + CONFIG.warmup_steps), [0, 1, 2], seed=13, alpha=lambda s, d: 5.0)
    assert restored.alphas() == estimator.alphas()
    run(restored, range(220, 320), [0, 1, 2], seed=14, alpha=slow)
    assert restored.alphas() == pytest.approx({0: 1.0, 1: 2.0, 2: 1.0}, rel=0.1)


def test_load_state_dict_rejects_foreign_input():
    estimator = AlphaBetaEstimator()
    with pytest.raises(EstimatorInputError, match="version"):
        estimator.load_state_dict({"version": 2})
    state = AlphaBetaEstimator().state_dict()
    state[COMPUTE]["reference"] = -1.0
    with pytest.raises(EstimatorInputError, match="reference=-1.0"):
        estimator.load_state_dict(state)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(warmup_steps=-1), "warmup_steps=-1"),
    (dict(baseline_steps=0), "baseline_steps=0"),
    (dict(median_window=1.5), "median_window=1.5"),
    (dict(ema_weight=0.0), "ema_weight=0.0"),
    (dict(ema_weight=1.5), "ema_weight=1.5"),
    (dict(min_alpha=0.0), "min_alpha=0.0"),
    (dict(max_alpha=0.9), "max_alpha=0.9"),
    (dict(max_beta=math.inf), "max_beta=inf"),
    (dict(min_predicted_s=0.0), "min_predicted_s=0.0"),
    (dict(min_predicted_share=1.0), "min_predicted_share=1.0"),
    (dict(min_predicted_share=math.nan), "min_predicted_share=nan"),
])
def test_config_rejects_out_of_range_values_naming_them(kwargs, needle):
    with pytest.raises(EstimatorConfigError) as error:
        EstimatorConfig(**kwargs)
    assert needle in str(error.value)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(devices=[0, 0]), "devices=[0, 0]"),
    (dict(devices=[]), "devices=[]"),
    (dict(devices=[0, "cuda:1"]), "'cuda:1'"),
    (dict(measured_compute_s=[0.1]), "measured_compute_s has 1 entries"),
    (dict(measured_comm_s=[0.1, -0.1]), "measured_comm_s[1]=-0.1"),
    (dict(predicted_compute_s=[0.1, math.nan]), "predicted_compute_s[1]=nan"),
    (dict(measured_compute_s=[0.1, math.inf]), "measured_compute_s[1]=inf"),  # plain floats: still checked
    (dict(predicted_comm_s=[0.1, True]), "predicted_comm_s[1]=True"),
])
def test_update_rejects_bad_input_naming_it(kwargs, needle):
    good = dict(devices=[0, 1], measured_compute_s=[0.1, 0.1], measured_comm_s=[0.1, 0.1],
                predicted_compute_s=[0.1, 0.1], predicted_comm_s=[0.1, 0.0])
    with pytest.raises(EstimatorInputError) as error:
        AlphaBetaEstimator().update(**{**good, **kwargs})
    assert needle in str(error.value)


def transfer_run(estimator, steps, slow_from, factor, transfer_s, healthy_s=0.3e-3, seed=0):
    """Two links; link 1 moves its bytes ``factor`` times slower from ``slow_from`` on."""
    rng = random.Random(seed)
    for step in steps:
        slow = factor if step >= slow_from else 1.0
        measured = [healthy_s * rng.uniform(0.9, 1.1) + (slow - 1.0) * transfer_s[1] * (r == 1) for r in range(2)]
        estimator.update(devices=[0, 1, 2], measured_compute_s=[0.1, 0.1, 0.1], predicted_compute_s=[0.1, 0.1, 0.1],
                         measured_comm_s=measured + [0.0], predicted_comm_s=list(transfer_s) + [0.0],
                         comm_is_transfer=True)


def test_own_transfer_beta_is_a_bandwidth_slowdown_whatever_the_bytes():
    # the same 40x slower link read through two different cuts (bytes 8x apart) gives the same beta
    for transfer_s in ([1e-4, 8e-4], [1e-4, 1e-4]):
        estimator = AlphaBetaEstimator()
        transfer_run(estimator, range(120), slow_from=60, factor=40.0, transfer_s=transfer_s)
        assert estimator.beta(1) == pytest.approx(40.0, rel=0.1), transfer_s
        # the healthy link: its posting-time noise (+-10% of 0.3 ms) reads as a little excess, which
        # prices its cut at most a few tens of microseconds higher
        assert 1.0 <= estimator.beta(0) < 1.5 and (estimator.beta(0) - 1.0) * transfer_s[0] < 0.1 * 0.3e-3


def test_own_transfer_baseline_stays_healthy_when_the_link_slows_inside_it():
    # warm-up 10, the healthy level from steps 10..24; the fault starts at 20
    estimator = AlphaBetaEstimator()
    transfer_run(estimator, range(120), slow_from=20, factor=10.0, transfer_s=[1e-4, 1e-4])
    assert estimator.beta(1) == pytest.approx(10.0, rel=0.1)
    restored = AlphaBetaEstimator()
    restored.load_state_dict(estimator.state_dict())
    transfer_run(restored, range(120, 160), slow_from=0, factor=10.0, transfer_s=[1e-4, 1e-4])
    assert restored.beta(1) == pytest.approx(10.0, rel=0.1)  # the healthy level survives a restart


def test_own_transfer_beta_is_mostly_known_10_steps_after_a_link_slows():
    # healthy level known at step 24 (the detector's baseline window), the link slows at 30: within
    # the 10 steps the detector takes to blame it, beta has climbed most of the way (median + EMA)
    estimator = AlphaBetaEstimator()
    transfer_run(estimator, range(40), slow_from=30, factor=40.0, transfer_s=[1e-4, 1e-4])
    assert 0.75 * 40.0 < estimator.beta(1) < 40.0


# ---------------------------------------------------------------- level shifts (mark_shift)

def _feed_constant(estimator: AlphaBetaEstimator, steps: int, levels: list[float]) -> None:
    """``steps`` steps in which device d measures ``levels[d]`` times its prediction (no noise)."""
    run(estimator, range(steps), list(range(len(levels))), seed=0, noise=0.0, alpha=lambda _, device: levels[device])


def test_a_marked_level_shift_is_read_at_once_where_smoothing_lags():
    smoothed, shifted = AlphaBetaEstimator(), AlphaBetaEstimator()
    for estimator in (smoothed, shifted):
        _feed_constant(estimator, CONFIG.warmup_steps + CONFIG.baseline_steps + 20, [1.0, 1.0, 1.0])
        _feed_constant(estimator, 5, [1.0, 1.0, 3.0])  # device 2 is 3x slower from here: 5 steps
    assert smoothed.alpha(2) < 2.0  # the EMA is still mostly the old level
    assert shifted.mark_shift(2, 5) is True
    assert shifted.alpha(2) == pytest.approx(3.0)
    assert shifted.alpha(0) == pytest.approx(1.0) and shifted.alpha(1) == pytest.approx(1.0)
    _feed_constant(shifted, 10, [1.0, 1.0, 3.0])  # smoothing goes on from the new level
    assert shifted.alpha(2) == pytest.approx(3.0)


def test_a_shift_inside_the_baseline_phase_is_read_when_the_phase_ends_from_the_samples_after_it():
    estimator = AlphaBetaEstimator()
    before, after = 18, CONFIG.baseline_steps - 18
    _feed_constant(estimator, CONFIG.warmup_steps + before, [2.0, 2.0, 2.0])  # profile 2x optimistic
    _feed_constant(estimator, 6, [2.0, 2.0, 8.0])  # device 2: 4x slower from here
    assert estimator.mark_shift(2, 6) is False  # no reference yet: read at the phase's end
    assert not estimator.ready
    _feed_constant(estimator, after - 6, [2.0, 2.0, 8.0])
    assert estimator.reference(COMPUTE) == pytest.approx(2.0)  # the samples before the onset
    assert estimator.alpha(2) == pytest.approx(4.0)  # the samples since, not the baseline's median
    assert estimator.alpha(0) == pytest.approx(1.0)


def test_without_a_marked_shift_a_slowdown_inside_the_baseline_is_averaged_in():
    """The control of the test above: the baseline's median keeps the old level."""
    estimator = AlphaBetaEstimator()
    _feed_constant(estimator, CONFIG.warmup_steps + 18, [2.0, 2.0, 2.0])
    _feed_constant(estimator, CONFIG.baseline_steps - 18, [2.0, 2.0, 8.0])
    assert estimator.alpha(2) == pytest.approx(1.0)


def test_a_shift_with_too_few_samples_since_its_onset_changes_nothing():
    estimator = AlphaBetaEstimator()
    _feed_constant(estimator, CONFIG.warmup_steps + CONFIG.baseline_steps + 10, [1.0, 1.0])
    _feed_constant(estimator, 2, [1.0, 5.0])
    before = estimator.alpha(1)
    assert estimator.mark_shift(1, 2) is False and estimator.alpha(1) == before


def test_a_shift_back_down_is_read_at_once_too():
    estimator = AlphaBetaEstimator()
    _feed_constant(estimator, CONFIG.warmup_steps + CONFIG.baseline_steps, [1.0, 1.0, 1.0])
    _feed_constant(estimator, 40, [1.0, 1.0, 3.0])
    assert estimator.alpha(2) == pytest.approx(3.0, rel=0.05)
    _feed_constant(estimator, 5, [1.0, 1.0, 1.0])
    assert estimator.mark_shift(2, 5) and estimator.alpha(2) == pytest.approx(1.0)


@pytest.mark.parametrize("steps", [0, -3, True, 2.0, None])
def test_mark_shift_rejects_a_step_count_that_is_not_a_positive_integer(steps):
    with pytest.raises(EstimatorInputError, match="steps_since_onset"):
        AlphaBetaEstimator().mark_shift(0, steps)


def test_min_shift_samples_must_be_a_positive_integer():
    with pytest.raises(EstimatorConfigError, match="min_shift_samples"):
        EstimatorConfig(min_shift_samples=0)
