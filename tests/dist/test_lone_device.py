"""A lone device (K = 1) slow from its first steps, on a real CPU rank: with no peers it is judged
against the plan, the spare replaces it, the spare does not inherit its slowdown, and the run
learns what an uninterrupted one learns."""
from __future__ import annotations

import pytest

from synapse.app import run
from synapse.failover import compose_segment_config, read_segments
from synapse.rundir import read_events

from .helpers import BASE_OVERRIDES, assert_identical_states, final_student_state

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600), pytest.mark.extended]

STEPS = 60
# 8x slow from step 2; the plan check at 5x: on this CPU a healthy lone stage measures ~1.6x its
# profile (the plan's absolute error here, which is why the check is off by default on CPU)
SLOW_FROM_THE_START = ("injection.faults=[{kind:slow_compute,rank:0,start:2,factor:8.0}]",
                       "failover.detector.alone_threshold=5.0")


def run_alone(run_dir, teacher_file, *extra: str) -> dict:
    overrides = [*BASE_OVERRIDES, f"trainer.max_steps={STEPS}", f"run_dir={run_dir}", f"cache_dir={run_dir}/cache",
                 f"teacher.checkpoint={teacher_file}", "trainer.devices=1",
                 "trainer.spare_devices=[1]", *extra]
    return run(compose_segment_config(overrides), log=lambda m: None, overrides=overrides)


def test_a_lone_device_slow_from_the_start_is_replaced_by_the_spare(tmp_path, teacher_file):
    summary = run_alone(tmp_path / "slow", teacher_file, *SLOW_FROM_THE_START)
    segments = read_segments(tmp_path / "slow")
    assert [(s.reason, list(s.devices), s.outcome) for s in segments] == [
        ("start", [0], "stopped"), ("replace", [1], "finished")]
    events = read_events(tmp_path / "slow" / "failover_events.jsonl")
    detected = [e for e in events if e["event"] == "slowdown_detected"]
    assert [(e["device"], e["kind"]) for e in detected] == [(0, "compute")], detected
    assert detected[0]["detected_step"] <= 30  # warm-up 10 + baseline 15 + sustain 3
    assert [e["device"] for e in events if e["event"] == "slowdown_dropped"] == [0]
    decisions = summary["experiment"]["decisions"]
    assert [d["action"] for d in decisions if d["action"] != "keep"] == ["replace"], decisions
    assert summary["experiment"]["steps"] == STEPS and segments[1].start_step <= 35
    run_alone(tmp_path / "uninterrupted", teacher_file, "failover.enabled=false")
    assert_identical_states(final_student_state(tmp_path / "slow"), final_student_state(tmp_path / "uninterrupted"))
