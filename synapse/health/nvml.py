"""GPU health through NVML (``import pynvml``, the nvidia-ml-py package), every call guarded.

``open_nvml`` returns an ``NvmlSampler`` when NVML works, else a ``NullNvml`` that samples
nothing (a CPU machine, no driver, no package): the reason is logged once, and liveness
monitoring goes on without GPU fields. Any single query a GPU or driver does not support is
left out of the sample (the field is absent), never an error.

Per device a sample has: utilization (%), SM clock and max SM clock (MHz), the clock-event
(throttle) reasons as names, temperature (C), power and its limit (W), memory used/total
(bytes), volatile ECC error counts and the compute mode. Critical XID events come from an
NVML event set polled without waiting.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

# nvmlClocksEventReason* bit values (stable NVML API; older releases call them ThrottleReasons).
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
# The reasons that mean the device runs slower than it could while it has work.
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")
# XIDs that report an application's own error (its process fails and liveness sees it), not
# a sick device: 13 graphics engine exception, 31 MMU fault, 43 stopped channel, 45 cleanup.
APPLICATION_XIDS = (13, 31, 43, 45)
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0
_NVML_MEMORY_ERROR_CORRECTED, _NVML_MEMORY_ERROR_UNCORRECTED = 0, 1
_NVML_VOLATILE_ECC = 0
_XID_CRITICAL_EVENT = 0x8  # nvmlEventTypeXidCriticalError


def decode_clock_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clock-event reason mask (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([hex(unknown)] if unknown else [])


def cuda_to_nvml_index(cuda_index: int, visible: str | None = None) -> int:
    """The NVML index of CUDA ordinal ``cuda_index`` under CUDA_VISIBLE_DEVICES (ids, not UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if not visible:
        return cuda_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if cuda_index < len(entries) and entries[cuda_index].isdigit():
        return int(entries[cuda_index])
    return cuda_index  # UUIDs or MIG ids: assume the identity (documented limitation)


class NullNvml:
    """NVML unavailable: samples nothing, sees no events."""

    available = False

    def sample(self, indices: Sequence[int]) -> dict[int, dict[str, Any]]:
        return {}

    def poll_xids(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


class NvmlSampler:
    """NVML queries for a set of device indices; XID events for the devices it has seen."""

    available = True

    def __init__(self, pynvml: Any):
        self.nvml = pynvml
        self._handles: dict[int, Any] = {}
        self._event_set = self._guard(pynvml.nvmlEventSetCreate)

    def handle(self, index: int) -> Any:
        if index not in self._handles:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
            if self._event_set is not None:  # register once per device; unsupported: no XIDs
                self._guard(self.nvml.nvmlDeviceRegisterEvents, handle, _XID_CRITICAL_EVENT, self._event_set)
        return self._handles[index]

    def sample(self, indices: Sequence[int]) -> dict[int, dict[str, Any]]:
        samples = {}
        for index in indices:
            handle = self._guard(self.handle, index)
            if handle is not None:
                samples[index] = self.sample_device(handle)
        return samples

    def sample_device(self, handle: Any) -> dict[str, Any]:
        n, g = self.nvml, self._guard
        fields: dict[str, Any] = {}
        util = g(n.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            fields.update(utilization_pct=util.gpu, memory_utilization_pct=util.memory)
        fields["sm_clock_mhz"] = g(n.nvmlDeviceGetClockInfo, handle, _NVML_CLOCK_SM)
        fields["max_sm_clock_mhz"] = g(n.nvmlDeviceGetMaxClockInfo, handle, _NVML_CLOCK_SM)
        reasons = g(self._clock_reason_query(), handle)
        if reasons is not None:
            fields["clock_event_reasons"] = decode_clock_reasons(int(reasons))
        fields["temperature_c"] = g(n.nvmlDeviceGetTemperature, handle, _NVML_TEMPERATURE_GPU)
        power = g(n.nvmlDeviceGetPowerUsage, handle)
        limit = g(n.nvmlDeviceGetEnforcedPowerLimit, handle)
        fields["power_w"] = power / 1000.0 if power is not None else None
        fields["power_limit_w"] = limit / 1000.0 if limit is not None else None
        memory = g(n.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            fields.update(memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total))
        for name, kind in (("ecc_corrected", _NVML_MEMORY_ERROR_CORRECTED),
                           ("ecc_uncorrected", _NVML_MEMORY_ERROR_UNCORRECTED)):
            fields[name] = g(n.nvmlDeviceGetTotalEccErrors, handle, kind, _NVML_VOLATILE_ECC)
        mode = g(n.nvmlDeviceGetComputeMode, handle)
        fields["compute_mode"] = COMPUTE_MODES.get(mode, mode) if mode is not None else None
        return {k: v for k, v in fields.items() if v is not None}

    def poll_xids(self) -> list[dict[str, Any]]:
        """Critical XID events pending now (never waits)."""
        if self._event_set is None:
            return []
        wait = getattr(self.nvml, "nvmlEventSetWait_v2", None) or self.nvml.nvmlEventSetWait
        events = []
        while True:
            try:
                data = wait(self._event_set, 0)
            except self.nvml.NVMLError:
                return events  # timeout: nothing (more) pending; other errors: XIDs unsupported
            index = self._guard(self.nvml.nvmlDeviceGetIndex, data.device)
            events.append({"device": index, "xid": int(data.eventData)})

    def close(self) -> None:
        if self._event_set is not None:
            self._guard(self.nvml.nvmlEventSetFree, self._event_set)
        self._guard(self.nvml.nvmlShutdown)

    def _clock_reason_query(self) -> Callable[[Any], int]:
        return (getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons)

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None when NVML or this device does not support it."""
        try:
            return fn(*args)
        except (self.nvml.NVMLError, AttributeError, TypeError):
            return None


def open_nvml(log: Callable[[str], None] = print,
              importer: Callable[[], Any] | None = None) -> NvmlSampler | NullNvml:
    """An NVML sampler, or a ``NullNvml`` after logging once why NVML is unavailable."""
    try:
        pynvml = importer() if importer else __import__("pynvml")
        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log(f"health: nvml unavailable ({type(exc).__name__}: {exc}); GPU health is not sampled, "
            f"liveness still is")
        return NullNvml()
    return NvmlSampler(pynvml)
