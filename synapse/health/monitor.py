"""The supervisor's health monitor: liveness, hangs and GPU health on a background thread.

Every ``period_s`` the monitor reads the workers' heartbeats (``<run_dir>/live/``) and judges
each rank alive, dead or hung (``liveness``); on GPUs it samples NVML (``nvml``), polls
critical XID events and, every ``probe_every_s``, probes each device with a fresh CUDA
context in a child process (``probe``). Each pass appends one record to
``<run_dir>/health.jsonl``; problems become events in ``failover_events.jsonl``:

=================  ====  =========================================================
event              hard  meaning
=================  ====  =========================================================
rank_dead          yes   a worker's pid is gone while it had not finished
rank_hung          yes   a worker's (step, phase) did not change for hang_timeout_s
probe_failed       yes   a fresh process cannot compute on the device (or timed out)
xid                yes*  a critical XID (* not 13/31/43/45, an application's own error)
ecc_error          yes   the volatile uncorrected ECC count grew
throttle           no    the SM clock is held down (power cap, thermal, HW slowdown)
throttle_cleared   no    no slowdown reason any more
probe_inconclusive no    the probe ran out of memory (the workers may hold the device)
=================  ====  =========================================================

Hard failures go at once, on the monitor thread, to ``on_hard_failure(event)``: the
supervisor tears the workers down there. Without NVML or a GPU the monitor logs
"nvml unavailable" once and keeps judging liveness.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from synapse.health.liveness import LivenessTracker, is_own_process, read_heartbeats
from synapse.health.nvml import APPLICATION_XIDS, SLOWDOWN_REASONS, NullNvml, cuda_to_nvml_index, open_nvml
from synapse.health.probe import CudaProbe, ProbeResult
from synapse.rundir import HEALTH, EventLog, JsonlWriter, events_path

HARD_EVENTS = ("rank_dead", "rank_hung", "probe_failed", "xid", "ecc_error")


class HealthConfigError(ValueError):
    """A health-monitor setting out of range; the message names it and the fix."""


@dataclass(frozen=True)
class HealthSettings:
    period_s: float = 5.0  # seconds between two samples
    hang_timeout_s: float = 300.0  # no (step, phase) change for this long: hung (covers eval and checkpoints)
    nvml: bool = True  # sample GPUs through NVML when available
    probe: bool = True  # CUDA context probes on GPUs
    probe_every_s: float = 60.0
    probe_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("period_s", "hang_timeout_s", "probe_every_s", "probe_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise HealthConfigError(f"monitor.{name}={value!r} must be a number of seconds > 0; "
                                        f"e.g. monitor.{name}={getattr(HealthSettings, name)}")
        if self.hang_timeout_s < 2 * self.period_s:
            raise HealthConfigError(f"monitor.hang_timeout_s={self.hang_timeout_s} is shorter than two periods "
                                    f"(monitor.period_s={self.period_s}); a hang could not be told from a late "
                                    f"sample: raise hang_timeout_s or lower period_s")

    @classmethod
    def from_config(cls, cfg: Any) -> HealthSettings:
        """Settings from any object or mapping with some of these fields (e.g. the ``monitor`` config)."""
        get = cfg.get if hasattr(cfg, "get") else lambda key, default: getattr(cfg, key, default)
        return cls(**{f.name: get(f.name, f.default) for f in fields(cls)})


class HealthMonitor:
    """Samples worker and device health every period on a thread; ``sample_once`` does one pass."""

    def __init__(self, run_dir: Path | str, settings: HealthSettings | None = None,
                 on_hard_failure: Callable[[dict[str, Any]], None] | None = None,
                 log: Callable[[str], None] = print, since: float | None = None,
                 gpu_devices: Sequence[int] = (), nvml_importer: Callable[[], Any] | None = None):
        """``since``: ignore heartbeats older than this (default: now, so an earlier launch's files
        are not read as dead ranks); ``gpu_devices``: CUDA ordinals to watch besides the workers'."""
        self.run_dir = Path(run_dir)
        self.settings = settings or HealthSettings()
        self.on_hard_failure = on_hard_failure
        self.log = log
        self.gpu_devices = tuple(gpu_devices)
        self.tracker = LivenessTracker(self.settings.hang_timeout_s, since=time.time() if since is None else since,
                                       is_ours=is_own_process)
        self.nvml = open_nvml(log, nvml_importer) if self.settings.nvml else NullNvml()
        self.events_log = EventLog(events_path(self.run_dir), source="health")
        self.events: list[dict[str, Any]] = []
        self._samples = JsonlWriter(HEALTH.path(self.run_dir))
        self._throttle: dict[int, tuple[str, ...]] = {}
        self._ecc: dict[int, int] = {}
        self._probes: dict[str, CudaProbe] = {}
        self._next_probe: dict[str, float] = {}
        self._skipped_probes: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> HealthMonitor:
        self._thread = threading.Thread(target=self._run, name="synapse-health", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.period_s + 10.0)
        with self._lock:
            for probe in self._probes.values():
                probe.abandon()
            self.nvml.close()
            self._samples.close()

    def __enter__(self) -> HealthMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # a monitor that dies silently is worse than one that logs
                self.log(f"health: sampling failed ({type(exc).__name__}: {exc}); retrying next period")
            self._stop.wait(self.settings.period_s)

    # ---------------------------------------------------------------- one pass
    def sample_once(self, now: float | None = None) -> dict[str, Any]:
        """Read heartbeats, sample GPUs, poll probes; write the sample and the events; return the sample."""
        with self._lock:
            now = time.time() if now is None else now
            beats = read_heartbeats(self.run_dir)
            ranks, events = self.tracker.update(beats, now)
            devices = self._cuda_devices(beats, ranks)
            gpus = self.nvml.sample(sorted({cuda_to_nvml_index(d) for d in devices}))
            owners = self._owners(beats, ranks)
            events += self._gpu_events(gpus, owners)
            events += self._probe_events(devices, gpus)
            sample = {"time": now, "ranks": {str(r): s for r, s in ranks.items()},
                      "gpus": {str(i): g for i, g in gpus.items()}}
            self._samples.write(dict(sample))
            for event in events:
                self._emit(event)
            return sample

    def _cuda_devices(self, beats: dict[int, dict], ranks: dict[int, dict]) -> list[int]:
        devices = set(self.gpu_devices)
        for rank in ranks:
            device = str(beats[rank].get("device", ""))
            if device.startswith("cuda"):
                devices.add(int(device.split(":")[1]) if ":" in device else 0)
        return sorted(devices)

    @staticmethod
    def _owners(beats: dict[int, dict], ranks: Iterable[int]) -> dict[int, list[int]]:
        """NVML index -> the ranks that run on it."""
        owners: dict[int, list[int]] = {}
        for rank in ranks:
            device = str(beats[rank].get("device", ""))
            if device.startswith("cuda"):
                ordinal = int(device.split(":")[1]) if ":" in device else 0
                owners.setdefault(cuda_to_nvml_index(ordinal), []).append(rank)
        return owners

    def _gpu_events(self, gpus: dict[int, dict], owners: dict[int, list[int]]) -> list[dict[str, Any]]:
        events = []
        for index, gpu in gpus.items():
            where = {"device": index, "ranks": owners.get(index, [])}
            slowdown = tuple(r for r in gpu.get("clock_event_reasons", ()) if r in SLOWDOWN_REASONS)
            if slowdown != self._throttle.get(index, ()):
                name = "throttle" if slowdown else "throttle_cleared"
                events.append({"event": name, **where, "reasons": list(slowdown),
                               "sm_clock_mhz": gpu.get("sm_clock_mhz"),
                               "max_sm_clock_mhz": gpu.get("max_sm_clock_mhz")})
                self._throttle[index] = slowdown
            if "ecc_uncorrected" in gpu:
                before = self._ecc.setdefault(index, gpu["ecc_uncorrected"])
                if gpu["ecc_uncorrected"] > before:
                    events.append({"event": "ecc_error", **where, "uncorrected": gpu["ecc_uncorrected"],
                                   "before": before})
                    self._ecc[index] = gpu["ecc_uncorrected"]
        for xid in self.nvml.poll_xids():
            events.append({"event": "xid", **xid, "ranks": owners.get(xid["device"], []),
                           "application_error": xid["xid"] in APPLICATION_XIDS})
        return events

    def _probe_events(self, devices: list[int], gpus: dict[int, dict]) -> list[dict[str, Any]]:
        if not self.settings.probe:
            return []
        events = []
        clock = time.monotonic()
        for ordinal in devices:
            device = f"cuda:{ordinal}"
            if gpus.get(cuda_to_nvml_index(ordinal), {}).get("compute_mode") == "exclusive_process":
                if device not in self._skipped_probes:  # a second context is refused there by design
                    self._skipped_probes.add(device)
                    self.log(f"health: {device} is in exclusive-process compute mode; no CUDA probes on it")
                continue
            probe = self._probes.setdefault(device, CudaProbe(device, self.settings.probe_timeout_s))
            result = probe.poll()
            if result is not None:
                events += self._probe_result_events(result)
            if not probe.running and clock >= self._next_probe.get(device, 0.0):
                probe.start()
                self._next_probe[device] = clock + self.settings.probe_every_s
        return events

    @staticmethod
    def _probe_result_events(result: ProbeResult) -> list[dict[str, Any]]:
        if result.outcome == "ok":
            return []
        name = "probe_failed" if result.hard_failure else "probe_inconclusive"
        return [{"event": name, "device": result.device, "outcome": result.outcome,
                 "seconds": round(result.seconds, 3), "detail": result.detail}]

    def _emit(self, event: dict[str, Any]) -> None:
        hard = event["event"] in HARD_EVENTS and not event.get("application_error", False)
        record = self.events_log.write({**event, "hard": hard})
        self.events.append(record)
        if hard and self.on_hard_failure is not None:
            try:
                self.on_hard_failure(record)
            except Exception as exc:
                self.log(f"health: on_hard_failure raised {type(exc).__name__}: {exc}")


class NullHealthMonitor:
    """A disabled monitor: the same interface, nothing to do."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def start(self) -> NullHealthMonitor:
        return self

    def stop(self) -> None:
        pass

    def sample_once(self, now: float | None = None) -> dict[str, Any]:
        return {}

    def __enter__(self) -> NullHealthMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def build_health_monitor(run_dir: Path | str, cfg: Any, on_hard_failure: Callable[[dict], None] | None = None,
                         log: Callable[[str], None] = print, gpu_devices: Sequence[int] = ()
                         ) -> HealthMonitor | NullHealthMonitor:
    """The monitor the ``monitor`` config asks for (``enabled: false``: a null one), not yet started."""
    enabled = getattr(cfg, "enabled", True)
    if not enabled:
        return NullHealthMonitor()
    settings = HealthSettings.from_config(cfg)
    if not gpu_devices:  # a CPU run: no GPU to sample, and nothing to say about NVML
        settings = dataclasses.replace(settings, nvml=False)
    return HealthMonitor(run_dir, settings, on_hard_failure, log, gpu_devices=gpu_devices)
