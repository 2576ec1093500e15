"""The health monitor: liveness and hang judgement, NVML sampling (a fake NVML; none on CPU),
CUDA probes, and detection against real heartbeating processes."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from synapse.config import MonitorConfig
from synapse.health import (
    CudaProbe,
    HealthConfigError,
    HealthMonitor,
    HealthSettings,
    LivenessTracker,
    NullHealthMonitor,
    NullNvml,
    build_health_monitor,
    cuda_to_nvml_index,
    decode_clock_reasons,
    heartbeat_path,
    open_nvml,
    pid_alive,
)
from synapse.rundir import HEALTH, read_events

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ liveness, pure
def beat(pid=100, step=1, phase="training", t=0.0):
    return {"rank": 0, "pid": pid, "device": "cpu", "step": step, "phase": phase, "time": t}


def test_progress_keeps_a_rank_alive_and_a_stall_is_a_hang_reported_once():
    tracker = LivenessTracker(hang_timeout_s=10.0, is_alive=lambda pid: True, is_stopped=lambda pid: False)
    status, events = tracker.update({0: beat(step=1, t=0.0)}, now=1.0)
    assert status[0]["state"] == "alive" and events == []
    status, events = tracker.update({0: beat(step=2, t=8.0)}, now=15.0)  # advanced: timer restarts at 8
    assert status[0]["state"] == "alive" and events == []
    status, events = tracker.update({0: beat(step=2, t=8.0)}, now=18.0)
    assert status[0] == {"pid": 100, "step": 2, "phase": "training", "stalled_s": 10.0, "state": "hung",
                         "stopped": False}
    assert events == [{"event": "rank_hung", "rank": 0, "pid": 100, "step": 2, "phase": "training",
                       "stalled_s": 10.0, "hang_timeout_s": 10.0, "stopped_ranks": []}]
    assert tracker.update({0: beat(step=2, t=8.0)}, now=30.0)[1] == []  # once
    tracker.update({0: beat(step=3, t=31.0)}, now=31.0)
    assert [e["step"] for e in tracker.update({0: beat(step=3, t=31.0)}, now=45.0)[1]] == [3]  # hangs again


def test_a_phase_change_is_progress():
    tracker = LivenessTracker(hang_timeout_s=5.0, is_alive=lambda pid: True)
    tracker.update({0: beat(step=4, phase="training", t=0.0)}, now=0.0)
    status, events = tracker.update({0: beat(step=4, phase="evaluating", t=4.0)}, now=8.0)
    assert status[0]["state"] == "alive" and events == []


def test_a_gone_pid_is_dead_once_and_a_finished_rank_is_not():
    alive = {100: False, 200: False}
    tracker = LivenessTracker(hang_timeout_s=5.0, is_alive=lambda pid: alive[pid])
    beats = {0: beat(pid=100, step=3, t=0.0), 1: {**beat(pid=200, step=9, phase="finished", t=0.0), "rank": 1}}
    status, events = tracker.update(beats, now=1.0)
    assert (status[0]["state"], status[1]["state"]) == ("dead", "finished")
    assert events == [{"event": "rank_dead", "rank": 0, "pid": 100, "step": 3, "phase": "training"}]
    assert tracker.update(beats, now=2.0)[1] == []


def test_a_restarted_rank_is_a_new_process_and_stale_heartbeats_are_ignored():
    alive = {100: False, 300: True}
    tracker = LivenessTracker(hang_timeout_s=5.0, since=50.0, is_alive=lambda pid: alive[pid])
    status, events = tracker.update({0: beat(pid=100, t=10.0)}, now=60.0)  # an earlier launch's file
    assert status == {} and events == []
    status, events = tracker.update({0: beat(pid=300, step=0, phase="starting", t=61.0)}, now=62.0)
    assert status[0]["state"] == "alive" and events == []


def test_hang_timeout_must_be_positive():
    with pytest.raises(ValueError, match="hang_timeout_s=0 must be > 0"):
        LivenessTracker(hang_timeout_s=0)


def test_pid_alive_tells_running_from_exited_and_zombie_processes():
    import os

    assert pid_alive(os.getpid())
    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait()
    assert not pid_alive(reaped.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    while pid_alive(zombie.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # not reaped: once it exits it is a zombie, which is not alive
    assert not pid_alive(zombie.pid)
    zombie.wait()


# ------------------------------------------------------------------ settings
def test_settings_validate_with_the_fix():
    with pytest.raises(HealthConfigError, match=r"monitor.period_s=0 must be .* e.g. monitor.period_s=5.0"):
        HealthSettings(period_s=0)
    with pytest.raises(HealthConfigError, match="shorter than two periods"):
        HealthSettings(period_s=5.0, hang_timeout_s=6.0)
    assert HealthSettings.from_config({"period_s": 1.0, "hang_timeout_s": 9.0, "enabled": True}) == \
        HealthSettings(period_s=1.0, hang_timeout_s=9.0)
    assert HealthSettings.from_config(SimpleNamespace(nvml=False)) == HealthSettings(nvml=False)


def test_a_disabled_monitor_is_a_null_object(tmp_path):
    monitor = build_health_monitor(tmp_path, MonitorConfig(enabled=False))
    assert isinstance(monitor, NullHealthMonitor)
    with monitor:
        assert monitor.sample_once() == {}
    assert not HEALTH.path(tmp_path).exists()


# ------------------------------------------------------------------ NVML
def test_clock_reasons_decode_to_names():
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert decode_clock_reasons(0x8 | 0x10000) == ["hw_slowdown", "0x10000"]


def test_cuda_ordinals_map_through_cuda_visible_devices():
    assert cuda_to_nvml_index(1, visible="") == 1
    assert cuda_to_nvml_index(1, visible="4,6") == 6
    assert cuda_to_nvml_index(0, visible="GPU-1234abcd") == 0


def test_without_nvml_the_reason_is_logged_once_and_nothing_is_sampled():
    lines: list[str] = []

    def missing():
        raise ImportError("No module named 'pynvml'")

    nvml = open_nvml(lines.append, importer=missing)
    assert isinstance(nvml, NullNvml) and nvml.sample([0]) == {} and nvml.poll_xids() == []
    assert len(lines) == 1 and "nvml unavailable" in lines[0] and "pynvml" in lines[0]


class FakeNvml:
    """A pynvml stand-in: one device that supports some queries, raises for others."""

    class NVMLError(Exception):
        pass

    def __init__(self, reasons=0x0, ecc=0, xids=()):
        self.reasons, self.ecc, self.xids = reasons, ecc, list(xids)
        self.shut = False

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shut = True
    def nvmlDeviceGetHandleByIndex(self, i): return ("handle", i)
    def nvmlDeviceGetIndex(self, handle): return handle[1]
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=97, memory=40)
    def nvmlDeviceGetClockInfo(self, h, kind): return 1100
    def nvmlDeviceGetMaxClockInfo(self, h, kind): return 1980
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self.reasons
    def nvmlDeviceGetTemperature(self, h, kind): return 71
    def nvmlDeviceGetPowerUsage(self, h): return 612_000
    def nvmlDeviceGetEnforcedPowerLimit(self, h): raise self.NVMLError("Not Supported")
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=3 << 30, total=141 << 30, free=0)
    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter): return self.ecc if kind == 1 else 5
    def nvmlDeviceGetComputeMode(self, h): return 0
    def nvmlEventSetCreate(self): return "event-set"
    def nvmlEventSetFree(self, s): pass
    def nvmlDeviceRegisterEvents(self, h, types, s): pass

    def nvmlEventSetWait_v2(self, s, timeout_ms):
        if not self.xids:
            raise self.NVMLError("Timeout")
        return SimpleNamespace(device=("handle", 0), eventData=self.xids.pop(0), eventType=0x8)


def test_nvml_fields_are_sampled_and_unsupported_ones_left_out():
    fake = FakeNvml(reasons=0x4)
    sample = open_nvml(print, importer=lambda: fake).sample([0])[0]
    assert sample == {"utilization_pct": 97, "memory_utilization_pct": 40, "sm_clock_mhz": 1100,
                      "max_sm_clock_mhz": 1980, "clock_event_reasons": ["sw_power_cap"], "temperature_c": 71,
                      "power_w": 612.0, "memory_used_bytes": 3 << 30, "memory_total_bytes": 141 << 30,
                      "ecc_corrected": 5, "ecc_uncorrected": 0, "compute_mode": "default"}


def test_older_nvml_throttle_reason_name_is_used_when_the_new_one_is_missing():
    class OldNvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return 0x20

    sampler = open_nvml(print, importer=OldNvml)
    assert sampler.sample([0])[0]["clock_event_reasons"] == ["sw_thermal_slowdown"]


# The monitor judges only workers of a launch: a child of the fork server, itself a child of the
# supervisor (health/liveness.py, is_launch_worker). In these tests this process is the supervisor
# and the program below plays the fork server: it starts the workers and passes commands on to them.
LAUNCHER = textwrap.dedent("""
    import subprocess, sys
    workers = [subprocess.Popen([sys.executable, "-c", sys.argv[1], *args.split()], stdin=subprocess.PIPE)
               for args in sys.argv[2:]]
    print(" ".join(str(w.pid) for w in workers), flush=True)
    for line in sys.stdin:  # "kill <i>": SIGKILL worker i, not reaped (a zombie); "freeze <i>": pass it on
        command, index = line.split()
        worker = workers[int(index)]
        if command == "kill":
            worker.kill()
        else:
            worker.stdin.write(b"freeze\\n")
            worker.stdin.flush()
""")
SLEEPER = "import time; time.sleep(120)"


@contextlib.contextmanager
def launched(program: str, *args: str):
    """(send, pids): the workers running ``program`` with each of ``args``, started as a launch starts them;
    ``send("kill 0")`` passes a command on."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, program, *args], cwd=REPO, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)

    def send(command: str) -> None:
        launcher.stdin.write(command + "\n")
        launcher.stdin.flush()

    pids = [int(pid) for pid in launcher.stdout.readline().split()]
    try:
        yield send, pids
    finally:
        # The workers first, while the launcher is alive: it has not reaped them, so no pid is reused
        # yet, and they are not left orphaned to run on (a frozen worker loops for ever).
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.stdin.close()
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()


def gpu_heartbeat(run_dir: Path, rank: int, device: str, pid: int) -> None:
    """The heartbeat ``Heartbeat.beat`` writes, for the worker ``pid``."""
    path = heartbeat_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "pid": pid, "device": device, "step": 0, "phase": "starting",
                                "time": time.time()}))


def test_gpu_events_throttle_ecc_and_xid_go_to_the_log_and_hard_ones_to_the_callback(tmp_path):
    fake = FakeNvml(reasons=0x0, ecc=0)
    hard: list[dict] = []
    settings = HealthSettings(period_s=1.0, hang_timeout_s=60.0, probe=False)
    monitor = HealthMonitor(tmp_path, settings, on_hard_failure=hard.append, log=lambda line: None,
                            since=0.0, nvml_importer=lambda: fake)
    with launched(SLEEPER, "") as (_, [worker]):
        gpu_heartbeat(tmp_path, 0, "cuda:0", worker)
        gpu_heartbeat(tmp_path, 9, "cuda:0", os.getpid())  # planted: the supervisor's own pid owns no GPU
        monitor.sample_once()
        fake.reasons = 0x40 | 0x1  # thermal slowdown
        monitor.sample_once()
        monitor.sample_once()  # unchanged: no second event
        fake.reasons, fake.ecc, fake.xids = 0x0, 2, [79, 13]
        monitor.sample_once()
        monitor.stop()
    names = [(e["event"], e["hard"]) for e in read_events(tmp_path)]
    assert names == [("throttle", False), ("throttle_cleared", False), ("ecc_error", True), ("xid", True),
                     ("xid", False)]
    throttle = read_events(tmp_path, "throttle")[0]
    assert throttle["reasons"] == ["hw_thermal_slowdown"] and throttle["ranks"] == [0]
    assert [(e["event"], e.get("xid")) for e in hard] == [("ecc_error", None), ("xid", 79)]
    samples = [json.loads(line) for line in HEALTH.path(tmp_path).read_text().splitlines()]
    assert len(samples) == 4 and samples[0]["gpus"]["0"]["temperature_c"] == 71
    assert samples[0]["ranks"]["0"]["state"] == "alive" and fake.shut
    assert samples[0]["ranks"]["9"]["state"] == "not ours"


def test_on_cpu_the_monitor_logs_nvml_unavailable_once_and_still_samples_liveness(tmp_path):
    lines: list[str] = []
    monitor = HealthMonitor(tmp_path, HealthSettings(period_s=0.05, hang_timeout_s=30.0), log=lines.append,
                            since=0.0, nvml_importer=lambda: __import__("pynvml_is_not_installed"))
    with launched(SLEEPER, "") as (_, [worker]):
        gpu_heartbeat(tmp_path, 0, "cpu", worker)
        with monitor:
            deadline = time.monotonic() + 20
            while len(HEALTH.path(tmp_path).read_text().splitlines()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
    samples = [json.loads(line) for line in HEALTH.path(tmp_path).read_text().splitlines()]
    assert len(samples) >= 3 and all(s["ranks"]["0"]["state"] == "alive" and s["gpus"] == {} for s in samples)
    assert [line for line in lines if "nvml unavailable" in line] == lines and len(lines) == 1


# ------------------------------------------------------------------ probes
@pytest.mark.parametrize("program, outcome, hard", [
    ("import sys; sys.exit(0)", "ok", False),
    ("import sys; print('CUDA error: out of memory', file=sys.stderr); sys.exit(4)", "inconclusive", False),
    ("import sys; print('no CUDA GPUs are available', file=sys.stderr); sys.exit(1)", "failed", True),
    ("import time; time.sleep(60)", "timeout", True),
])
def test_probe_outcomes(program, outcome, hard):
    probe = CudaProbe("cuda:0", timeout_s=1.0, program=program)
    assert probe.poll() is None  # not started
    probe.start()
    deadline = time.monotonic() + 20
    while (result := probe.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert result is not None and (result.outcome, result.hard_failure) == (outcome, hard)
    if outcome == "failed":
        assert "no CUDA GPUs" in result.detail
    assert not probe.running


@pytest.mark.slow  # probe subprocesses that import torch
@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks that a missing GPU fails the probe")
def test_a_gpu_that_cannot_compute_is_a_hard_probe_failure(tmp_path):
    hard: list[dict] = []
    monitor = HealthMonitor(tmp_path, HealthSettings(period_s=0.1, hang_timeout_s=30.0, probe_timeout_s=40.0),
                            on_hard_failure=hard.append, log=lambda line: None, gpu_devices=[0])
    with monitor:
        deadline = time.monotonic() + 45
        while not hard and time.monotonic() < deadline:
            time.sleep(0.1)
    assert [(e["event"], e["device"], e["outcome"]) for e in hard] == [("probe_failed", "cuda:0", "failed")]
    assert read_events(tmp_path, "probe_failed")[0]["hard"] is True


# ------------------------------------------------------------------ real heartbeating processes
WORKER = textwrap.dedent("""
    import sys, threading, time
    from synapse.health.liveness import Heartbeat
    heartbeat = Heartbeat(sys.argv[1], int(sys.argv[2]), "cpu")
    frozen = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), frozen.set()), daemon=True).start()
    step = 0
    while True:
        if not frozen.is_set():
            step += 1
            heartbeat.beat(step)
        time.sleep(0.05)
""")


@pytest.mark.slow  # waits for the hang timeout
@pytest.mark.timeout(60)
def test_a_killed_worker_is_dead_and_a_frozen_one_hung_within_bounded_time(tmp_path):
    hard: list[tuple[float, dict]] = []
    settings = HealthSettings(period_s=0.1, hang_timeout_s=1.0, nvml=False)
    with launched(WORKER, f"{tmp_path} 0", f"{tmp_path} 1") as (send, workers):
        monitor = HealthMonitor(tmp_path, settings, on_hard_failure=lambda e: hard.append((time.monotonic(), e)),
                                log=lambda line: None)
        with monitor:
            deadline = time.monotonic() + 30
            while len(list((tmp_path / "live").glob("rank_*.json"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)  # both advancing for longer than the hang timeout: nothing to report
            assert hard == []
            killed_at = time.monotonic()
            send("kill 0")  # not reaped by its parent: a zombie must read as dead too
            send("freeze 1")
            frozen_at = time.monotonic()
            while len(hard) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert pid_alive(workers[1])  # hung, not dead
    by_event = {e["event"]: (t, e) for t, e in hard}
    assert sorted(by_event) == ["rank_dead", "rank_hung"] and len(hard) == 2
    dead_t, dead = by_event["rank_dead"]
    hung_t, hung = by_event["rank_hung"]
    assert (dead["rank"], dead["pid"], hung["rank"], hung["pid"]) == (0, workers[0], 1, workers[1])
    # bounded: a period (plus scheduling slack) for a death, the timeout plus a period for a hang
    assert dead_t - killed_at < 0.1 + 5.0
    assert hung_t - frozen_at < 1.0 + 0.1 + 5.0
    assert [e["event"] for e in read_events(tmp_path)] == [e["event"] for _, e in hard]
