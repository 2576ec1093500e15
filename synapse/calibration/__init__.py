"""What the running pipeline teaches the planner: each device's compute and link slowdown
(the alpha/beta estimator), per-block corrections of the profiles, and a fit of the cost model's
terms to measured steps. Pure: no torch.
"""
from synapse.calibration.blocks import (
    BlockCalibration,
    CalibrationError,
    CalibrationWindow,
    OnlineCalibration,
    StageMeasurement,
    measurements,
)
from synapse.calibration.cost_fit import Calibration, TermCalibration, calibration_error
from synapse.calibration.estimator import (
    COMM,
    COMPUTE,
    AlphaBetaEstimator,
    EstimatorConfig,
    EstimatorConfigError,
    EstimatorInputError,
)

__all__ = ["AlphaBetaEstimator", "BlockCalibration", "COMM", "COMPUTE", "Calibration", "CalibrationError",
           "CalibrationWindow", "EstimatorConfig", "EstimatorConfigError", "EstimatorInputError",
           "OnlineCalibration", "StageMeasurement", "TermCalibration", "calibration_error", "measurements"]
