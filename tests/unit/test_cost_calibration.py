"""Calibration of predicted step times onto measured ones: the fit, its error, its checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from synapse.calibration import Calibration, calibration_error
from synapse.partitioning import CostModelError


def test_calibration_fit_recovers_known_scale_and_overhead():
    rng = np.random.default_rng(0)
    predicted = rng.uniform(0.1, 2.0, 40)
    measured = 3.2 * predicted + 0.15 + rng.normal(0, 1e-4, 40)
    fitted = Calibration.fit(predicted, measured)
    assert fitted.scale == pytest.approx(3.2, rel=1e-3)
    assert fitted.overhead_s == pytest.approx(0.15, abs=1e-3)


def test_calibration_detects_and_corrects_a_model_that_predicts_four_times_too_small():
    predicted = np.array([0.2, 0.35, 0.5, 0.8])
    measured = 4.0 * predicted + 0.05
    assert calibration_error(predicted, measured) > 0.7  # detected: far off
    calibration = Calibration.fit(predicted, measured)
    assert calibration_error(calibration.apply(predicted), measured) < 1e-9  # corrected


def test_calibration_never_fits_a_negative_overhead():
    predicted = [1.0, 2.0, 3.0]
    measured = [1.9, 4.0, 6.1]  # unconstrained fit: scale 2.1, overhead -0.2
    fitted = Calibration.fit(predicted, measured)
    assert fitted.overhead_s == 0.0
    assert fitted.scale == pytest.approx(np.dot(predicted, measured) / np.dot(predicted, predicted))


def test_calibration_from_one_pair_or_equal_predictions_is_scale_only():
    assert Calibration.fit([0.5], [2.0]) == Calibration(4.0, 0.0)
    assert Calibration.fit([0.5, 0.5], [1.0, 2.0]).scale == pytest.approx(3.0)


def test_calibration_apply_accepts_floats_and_arrays():
    calibration = Calibration(scale=2.0, overhead_s=0.1)
    assert calibration.apply(1.0) == pytest.approx(2.1)
    assert isinstance(calibration.apply(1.0), float)
    np.testing.assert_allclose(calibration.apply([1.0, 2.0]), [2.1, 4.1])
    assert Calibration().apply(0.7) == 0.7


@pytest.mark.parametrize(
    ("predicted", "measured", "expected"),
    [
        ([], [], "non-empty"),
        ([1.0, 2.0], [1.0], "equally long"),
        ([1.0, -2.0], [1.0, 2.0], "must be > 0"),
        ([1.0, math.nan], [1.0, 2.0], "finite"),
    ],
)
def test_calibration_rejects_bad_pairs(predicted, measured, expected):
    with pytest.raises(CostModelError, match=expected):
        Calibration.fit(predicted, measured)


def test_calibration_rejects_nonsense_parameters():
    with pytest.raises(CostModelError, match="scale"):
        Calibration(scale=0.0)
    with pytest.raises(CostModelError, match="overhead"):
        Calibration(overhead_s=-1.0)
