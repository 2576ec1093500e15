"""The supervisor's health monitor: is every worker alive and making progress (heartbeats,
liveness), is every GPU healthy (NVML, a CUDA context probe); and each worker's start probe: is its
device as fast as its peers on the same work (speed_probe).
"""
from synapse.health.liveness import (
    FINISHED_PHASE,
    Heartbeat,
    LivenessTracker,
    heartbeat_path,
    kill_live_workers,
    pid_alive,
    read_heartbeats,
    written_here,
)
from synapse.health.monitor import (
    HealthConfigError,
    HealthMonitor,
    HealthSettings,
    NullHealthMonitor,
    build_health_monitor,
)
from synapse.health.nvml import NullNvml, cuda_to_nvml_index, decode_clock_reasons, open_nvml
from synapse.health.probe import CudaProbe
from synapse.health.speed_probe import PROBE_ROUNDS, ProbeReading, ProbeWork, probe_devices, turn_of

__all__ = ["CudaProbe", "FINISHED_PHASE", "HealthConfigError", "HealthMonitor", "HealthSettings", "Heartbeat",
           "LivenessTracker", "NullHealthMonitor", "NullNvml", "PROBE_ROUNDS", "ProbeReading", "ProbeWork",
           "build_health_monitor", "cuda_to_nvml_index", "decode_clock_reasons", "heartbeat_path", "kill_live_workers",
           "open_nvml", "pid_alive", "probe_devices", "read_heartbeats", "turn_of", "written_here"]
