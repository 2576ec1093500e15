"""Fault injection in a real 3-rank CPU pipeline: every fault fires exactly when and where it is
configured, once, and shows in the events file and in performance.jsonl; the health monitor
sees the deaths and hangs the faults cause, and its callback can end a hung launch."""
from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median

import pytest

from synapse.app import run
from synapse.health import HealthMonitor, HealthSettings, kill_live_workers, pid_alive, read_heartbeats
from synapse.injection import cpu_core_for_rank
from synapse.launch import WorkerFailure
from synapse.rundir import read_events, read_jsonl

from .helpers import compose_config

pytestmark = [pytest.mark.dist]
QUIET = dict(log=lambda message: None)
MICROBATCHES = 4  # helpers.BASE_OVERRIDES: 4 forward and 4 backward tasks per rank and step
STEPS = 10


def config(tmp_path: Path, teacher_file: Path, faults: str, *extra: str):
    # Failover off: these tests watch the injector and the monitor end a launch; what the
    # supervisor then does about it is tests/dist/test_failover.py's subject.
    return compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", "trainer.devices=3",
                                     f"trainer.max_steps={STEPS}", f"injection.faults={faults}",
                                     "failover.enabled=false", *extra])


def per_step(records: list[dict], key: str, rank: int) -> dict[int, float]:
    return {r["step"]: r[key][rank] for r in records}


def span_events(run_dir: Path) -> list[tuple]:
    return sorted((e["event"], e["fault_index"], e["kind"], e["rank"], e["step"])
                  for e in read_events(run_dir) if e["event"] in ("fault_injected", "fault_cleared"))


@pytest.mark.timeout(150)
def test_slow_compute_slow_comm_and_background_load_act_exactly_on_their_steps(tmp_path, teacher_file):
    faults = ("[{kind:slow_compute,rank:2,start:4,end:6,seconds:0.05},"
              "{kind:slow_comm,rank:0,start:8,end:9,seconds:0.05},"
              "{kind:background_load,rank:1,start:3,end:5}]")
    run(config(tmp_path, teacher_file, faults), **QUIET)

    assert span_events(tmp_path) == sorted([
        ("fault_injected", 0, "slow_compute", 2, 4), ("fault_cleared", 0, "slow_compute", 2, 7),
        ("fault_injected", 1, "slow_comm", 0, 8), ("fault_cleared", 1, "slow_comm", 0, 10),
        ("fault_injected", 2, "background_load", 1, 3), ("fault_cleared", 2, "background_load", 1, 6)])
    records = read_jsonl(tmp_path / "performance.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # Rank 2 slept 0.05 s in each of its 8 tasks of steps 4-6, inside its compute intervals.
    compute = per_step(records, "compute_s", 2)
    task_time = 2 * MICROBATCHES * 0.05
    assert all(compute[s] >= task_time for s in (4, 5, 6)), compute
    assert all(compute[s] < task_time / 2 for s in set(compute) - {4, 5, 6}), compute
    # Rank 0 held each of its 8 sends of steps 8-9 for 0.05 s: communication time, not compute.
    comm, rank0_compute = per_step(records, "comm_s", 0), per_step(records, "compute_s", 0)
    assert all(comm[s] >= task_time for s in (8, 9)), comm
    assert all(rank0_compute[s] < task_time / 2 for s in (8, 9)), rank0_compute
    # ... and its own send time, not the others' (they only waited for it): the slow link is rank 0's.
    send = {r: per_step(records, "send_s", r) for r in range(3)}
    assert all(send[0][s] >= task_time for s in (8, 9)), send[0]
    assert all(send[r][s] < task_time / 4 for r in (1, 2) for s in (8, 9)), send
    # The load ran on rank 1's core and is gone with its worker.
    (load,) = read_events(tmp_path, "fault_injected", kind="background_load")
    assert (load["device"], load["core"]) == ("cpu", cpu_core_for_rank(1)) and len(load["load_pids"]) == 1
    assert not any(pid_alive(pid) for pid in load["load_pids"])
    assert {b["phase"] for b in read_heartbeats(tmp_path).values()} == {"finished"}


@pytest.mark.timeout(150)
def test_ramp_factor_and_intermittent_slowdowns_follow_their_schedules(tmp_path, teacher_file):
    faults = ("[{kind:slow_compute,rank:0,start:3,seconds:0.2,ramp_steps:4,phase:forward},"
              "{kind:slow_compute,rank:1,start:6,factor:4.0},"
              "{kind:slow_compute,rank:2,start:3,end:10,seconds:0.05,on_steps:2,off_steps:2}]")
    run(config(tmp_path, teacher_file, faults), **QUIET)

    records = read_jsonl(tmp_path / "performance.jsonl")
    injected = read_events(tmp_path, "fault_injected")
    assert sorted((e["rank"], e["step"]) for e in injected) == [(0, 3), (1, 6), (2, 3)]
    # Ramp: 0.2 s per forward task reached over 4 steps: 0, 0.05, 0.1, 0.15, then 0.2 (x 4 tasks).
    ramp = per_step(records, "compute_s", 0)
    for step in range(3, STEPS + 1):
        expected = MICROBATCHES * 0.2 * min(1.0, (step - 3) / 4)
        assert expected <= ramp[step] < expected + 0.1, (step, ramp)
    # Factor 4 from step 6: rank 1's compute is about 4x what it was. Medians, and at least twice:
    # a factor scales a recent step's measured compute, so on a loaded machine one step can scale a
    # quick one (every step at 2x failed once under a load average of 11 on 2 cores).
    factor = per_step(records, "compute_s", 1)
    before = median(factor[s] for s in (2, 3, 4, 5))
    assert median(factor[s] for s in range(6, STEPS + 1)) >= 2 * before, factor
    assert min(factor[s] for s in range(6, STEPS + 1)) >= 1.3 * before, factor
    # Intermittent: on 3-4, off 5-6, on 7-8, off 9-10.
    flaky = per_step(records, "compute_s", 2)
    slowed = {s for s in flaky if flaky[s] >= 2 * MICROBATCHES * 0.05}
    assert slowed == {3, 4, 7, 8}, flaky


@pytest.mark.timeout(150)
def test_kill_fires_once_at_its_phase_and_the_monitor_sees_the_dead_rank(tmp_path, teacher_file):
    settings = HealthSettings(period_s=0.1, hang_timeout_s=60.0, nvml=False)
    with HealthMonitor(tmp_path, settings, log=lambda line: None) as monitor:
        with pytest.raises(WorkerFailure):  # (the message may blame a peer that lost rank 1)
            run(config(tmp_path, teacher_file, "[{kind:kill,rank:1,step:5,phase:backward}]"), **QUIET)
        time.sleep(0.5)  # one more sample after the launch ended
    (kill,) = read_events(tmp_path, "fault_injected")
    assert (kill["kind"], kill["rank"], kill["step"], kill["phase"]) == ("kill", 1, 5, "backward")
    dead = [e for e in monitor.events if e["event"] == "rank_dead" and e["rank"] == 1]
    assert len(dead) == 1 and dead[0]["pid"] == kill["pid"] and dead[0]["step"] == 4 and dead[0]["hard"]
    records = read_jsonl(tmp_path / "performance.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]


@pytest.mark.timeout(150)
def test_a_hung_rank_is_detected_and_the_monitor_callback_ends_the_launch(tmp_path, teacher_file):
    # The collective timeout is far longer than the test: ending in time proves the monitor did it.
    cfg = config(tmp_path, teacher_file, "[{kind:hang,rank:1,step:4,phase:forward}]",
                 "trainer.collective_timeout_s=900")
    started = time.time()
    torn_down: list[int] = []

    def tear_down(event: dict) -> None:
        torn_down.extend(kill_live_workers(read_heartbeats(tmp_path), since=started))

    settings = HealthSettings(period_s=0.2, hang_timeout_s=3.0, nvml=False)
    with HealthMonitor(tmp_path, settings, on_hard_failure=tear_down, log=lambda line: None) as monitor:
        with pytest.raises(WorkerFailure):
            run(cfg, **QUIET)
    (hang,) = read_events(tmp_path, "fault_injected")
    assert (hang["kind"], hang["rank"], hang["step"], hang["phase"]) == ("hang", 1, 4, "forward")
    hung = [e for e in monitor.events if e["event"] == "rank_hung"]
    # Its peers wait on it and stall too; which stalled rank a pass meets first depends on when
    # each last beat (the teardown follows the first report), so this judges every report. Which
    # rank is to blame is the watchdog's question (test_reliability, test_random_faults_real).
    assert hung and all(e["stalled_s"] >= 3.0 for e in hung), hung
    assert all(e["pid"] == hang["pid"] and e["step"] == 3 for e in hung if e["rank"] == 1), hung
    assert hang["pid"] in torn_down
    assert time.time() - started < 120


@pytest.mark.timeout(150)
def test_cuda_error_fails_the_launch_as_a_device_error_of_its_rank(tmp_path, teacher_file):
    with pytest.raises(WorkerFailure) as failure:
        run(config(tmp_path, teacher_file, "[{kind:cuda_error,rank:2,step:3,phase:forward}]"), **QUIET)
    message = str(failure.value)
    assert "rank 2 failed first" in message, message
    assert "CUDA error: an illegal memory access was encountered" in message
    (event,) = read_events(tmp_path, "fault_injected")
    assert (event["kind"], event["rank"], event["step"], event["phase"]) == ("cuda_error", 2, 3, "forward")
    failures = list(tmp_path.glob("logs/launch_0/failures/rank_2.json"))
    assert json.loads(failures[0].read_text())["type"] in ("AcceleratorError", "RuntimeError")
