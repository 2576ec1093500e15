"""Fault injection: spec validation, the schedule of every kind, the injector, the event log,
and the background load process (real processes: CPU use on the pinned core, death with its parent)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from synapse.injection import (
    CUDA_ERROR_MESSAGE,
    BackgroundLoad,
    DeviceDelay,
    FaultInjector,
    FaultSpec,
    InjectedFault,
    InjectionError,
    LoadTarget,
    TaskBaseline,
    cpu_core_for_rank,
    fired_fault_indices,
    parse_faults,
    split_extra,
)
from synapse.rundir import EventLog, EventLogError, read_events

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ parsing
def test_legacy_instant_form_parses_unchanged():
    (fault,) = parse_faults([{"kind": "raise", "rank": 1, "step": 3}], world_size=3)
    assert (fault.kind, fault.rank, fault.step, fault.phase, fault.index) == ("raise", 1, 3, "step_start", 0)


def test_every_kind_parses_with_its_settings():
    specs = [
        {"kind": "kill", "rank": 0, "step": 5, "phase": "backward"},
        {"kind": "hang", "rank": 1, "step": 2, "phase": "send"},
        {"kind": "cuda_error", "rank": 2, "step": 9},
        {"kind": "slow_compute", "rank": 2, "start": 30, "factor": 2.5},
        {"kind": "slow_compute", "rank": 1, "start": 3, "end": 9, "seconds": 0.1, "phase": "forward",
         "on_steps": 2, "off_steps": 1},
        {"kind": "slow_compute", "rank": 1, "start": 1, "factor": 4.0, "ramp_steps": 10},
        {"kind": "slow_comm", "rank": 0, "step": 4, "seconds": 0.02},
        {"kind": "background_load", "rank": 2, "start": 3, "end": 6, "workers": 2, "matrix_size": 512},
    ]
    faults = parse_faults(specs, world_size=3)
    assert [f.index for f in faults] == list(range(len(specs)))
    kill, hang, cuda, factor, fixed, ramp, comm, load = faults
    assert (kill.phase, hang.phase, cuda.phase) == ("backward", "send", "step_start")
    assert (factor.start, factor.end, factor.factor, factor.phases) == (30, None, 2.5, ("forward", "backward", "probe"))
    assert (fixed.seconds, fixed.end, fixed.phases, fixed.on_steps, fixed.off_steps) == (0.1, 9, ("forward",), 2, 1)
    assert (ramp.ramp_steps, ramp.start) == (10, 1)
    assert (comm.start, comm.end, comm.phases) == (4, 4, ("send",))  # step: a single-step span
    assert (load.workers, load.matrix_size, load.phases) == (2, 512, ("step_start",))


def test_omegaconf_specs_parse_like_plain_ones():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"faults": [{"kind": "slow_compute", "rank": 1, "start": 2, "seconds": 0.1,
                                        "phase": ["backward"]}]})
    (fault,) = parse_faults(cfg.faults, world_size=2)
    assert fault.phases == ("backward",)


BAD_SPECS = [
    ({"kind": "explode", "rank": 0, "step": 1}, "kind 'explode' is unknown", "use one of raise, kill"),
    ({"rank": 0, "step": 1}, "no kind given", "use one of"),
    ({"kind": "raise", "step": 1}, "no rank given", "add rank"),
    ({"kind": "raise", "rank": 3, "step": 1}, "targets rank 3 but the run has 3", "pick an existing rank"),
    ({"kind": "raise", "rank": -1, "step": 1}, "rank=-1 is below 0", "rank >= 0"),
    ({"kind": "raise", "rank": "one", "step": 1}, "rank='one' is not an integer", "rank: N"),
    ({"kind": "raise", "rank": True, "step": 1}, "rank=True is not an integer", "rank: N"),
    ({"kind": "raise", "rank": 0, "step": 0}, "step=0 is below 1", "steps are 1-based"),
    ({"kind": "kill", "rank": 0}, "no step given", "add step: N"),
    ({"kind": "kill", "rank": 0, "start": 3}, "unknown key(s) ['start']", "a kill fault takes"),
    ({"kind": "raise", "rank": 0, "step": 2, "phase": "lunch"}, "phase ['lunch']", "use one of step_start"),
    ({"kind": "hang", "rank": 0, "step": 2, "phase": ["forward", "backward"]}, "names several phases", "one phase"),
    ({"kind": "slow_compute", "rank": 0, "seconds": 1.0}, "give either start", "e.g."),
    ({"kind": "slow_compute", "rank": 0, "step": 2, "start": 2, "seconds": 1.0}, "give either start", "e.g."),
    ({"kind": "slow_compute", "rank": 0, "step": 2, "end": 4, "seconds": 1.0}, "takes no end", "start: S, end: E"),
    ({"kind": "slow_compute", "rank": 0, "start": 5, "end": 4, "seconds": 1.0}, "end=4 is below 5", "end >= 5"),
    ({"kind": "slow_compute", "rank": 0, "start": 5}, "exactly one of seconds", "seconds: 0.05"),
    ({"kind": "slow_compute", "rank": 0, "start": 5, "seconds": 1, "factor": 2}, "exactly one of", "factor: 2.0"),
    ({"kind": "slow_compute", "rank": 0, "start": 5, "factor": 1.0}, "factor=1.0 must be > 1.0", "twice as slow"),
    ({"kind": "slow_compute", "rank": 0, "start": 5, "seconds": 0}, "seconds=0 must be > 0.0", "seconds > 0.0"),
    ({"kind": "slow_compute", "rank": 0, "start": 5, "seconds": float("nan")}, "not a finite number", "seconds: X"),
    ({"kind": "slow_compute", "rank": 0, "start": 1, "factor": 2.0, "phase": ["forward", "backward"]},
     "step 1 has none", "start at step 2"),
    ({"kind": "slow_compute", "rank": 0, "start": 2, "seconds": 1, "on_steps": 3}, "go together", "give both"),
    ({"kind": "slow_compute", "rank": 0, "start": 2, "seconds": 1, "phase": "send"}, "phase ['send']",
     "use one of forward, backward"),
    ({"kind": "slow_comm", "rank": 0, "start": 2, "seconds": 1, "phase": "forward"}, "phase ['forward']",
     "use one of send"),
    ({"kind": "slow_compute", "rank": 0, "start": 2, "factr": 2.0}, "unknown key(s) ['factr']", "takes kind"),
    ({"kind": "background_load", "rank": 0, "start": 2, "workers": 0}, "workers=0 is below 1", "workers >= 1"),
    ({"kind": "background_load", "rank": 0, "start": 2, "seconds": 1}, "unknown key(s) ['seconds']", "workers"),
]


@pytest.mark.parametrize("spec, problem, fix", BAD_SPECS, ids=[p for _, p, _ in BAD_SPECS])
def test_bad_specs_fail_with_the_fault_index_the_problem_and_the_fix(spec, problem, fix):
    good = {"kind": "raise", "rank": 0, "step": 1}
    with pytest.raises(InjectionError) as error:
        parse_faults([good, spec], world_size=3)
    message = str(error.value)
    assert message.startswith("injection.faults[1]"), message
    assert problem in message and fix in message, message


def test_a_fault_that_is_not_a_mapping_is_named():
    with pytest.raises(InjectionError, match=r"injection.faults\[0\] is 'kill', not a mapping"):
        parse_faults(["kill"], world_size=1)


def test_injection_error_is_a_value_error():
    assert issubclass(InjectionError, ValueError)


# ------------------------------------------------------------------ the pure schedule
def span(**settings) -> FaultSpec:
    return FaultSpec.from_config({"kind": "slow_compute", "rank": 0, **settings})


def test_a_range_is_active_exactly_from_start_to_end_inclusive():
    fault = span(start=3, end=5, seconds=0.5)
    assert [s for s in range(1, 9) if fault.active(s)] == [3, 4, 5]
    assert [fault.extra_seconds(s, None) for s in range(1, 8)] == [0, 0, 0.5, 0.5, 0.5, 0, 0]


def test_an_open_range_lasts_to_the_end_of_the_run():
    fault = span(start=4, factor=2.0)
    assert not fault.active(3) and all(fault.active(s) for s in (4, 100, 10_000))


def test_intermittent_periods_repeat_from_start():
    fault = span(start=3, end=14, seconds=1.0, on_steps=2, off_steps=3)
    assert [s for s in range(1, 20) if fault.active(s)] == [3, 4, 8, 9, 13, 14]
    assert all(fault.in_window(s) for s in range(3, 15)) and not fault.in_window(15)


def test_a_ramp_rises_linearly_from_one_to_the_factor_and_holds():
    fault = span(start=10, factor=3.0, ramp_steps=4)
    assert [fault.effective_factor(s) for s in range(9, 16)] == [1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.0]
    assert [fault.extra_seconds(s, 0.2) for s in (10, 12, 20)] == pytest.approx([0.0, 0.2, 0.4])


def test_a_seconds_ramp_scales_the_fixed_delay():
    fault = span(start=1, end=5, seconds=0.8, ramp_steps=4)
    assert [fault.extra_seconds(s, None) for s in range(1, 7)] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 0])


def test_a_factor_scales_the_measured_task_time_and_needs_one():
    fault = span(start=2, factor=2.5)
    assert fault.extra_seconds(2, 0.4) == pytest.approx(0.6)
    assert fault.extra_seconds(2, None) == 0.0  # nothing measured yet: no guess


# ------------------------------------------------------------------ the injector
class Recorder:
    """Stands in for the device delay and the stage clock."""

    def __init__(self):
        self.delays: list[tuple[str | None, float, bool]] = []
        self._open: str | None = None

    def delay(self, seconds: float, host_only: bool = False) -> None:
        self.delays.append((self._open, seconds, host_only))

    @contextmanager
    def interval(self, name: str):
        self._open = name
        yield
        self._open = None


def make_injector(specs, rank=0, world=3, timing=None, loads=None):
    events: list[dict] = []
    recorder = Recorder()
    factory = (lambda spec: loads.setdefault(spec.index, FakeLoad())) if loads is not None else None
    injector = FaultInjector(parse_faults(specs, world), rank, record=events.append, delay=recorder.delay,
                             load_factory=factory)
    injector.attach_clock(recorder, lambda: timing if timing is not None else {})
    return injector, events, recorder


def run_step(injector, step, microbatches=2):
    injector.on("step_start", step)
    for _ in range(microbatches):
        injector.on("forward", step)
        injector.on("send", step)
    for _ in range(microbatches):
        injector.on("backward", step)
        injector.on("send", step)
    injector.on("optimizer", step)


@pytest.mark.parametrize("phase", ["step_start", "forward", "backward", "send", "optimizer"])
def test_a_raise_fires_once_at_its_phase_and_step_only(phase):
    injector, events, _ = make_injector([{"kind": "raise", "rank": 1, "step": 3, "phase": phase}], rank=1)
    calls = [(p, s) for s in range(1, 6) for p in ("step_start", "forward", "backward", "send", "optimizer")]
    fired = []
    for p, s in calls * 2:  # a second pass over the same steps (eval, resume) fires nothing more
        try:
            injector.on(p, s)
        except InjectedFault as exc:
            fired.append((p, s, str(exc)))
    assert fired == [(phase, 3, f"injected fault: rank 1 raises at step 3 ({phase})")]
    assert [(e["event"], e["kind"], e["rank"], e["step"], e["phase"], e["fault_index"]) for e in events] == [
        ("fault_injected", "raise", 1, 3, phase, 0)]
    assert injector.pending == [] and [f.kind for f in injector.fired] == ["raise"]


def test_a_repartition_fault_fires_at_the_first_repartition_at_or_after_its_step():
    # Re-partitions happen when the policy decides, so the step is a lower bound, not an exact match.
    injector, events, _ = make_injector([{"kind": "raise", "rank": 1, "step": 4, "phase": "repartition"}], rank=1)
    for step in range(1, 7):
        run_step(injector, step)  # ordinary steps never fire it
    injector.on("repartition", 3)  # before its step: nothing
    with pytest.raises(InjectedFault, match=r"step 4 \(repartition\)"):
        injector.on("repartition", 7)
    injector.on("repartition", 9)  # once
    assert [(e["step"], e["phase"]) for e in events] == [(7, "repartition")]


def test_faults_of_other_ranks_and_evaluation_steps_never_fire():
    injector, events, _ = make_injector([{"kind": "raise", "rank": 2, "step": 1},
                                         {"kind": "slow_compute", "rank": 2, "start": 1, "seconds": 1.0}])
    for step in (1, 2):
        run_step(injector, step)
    other, other_events, recorder = make_injector([{"kind": "raise", "rank": 0, "step": 1, "phase": "forward"}])
    other.on("forward", -1)  # evaluation
    other.on("forward", 0)
    assert events == [] and other_events == [] and recorder.delays == []


def test_cuda_error_reads_like_a_device_failure():
    injector, events, _ = make_injector([{"kind": "cuda_error", "rank": 0, "step": 2, "phase": "backward"}])
    injector.on("backward", 1)
    with pytest.raises(RuntimeError) as error:
        injector.on("backward", 2)
    assert not isinstance(error.value, InjectedFault)
    assert str(error.value).startswith("CUDA error: an illegal memory access was encountered")
    assert CUDA_ERROR_MESSAGE in str(error.value) and "rank 0, step 2" in str(error.value)
    assert events[0]["kind"] == "cuda_error" and events[0]["phase"] == "backward"


def test_fixed_slow_compute_delays_every_task_of_its_steps_inside_the_clock():
    injector, events, recorder = make_injector(
        [{"kind": "slow_compute", "rank": 0, "start": 2, "end": 3, "seconds": 0.25}])
    for step in range(1, 6):
        run_step(injector, step, microbatches=2)
    # 2 forwards + 2 backwards in each of steps 2 and 3; no measurement: each in the main part
    assert recorder.delays == [("student_fwd", 0.25, False)] * 2 + [("student_bwd", 0.25, False)] * 2 + \
        [("student_fwd", 0.25, False)] * 2 + [("student_bwd", 0.25, False)] * 2
    assert [(e["event"], e["step"]) for e in events] == [("fault_injected", 2), ("fault_cleared", 4)]
    assert events[1]["reason"] == "end_step" and events[0]["phases"] == ["forward", "backward", "probe"]


def test_a_phase_restricted_slowdown_only_delays_that_phase():
    injector, _, recorder = make_injector(
        [{"kind": "slow_compute", "rank": 0, "step": 2, "seconds": 0.1, "phase": "backward"}])
    for step in (1, 2, 3):
        run_step(injector, step, microbatches=3)
    assert recorder.delays == [("student_bwd", 0.1, False)] * 3


def test_factor_slowdown_scales_the_previous_steps_own_task_time_split_over_parts():
    # The clock measured, for the previous step of 2 micro-batches, teacher 0.2 s, student 0.6 s forward.
    timing = {"teacher_fwd": 0.2, "student_fwd": 0.6, "loss": 0.0, "student_bwd": 1.0, "comm": 0.5}
    injector, _, recorder = make_injector([{"kind": "slow_compute", "rank": 0, "start": 2, "factor": 3.0}],
                                          timing=timing)
    run_step(injector, 1, microbatches=2)
    assert recorder.delays == []
    run_step(injector, 2, microbatches=2)
    forward = [(n, pytest.approx(s), h) for n, s, h in [("teacher_fwd", 0.2, False), ("student_fwd", 0.6, False)]]
    assert recorder.delays == forward * 2 + [("student_bwd", pytest.approx(1.0), False)] * 2


def test_factor_slowdown_does_not_compound_its_own_injected_time():
    timing: dict[str, float] = {"teacher_fwd": 0.0, "student_fwd": 0.2, "loss": 0.0, "student_bwd": 0.2}
    injector, _, recorder = make_injector(
        [{"kind": "slow_compute", "rank": 0, "start": 2, "factor": 2.0, "phase": "forward"}], timing=timing)
    run_step(injector, 1, microbatches=1)
    run_step(injector, 2, microbatches=1)  # injects 0.2 s into student_fwd ...
    timing["student_fwd"] = 0.4  # ... which the clock then measures as part of step 2
    run_step(injector, 3, microbatches=1)
    assert [s for _, s, _ in recorder.delays] == pytest.approx([0.2, 0.2])


def test_ramp_through_the_injector_grows_linearly():
    timing = {"teacher_fwd": 0.0, "student_fwd": 0.1, "loss": 0.0, "student_bwd": 0.0}
    injector, _, recorder = make_injector(
        [{"kind": "slow_compute", "rank": 0, "start": 2, "factor": 5.0, "ramp_steps": 4, "phase": "forward"}],
        timing=timing)
    for step in range(1, 9):
        before = len(recorder.delays)
        run_step(injector, step, microbatches=1)
        # what the stage clock would measure: the task's own 0.1 s plus what was injected into it
        timing["student_fwd"] = 0.1 + sum(s for _, s, _ in recorder.delays[before:])
    # factor 2, 3, 4, 5, 5, 5 over steps 3..8 (level 0 at the start step 2 injects nothing)
    assert [s for _, s, _ in recorder.delays] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_intermittent_slowdown_acts_in_on_periods_only():
    injector, events, recorder = make_injector(
        [{"kind": "slow_compute", "rank": 0, "start": 2, "end": 9, "seconds": 1.0, "phase": "forward",
          "on_steps": 2, "off_steps": 2}])
    delayed_steps = []
    for step in range(1, 12):
        before = len(recorder.delays)
        run_step(injector, step, microbatches=1)
        if len(recorder.delays) > before:
            delayed_steps.append(step)
    assert delayed_steps == [2, 3, 6, 7]
    assert [(e["event"], e["step"]) for e in events] == [("fault_injected", 2), ("fault_cleared", 10)]


def test_slow_comm_holds_the_sends_outside_the_clock():
    injector, _, recorder = make_injector([{"kind": "slow_comm", "rank": 0, "start": 2, "end": 2, "seconds": 0.05}])
    for step in (1, 2, 3):
        run_step(injector, step, microbatches=2)
    assert recorder.delays == [(None, 0.05, True)] * 4  # 2 forward + 2 backward sends of step 2


class FakeLoad:
    def __init__(self):
        self.calls: list[str] = []
        self.pids = [12345]

    def start(self):
        self.calls.append("start")

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")

    def stop(self):
        self.calls.append("stop")


def test_background_load_starts_pauses_and_stops_on_its_steps():
    loads: dict[int, FakeLoad] = {}
    injector, events, _ = make_injector([{"kind": "background_load", "rank": 0, "start": 2, "end": 6,
                                          "on_steps": 2, "off_steps": 1}], loads=loads)
    assert loads[0].calls == []  # spawned (waiting) when the injector is built
    for step in range(1, 9):
        run_step(injector, step)
    # on 2,3 / off 4 / on 5,6 / cleared at 7
    assert loads[0].calls == ["start", "resume", "pause", "resume", "resume", "stop"]
    assert [(e["event"], e["step"]) for e in events] == [("fault_injected", 2), ("fault_cleared", 7)]
    assert events[0]["load_pids"] == [12345]


def test_close_clears_active_faults_and_stops_loads_that_never_started():
    loads: dict[int, FakeLoad] = {}
    injector, events, _ = make_injector([
        {"kind": "background_load", "rank": 0, "start": 2},
        {"kind": "background_load", "rank": 0, "start": 50},
        {"kind": "slow_compute", "rank": 0, "start": 2, "seconds": 0.01}], loads=loads)
    for step in (1, 2, 3):
        run_step(injector, step)
    injector.close()
    injector.close()  # idempotent
    assert loads[0].calls == ["start", "resume", "stop"] and loads[1].calls == ["stop"]
    cleared = [e for e in events if e["event"] == "fault_cleared"]
    assert [(e["fault_index"], e["reason"], e["step"]) for e in cleared] == [(0, "worker_exit", 3),
                                                                             (2, "worker_exit", 3)]
    injector.on("forward", 4)  # a closed injector does nothing
    assert len(events) == 4


def test_a_background_load_without_a_factory_is_refused():
    with pytest.raises(InjectionError, match="needs a load factory"):
        FaultInjector(parse_faults([{"kind": "background_load", "rank": 0, "start": 2}], 1), 0)


def test_several_faults_in_one_run_each_fire_on_their_own_schedule():
    specs = [{"kind": "slow_compute", "rank": 1, "start": 2, "end": 3, "seconds": 0.1, "phase": "forward"},
             {"kind": "slow_comm", "rank": 1, "start": 3, "end": 4, "seconds": 0.2},
             {"kind": "raise", "rank": 1, "step": 5, "phase": "optimizer"}]
    injector, events, recorder = make_injector(specs, rank=1)
    with pytest.raises(InjectedFault):
        for step in range(1, 7):
            run_step(injector, step, microbatches=1)
    assert [(e["event"], e["fault_index"], e["step"]) for e in events] == [
        ("fault_injected", 0, 2), ("fault_injected", 1, 3), ("fault_cleared", 0, 4), ("fault_cleared", 1, 5),
        ("fault_injected", 2, 5)]
    assert [(n, s) for n, s, _ in recorder.delays] == [("student_fwd", 0.1), ("student_fwd", 0.1), (None, 0.2),
                                                       (None, 0.2), (None, 0.2), (None, 0.2)]


def test_fired_fault_indices_reads_the_event_log():
    events = [{"event": "fault_injected", "fault_index": 2}, {"event": "fault_cleared", "fault_index": 0},
              {"event": "rank_dead", "rank": 1}, {"event": "fault_injected", "fault_index": 0}]
    assert fired_fault_indices(events) == {0, 2}


# ------------------------------------------------------------------ slowdown parts
def test_task_baseline_needs_a_measured_previous_step():
    baseline = TaskBaseline()
    timing = {"teacher_fwd": 0.3, "student_fwd": 0.3, "loss": 0.0}
    assert baseline.per_task("forward", 2, timing) is None
    for _ in range(3):
        baseline.count_task("forward", 1)
    baseline.add_injected(1, "student_fwd", 0.15)
    assert baseline.per_task("forward", 2, timing) == pytest.approx(
        {"teacher_fwd": 0.1, "student_fwd": 0.05, "loss": 0.0})
    assert baseline.per_task("forward", 2, {"teacher_fwd": 1.0}) is None  # parts missing


def test_split_extra_is_proportional_and_falls_back_to_the_main_part():
    assert split_extra("forward", 0.0, None) == {}
    assert split_extra("backward", 0.4, None) == {"student_bwd": 0.4}
    assert split_extra("forward", 1.0, {"teacher_fwd": 0.1, "student_fwd": 0.3, "loss": 0.0}) == pytest.approx(
        {"teacher_fwd": 0.25, "student_fwd": 0.75})


def test_device_delay_sleeps_on_cpu_and_skips_nothing_to_do():
    slept: list[float] = []
    delay = DeviceDelay("cpu", sleep=slept.append)
    delay(0.2)
    delay(0.0)
    delay(0.1, host_only=True)
    assert slept == [0.2, 0.1]


# ------------------------------------------------------------------ the event log
def test_event_log_appends_whole_records_and_reads_them_back(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", source="test")
    first = log.append("fault_injected", rank=2, step=5)
    log.write({"event": "rank_dead", "rank": 1, "path": tmp_path})
    records = read_events(tmp_path / "events.jsonl")
    assert records[0] == first and first["source"] == "test" and first["time"] > 0
    assert records[1]["path"] == str(tmp_path)
    assert read_events(tmp_path / "events.jsonl", "rank_dead", rank=1) == [records[1]]
    assert read_events(tmp_path / "missing.jsonl") == []


def test_event_log_needs_an_event_name(tmp_path):
    with pytest.raises(EventLogError, match="needs a non-empty 'event' name"):
        EventLog(tmp_path / "e.jsonl").write({"rank": 1})


def test_reader_skips_a_torn_last_line_and_rejects_garbage(tmp_path):
    path = tmp_path / "failover_events.jsonl"
    path.write_text('{"event": "a"}\n{"event": "b", "ra')
    assert [r["event"] for r in read_events(tmp_path)] == ["a"]  # a run directory works too
    path.write_text('{"event": "a"}\nnot json\n')
    with pytest.raises(EventLogError, match=r"failover_events.jsonl:2 is not JSON"):
        read_events(path)


def test_concurrent_writers_never_interleave_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = textwrap.dedent(f"""
        import sys
        from synapse.rundir.events import EventLog
        log = EventLog({str(path)!r})
        for i in range(300):
            log.append("tick", writer=int(sys.argv[1]), i=i, padding="x" * 2000)
    """)
    processes = [subprocess.Popen([sys.executable, "-c", writer, str(w)], cwd=REPO) for w in range(3)]
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    records = read_events(path)
    assert len(records) == 900
    for w in range(3):
        assert [r["i"] for r in records if r["writer"] == w] == list(range(300))


# ------------------------------------------------------------------ real processes
def test_cpu_core_mapping_wraps_around_the_available_cores():
    assert [cpu_core_for_rank(r, {4, 6, 9}) for r in range(5)] == [4, 6, 9, 4, 6]


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def wait_until(condition, timeout_s: float, every_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return condition()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.slow  # a load process that burns a core for a while
@pytest.mark.timeout(60)
def test_background_load_burns_the_pinned_core_only_after_go_and_stops():
    core = sorted(os.sched_getaffinity(0))[-1]
    load = BackgroundLoad(LoadTarget("cpu", core), workers=1)
    (pid,) = load.pids
    try:
        time.sleep(0.5)  # started, waiting for go
        idle_before = cpu_ticks(pid)
        time.sleep(0.5)
        assert cpu_ticks(pid) - idle_before <= 2, "a waiting load must not use the CPU"
        load.start()
        assert wait_until(lambda: os.sched_getaffinity(pid) == {core}, 5)
        busy_before = cpu_ticks(pid)
        time.sleep(1.0)
        assert cpu_ticks(pid) - busy_before >= 10, "the load did not burn CPU on its core"
        load.pause()
        assert wait_until(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", 5)
        load.resume()
    finally:
        load.stop()
    assert load.processes[0].process.returncode is not None


WORKER = textwrap.dedent("""
    import os, sys, time
    from synapse.injection.injector import build_fault_injector
    injector = build_fault_injector(
        [{"kind": "background_load", "rank": 1, "start": 2, "end": 3}], rank=1, world_size=2,
        run_dir=sys.argv[1], device="cpu", local_rank=1)
    injector.on("step_start", 1)
    injector.on("step_start", 2)
    print(sorted(os.sched_getaffinity(0)), flush=True)
    sys.stdin.readline()          # the test inspects the load, then says how to end
    mode = sys.stdin.readline().strip()
    if mode == "finish":
        injector.on("step_start", 4)
    elif mode == "die":
        os.kill(os.getpid(), 9)
""")


def start_worker(run_dir: Path) -> tuple[subprocess.Popen, list[int], int]:
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(run_dir)], cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pinned = json.loads(worker.stdout.readline())
    (started,) = read_events(run_dir, "fault_injected")
    return worker, started["load_pids"], pinned


@pytest.mark.slow  # a worker process and its load
@pytest.mark.timeout(60)
def test_worker_and_its_load_share_the_ranks_core_and_the_load_stops_at_the_end_step(tmp_path):
    worker, pids, pinned = start_worker(tmp_path)
    expected_core = cpu_core_for_rank(1)
    assert pinned == [expected_core]
    assert all(os.sched_getaffinity(pid) == {expected_core} for pid in pids)
    worker.stdin.write("\nfinish\n")
    worker.stdin.flush()
    assert worker.wait(timeout=30) == 0
    assert all(wait_until(partial(gone, pid), 5) for pid in pids)
    cleared = read_events(tmp_path, "fault_cleared")
    assert [(e["step"], e["reason"]) for e in cleared] == [(4, "end_step")]


@pytest.mark.slow  # a worker process and its load
@pytest.mark.timeout(60)
def test_a_load_dies_with_its_sigkilled_worker(tmp_path):
    worker, pids, _ = start_worker(tmp_path)
    assert all(not gone(pid) for pid in pids)
    worker.stdin.write("\ndie\n")
    worker.stdin.flush()
    assert worker.wait(timeout=30) == -signal.SIGKILL
    assert all(wait_until(partial(gone, pid), 10) for pid in pids), "an orphan load outlived its worker"


KILL_OR_HANG = textwrap.dedent("""
    import sys
    from synapse.injection.injector import build_fault_injector
    injector = build_fault_injector([{"kind": sys.argv[2], "rank": 0, "step": 2, "phase": "backward"}],
                                    rank=0, world_size=1, run_dir=sys.argv[1])
    for step in (1, 2, 3):
        injector.on("forward", step)
        injector.on("backward", step)
        print("survived step", step, flush=True)
""")


@pytest.mark.slow  # a worker process
@pytest.mark.timeout(60)
def test_kill_sigkills_the_worker_after_recording_the_event(tmp_path):
    worker = subprocess.run([sys.executable, "-c", KILL_OR_HANG, str(tmp_path), "kill"], cwd=REPO,
                            capture_output=True, text=True, timeout=50)
    assert worker.returncode == -signal.SIGKILL
    assert worker.stdout.splitlines() == ["survived step 1"]
    (event,) = read_events(tmp_path)
    assert (event["event"], event["kind"], event["step"], event["phase"], event["pid"]) == (
        "fault_injected", "kill", 2, "backward", event["pid"])


@pytest.mark.slow  # a worker process
@pytest.mark.timeout(60)
def test_hang_blocks_the_worker_alive_in_its_phase(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", KILL_OR_HANG, str(tmp_path), "hang"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "survived step 1"
        assert wait_until(lambda: read_events(tmp_path, "fault_injected"), 20)
        time.sleep(1.0)
        assert worker.poll() is None, "a hung worker must stay alive"
    finally:
        worker.kill()
    assert worker.stdout.read() == ""  # never got past step 2's backward
    assert worker.wait() == -signal.SIGKILL


# ------------------------------------------------------------------ the start probe
def test_a_factor_slowdown_from_step_1_slows_the_start_probe_s_rounds_and_the_steps_after():
    """The probe (before the launch's first step) times its fixed work; a device f times slow takes f
    times as long on it: (f - 1) x the round's work added. Step 1's tasks have nothing measured before
    them (the warm-up); from step 2 the tasks are scaled as always."""
    (spec,) = parse_faults([{"kind": "slow_compute", "rank": 0, "start": 1, "factor": 1.5}], world_size=3)
    assert spec.phases == ("forward", "backward", "probe")
    injector, events, recorder = make_injector([{"kind": "slow_compute", "rank": 0, "start": 1, "factor": 1.5}],
                                               timing={"step": 1, "teacher_fwd": 0.0, "student_fwd": 0.2,
                                                       "loss": 0.0, "student_bwd": 0.4})
    assert [injector.slow_probe(1, 0.002) for _ in range(3)] == [pytest.approx(0.001)] * 3
    assert recorder.delays == [(None, pytest.approx(0.001), False)] * 3  # outside the stage clock
    assert [(e["event"], e["step"], e["phase"]) for e in events] == [("fault_injected", 1, "probe")]
    run_step(injector, 1, microbatches=1)
    run_step(injector, 2, microbatches=1)  # step 1 measured (the clock's timing above): step 2 is scaled
    assert [part for part, seconds, _ in recorder.delays[-2:] if seconds > 0] == ["student_fwd", "student_bwd"]
    assert len(events) == 1  # one fault, injected once


def test_only_the_compute_slowdowns_acting_at_the_launch_s_first_step_slow_the_probe():
    specs = [{"kind": "slow_compute", "rank": 0, "start": 5, "factor": 2.0},  # not yet
             {"kind": "slow_compute", "rank": 0, "start": 1, "seconds": 0.3, "phase": "forward"},  # not the probe
             {"kind": "slow_comm", "rank": 0, "start": 1, "seconds": 0.5},  # a link
             {"kind": "slow_compute", "rank": 1, "start": 1, "factor": 2.0}]  # another rank
    injector, _, recorder = make_injector(specs)
    assert injector.slow_probe(1, 0.01) == 0.0 and recorder.delays == []
    later, _, recorder = make_injector([specs[0]])
    assert later.slow_probe(6, 0.01) == pytest.approx(0.01)  # a relaunch at step 6: the device is slow now
    fixed, _, recorder = make_injector([{"kind": "slow_compute", "rank": 0, "start": 1, "seconds": 0.05}])
    assert fixed.slow_probe(1, 0.01) == pytest.approx(0.05)  # seconds: per task, each round one
