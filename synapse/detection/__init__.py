"""The slowdown detector: which rank got slower, at compute or at its link, from per-step
timings alone. Pure: one `StepTiming` per step in, `Detection` events out; no torch.
"""
from synapse.detection.baseline import MEDIAN_SD_FACTOR, net_compute_ratios, prior_checked, robust_sd
from synapse.detection.detector import (
    COMM,
    COMPUTE,
    RECOVERY,
    SLOWDOWN,
    Detection,
    DetectorConfig,
    DetectorConfigError,
    DetectorInputError,
    SlowdownDetector,
)
from synapse.detection.link import peer_checked_send
from synapse.detection.rebase import carry_over
from synapse.detection.start import START_NOISE_Z, START_STEPS, StartCheck, StartReading, probe_readings, start_readings
from synapse.detection.timing import StepTiming, TimingRecordError, link_send_seconds, read_step_timings
from synapse.detection.waiting import own_comm_per_step
from synapse.detection.wander import DELAY_WINDOWS, FLOOR_CAP, MIN_BLOCKS, PRIOR_FACTOR, PeerWander
from synapse.detection.window import change_index, current_level, projected_level, projection_sd_factor, slope

__all__ = ["COMM", "COMPUTE", "DELAY_WINDOWS", "Detection", "DetectorConfig", "DetectorConfigError",
           "DetectorInputError", "FLOOR_CAP", "MEDIAN_SD_FACTOR", "MIN_BLOCKS", "PRIOR_FACTOR", "PeerWander",
           "RECOVERY", "SLOWDOWN", "START_NOISE_Z", "START_STEPS", "SlowdownDetector", "StartCheck", "StartReading",
           "StepTiming", "TimingRecordError", "carry_over", "change_index", "current_level", "link_send_seconds",
           "net_compute_ratios", "own_comm_per_step", "peer_checked_send", "prior_checked", "probe_readings",
           "projected_level", "projection_sd_factor", "read_step_timings", "robust_sd", "slope", "start_readings"]
