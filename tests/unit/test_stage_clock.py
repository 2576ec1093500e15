"""The stage clock's reports on the CPU (host times): at once, or a step late as on CUDA."""
from __future__ import annotations

import time

import pytest
import torch

from synapse.pipeline import StageClock, reads_timing_late

CPU = torch.device("cpu")


def run_step(clock: StageClock, step: int, compute_s: float = 0.002, idle_s: float = 0.004):
    clock.begin_step(step)
    with clock.interval("student_fwd"):
        time.sleep(compute_s)
    with clock.interval("send_fwd"):
        pass
    time.sleep(idle_s)  # waiting on peers: neither compute nor own sends
    return clock.end_step()


def test_a_clock_read_at_once_reports_each_step_at_its_end():
    clock = StageClock(CPU)
    report = run_step(clock, 1)
    assert report["step"] == 1 and report["student_fwd"] >= 0.002
    assert report["wall"] >= report["compute"] + 0.004
    assert report["comm"] == pytest.approx(report["wall"] - report["compute"])
    assert report["wait"] == pytest.approx(report["comm"] - report["send"])
    assert clock.flush() is None


def test_a_clock_read_late_reports_the_step_before_and_the_last_one_on_flush():
    clock = StageClock(CPU, read_late=True)
    assert run_step(clock, 1) is None
    reports = [run_step(clock, step) for step in (2, 3)] + [clock.flush()]
    assert [r["step"] for r in reports] == [1, 2, 3]
    assert clock.flush() is None
    for report in reports:
        assert report["student_fwd"] >= 0.002 and report["wall"] >= report["compute"]


def test_time_between_late_steps_belongs_to_neither():
    """An evaluation or a checkpoint between two steps is not step time, read late or at once
    (the failover controller would read it as a slow link)."""
    clock = StageClock(CPU, read_late=True)
    run_step(clock, 1, idle_s=0.0)
    time.sleep(0.05)  # between the steps
    first = run_step(clock, 2, idle_s=0.0)
    second = clock.flush()
    assert first["wall"] < 0.04 and second["wall"] < 0.04


def test_intervals_outside_a_step_are_not_timed():
    clock = StageClock(CPU)
    with clock.interval("student_fwd"):  # e.g. an evaluation forward
        time.sleep(0.01)
    assert run_step(clock, 1, compute_s=0.0)["student_fwd"] < 0.01


@pytest.mark.parametrize("choice, device, late", [("auto", "cuda", True), ("auto", "cpu", False),
                                                  ("late", "cpu", True), ("at_step", "cuda", False)])
def test_auto_reads_late_only_on_cuda(choice, device, late):
    assert reads_timing_late(choice, torch.device(device)) is late


def gpu_busy_for(clock: StageClock, step: int, cycles: int):
    clock.begin_step(step)
    with clock.interval("student_fwd"):
        torch.cuda._sleep(cycles)  # the GPU spins; the host goes on at once
    return clock.end_step()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_late_step_is_read_from_its_events_without_waiting_for_the_step_after():
    """The path the pipeline takes on a GPU: a step's report waits for that step's events only
    (the next step's work is still queued when it returns), its wall time is the GPU's, and the
    GPU's idle time between steps (the host busy elsewhere) is in neither step."""
    torch.cuda._sleep(1000)  # loads the kernel: the first launch's host delay is not GPU time
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * 50.0 / start.elapsed_time(end))  # about 50 ms of GPU time
    clock = StageClock(torch.device("cuda"))
    assert clock.read_late
    assert gpu_busy_for(clock, 1, cycles) is None
    time.sleep(0.2)  # the GPU finishes step 1 and idles
    first = gpu_busy_for(clock, 2, cycles)
    assert not torch.cuda.current_stream().query(), "reading step 1 waited for step 2"
    second = clock.flush()
    assert [first["step"], second["step"]] == [1, 2]
    for report in (first, second):
        assert 0.03 < report["student_fwd"] < 0.08
        assert report["student_fwd"] <= report["wall"] < 0.15  # not the 0.2 s idle gap
