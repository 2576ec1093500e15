"""The supervisor as a process (issue #19's rows "S::" of tests/RELIABILITY.md): the signals that
end it (Ctrl-C and SIGTERM stop the workers with a checkpoint, a second Ctrl-C aborts, and on a
SIGKILL of the supervisor alone its workers die with it), the lock that keeps a second
supervisor out of its run directory, what a resumed supervisor records, and a failover
controller that fails inside it.

Real runs as in test_reliability.py, whose helpers and leftover-process check are reused.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synapse import checkpoint as ckpt
from synapse.app import run
from synapse.failover import FailoverController, FailoverError, compose_segment_config, read_segments
from synapse.health import pid_alive, read_heartbeats
from synapse.rundir import RunDirInUseError, read_jsonl
from tests.conftest import repo_env

from .helpers import assert_identical_states, final_student_state, plant_heartbeat
from .test_reliability import (  # noqa: F401  (the fixtures apply here too; no_leftover_processes is autouse)
    REPO_ROOT,
    STEPS,
    assert_restarted_supervisor_continued,
    events,
    no_leftover_processes,
    overrides_for,
    reference,
    reference_run,
    run_overrides,
    steps_done,
    train_py,
    wait_until,
)

pytestmark = [pytest.mark.dist]


# ------------------------------------------------ signals: Ctrl-C, SIGTERM, and SIGKILL of the supervisor alone
def wait_for_step(run_dir: Path, proc, step: int, timeout: float = 200) -> None:
    wait_until(lambda: steps_done(run_dir) >= step, proc, timeout, f"step {step}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, whom", [(signal.SIGINT, "group"),
                                          pytest.param(signal.SIGTERM, "supervisor", marks=pytest.mark.long)],
                         ids=["ctrl_c_to_the_terminal_group", "sigterm_to_the_supervisor"])
def test_an_interrupt_checkpoints_at_the_next_step_and_resumes(tmp_path, teacher_file, reference, signum, whom):
    run_dir = tmp_path / "run"
    args = overrides_for(run_dir, teacher_file, "policy=keep", "checkpoint.every=100",  # no periodic checkpoint
                         "injection.faults=[{kind:slow_compute,rank:0,start:3,seconds:0.1}]")
    first = train_py(run_dir, args)
    try:
        wait_for_step(run_dir, first, 3)
        if whom == "group":  # a terminal's Ctrl-C reaches every process of the foreground group
            os.killpg(first.pid, signum)
        else:
            os.kill(first.pid, signum)
        assert first.wait(120) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    log = (tmp_path / "run.train_py.log").read_text()
    (segment,) = read_segments(run_dir)
    assert segment.outcome == "interrupted" and segment.end_step is not None, (segment, log[-3000:])
    assert 3 <= segment.end_step < STEPS
    saved = [r.step for r in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert saved == [segment.end_step], "the interrupt wrote a checkpoint of the last finished step"
    assert f"interrupted by {signal.Signals(signum).name}" in log and "resume=auto" in log, log[-3000:]
    second = train_py(run_dir, [*args, "resume=auto"])
    assert second.wait(240) == 0, (tmp_path / "run.train_py.log").read_text()[-3000:]
    assert read_segments(run_dir)[-1].start_step == segment.end_step
    assert_identical_states(final_student_state(run_dir), reference)


@pytest.mark.timeout(120)
@pytest.mark.long  # 17 s; the first Ctrl-C's checkpoint-and-resume stays in the default suite
def test_a_second_ctrl_c_aborts_at_once(tmp_path, teacher_file):
    run_dir = tmp_path / "run"
    # Steps 3+ take ~2 s each: the first Ctrl-C's stop waits for the step in flight, the second does not.
    args = overrides_for(run_dir, teacher_file, "policy=keep",
                         "injection.faults=[{kind:slow_compute,rank:0,start:3,seconds:0.25}]")
    first = train_py(run_dir, args)
    try:
        wait_for_step(run_dir, first, 2)
        os.killpg(first.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(first.pid, signal.SIGINT)
        first.wait(60)
        steps = steps_done(run_dir)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode != 0
    assert steps < STEPS


@pytest.mark.extended  # the supervisor killed alone; its whole group killed is test_reliability's
@pytest.mark.timeout(300)
def test_workers_die_with_their_supervisor_and_resume_continues(tmp_path, teacher_file, reference):
    run_dir = tmp_path / "run"
    args = overrides_for(run_dir, teacher_file, "policy=keep",
                         "injection.faults=[{kind:slow_compute,rank:0,start:4,seconds:0.05}]")
    first = train_py(run_dir, args)
    try:
        wait_for_step(run_dir, first, 4)
        workers = {b["pid"] for b in read_heartbeats(run_dir).values()}
        os.kill(first.pid, signal.SIGKILL)  # only train.py (the OOM killer's choice), not its process group
        first.wait(30)
        deadline = time.monotonic() + 20
        while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = sorted(p for p in workers if pid_alive(p))
        assert not survivors, f"workers {survivors} outlived their supervisor"
        steps_when_killed = steps_done(run_dir)
        time.sleep(1.0)
        assert steps_done(run_dir) == steps_when_killed, "nobody trains on after the supervisor died"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    (interrupted,) = read_segments(run_dir)
    assert interrupted.outcome is None  # the supervisor died before it could say how the segment ended
    second = train_py(run_dir, [*args, "resume=auto"])
    assert second.wait(240) == 0, (tmp_path / "run.train_py.log").read_text()[-3000:]
    assert_restarted_supervisor_continued(run_dir, steps_when_killed)
    assert_identical_states(final_student_state(run_dir), reference)


# ---------------------------------------------------------------- one run directory, one supervisor
@pytest.mark.timeout(300)
@pytest.mark.long  # 64 s of real runs; the default suite ran 20:10 here (the run lock's unit tests stay in it)
def test_a_second_run_in_the_same_directory_is_refused_at_start(tmp_path, teacher_file, reference):
    run_dir = tmp_path / "run"
    # From step 2 to 7, rank 0 is slowed (1 s per task: ~8 s a step) so the first run is still
    # training while the others start and are refused (~40 s for two launches); then it runs at
    # speed to the end. policy=keep: a delay, not a reason to re-plan.
    args = overrides_for(run_dir, teacher_file, "policy=keep",
                         "injection.faults=[{kind:slow_compute,rank:0,start:2,end:7,seconds:1.0}]")
    first = train_py(run_dir, args)
    try:
        wait_for_step(run_dir, first, 2)
        for extra in ([], ["resume=auto"]):  # a second run, and a resume of the running one
            second = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *args, *extra,
                                     f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, capture_output=True, text=True,
                                    timeout=120, env=repo_env())
            assert first.poll() is None, "the first run ended before the second started: nothing was tested"
            assert second.returncode != 0
            assert (f"run directory {run_dir} is in use: another Synapse supervisor (pid {first.pid}"
                    in second.stderr), second.stderr[-3000:]
            assert "Fix:" in second.stderr
        assert steps_done(run_dir) < STEPS, "the first run was still training"
        assert first.wait(240) == 0, (tmp_path / "run.train_py.log").read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    assert [s.outcome for s in read_segments(run_dir)] == ["finished"]
    assert_identical_states(final_student_state(run_dir), reference)


WORKER_HOLDING_THE_DIR = """
import sys, time
from pathlib import Path
from synapse.rundir.lock import hold_as_worker
hold_as_worker(Path(sys.argv[1]))
print("holding", flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(120)
def test_resume_is_refused_while_workers_of_an_earlier_run_hold_the_directory(tmp_path, teacher_file):
    # A worker left alive (here: a process holding the workers' lock, as every worker does) while
    # its supervisor is gone: resume=auto must not race it.
    worker = subprocess.Popen([sys.executable, "-c", WORKER_HOLDING_THE_DIR, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env=repo_env())
    try:
        assert worker.stdout.readline().strip() == "holding"
        plant_heartbeat(tmp_path, 0, worker.pid)
        with pytest.raises(RunDirInUseError) as refused:
            run_overrides(overrides_for(tmp_path, teacher_file, "resume=auto"))
        message = str(refused.value)
        assert "workers of an earlier run still hold" in message and f"kill {worker.pid}" in message, message
    finally:
        worker.kill()
        worker.wait()
    assert not (tmp_path / "logs").exists(), "refused before anything started"


# ---------------------------------------------------------------- what a resumed supervisor records
@pytest.mark.timeout(240)
def test_resume_by_path_into_a_new_directory_records_where_it_started(tmp_path, teacher_file, reference):
    first, second = tmp_path / "first", tmp_path / "second"
    run_overrides([*overrides_for(first, teacher_file, "policy=keep"), "trainer.stop_after=4"])
    step_4 = first / "checkpoints" / ckpt.step_dir_name(4)
    summary = run_overrides(overrides_for(second, teacher_file, "policy=keep", f"resume={step_4}"))
    (segment,) = read_segments(second)
    assert segment.start_step == 4 and segment.end_step == STEPS, segment
    assert summary["experiment"]["segments"][0]["start_step"] == 4
    assert_identical_states(final_student_state(second), reference)


@pytest.mark.timeout(300)
def test_a_resumed_supervisor_keeps_the_earlier_restarts_in_its_summary(tmp_path, teacher_file, reference):
    overrides = overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:kill,rank:1,step:3,phase:forward}]")
    # Each launch stops after 3 steps: segment 0 dies at step 3, segment 1 (from checkpoint 2) ends at step 5.
    first = run_overrides([*overrides, "trainer.stop_after=3"])
    (restart,) = first["experiment"]["restarts"]
    assert restart["trigger"] == "failure"
    resumed = run_overrides([*overrides, "resume=auto"])
    restarts = resumed["experiment"]["restarts"]
    assert restarts[:1] == [restart], "the earlier supervisor's restart is kept"
    stored = json.loads((tmp_path / "experiment_summary.json").read_text())["restarts"]
    assert stored[:1] == [restart]
    assert_identical_states(final_student_state(tmp_path), reference)


# ---------------------------------------------------------------- the failover controller fails inside it
@pytest.mark.timeout(240)
def test_a_controller_error_stops_the_workers_at_once_with_a_checkpoint(tmp_path, teacher_file, reference,
                                                                          monkeypatch):
    # A bug in the controller (injected into the supervisor, which runs in this process): at step 3
    # observe() raises. Failover is then off; the run must say so at once and stop safely.
    real_observe = FailoverController.observe

    def broken_observe(self, record):
        if record["step"] == 3:
            raise ZeroDivisionError("injected controller bug")
        return real_observe(self, record)

    monkeypatch.setattr(FailoverController, "observe", broken_observe)
    lines: list[str] = []
    overrides = overrides_for(tmp_path, teacher_file, "policy=keep",
                              "injection.faults=[{kind:slow_compute,rank:0,start:3,seconds:0.05}]")
    with pytest.raises(FailoverError, match="controller failed during segment 0 at step 3: ZeroDivisionError"):
        run(compose_segment_config(overrides), log=lines.append, overrides=overrides)
    (failed,) = events(tmp_path, "controller_failed")
    assert failed["step"] == 3 and "injected controller bug" in failed["error"]
    assert any("the controller failed at step 3" in line for line in lines), lines
    trained = [r["step"] for r in read_jsonl(tmp_path / "performance.jsonl")]
    assert max(trained) < STEPS, f"the workers trained on unprotected to step {max(trained)}"
    (segment,) = read_segments(tmp_path)
    assert segment.outcome == "error" and segment.end_step == max(trained)
    stopped_at = [r.step for r in ckpt.list_checkpoints(tmp_path / "checkpoints")][-1]
    assert stopped_at == max(trained), "the stop wrote a checkpoint of the last step"
    monkeypatch.setattr(FailoverController, "observe", real_observe)
    run_overrides([*overrides, "resume=auto"])
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(240)
def test_a_corrupt_controller_state_is_named_with_its_path_and_fix(tmp_path, teacher_file, reference):
    overrides = overrides_for(tmp_path, teacher_file, "policy=keep")
    run_overrides([*overrides, "trainer.stop_after=4"])  # a run interrupted at step 4, its segment history kept
    state = tmp_path / "failover" / "controller_state.json"
    assert state.is_file()
    state.write_text(state.read_text()[: len(state.read_text()) // 2])  # cut short (a crash mid-write, bit rot)
    with pytest.raises(ValueError) as refused:
        run_overrides([*overrides, "resume=auto"])
    message = str(refused.value)
    assert str(state) in message and "Fix: delete it and rerun with resume=auto" in message, message
    assert not (tmp_path / "logs" / "launch_1").exists(), "refused before any worker started"
    state.unlink()
    run_overrides([*overrides, "resume=auto"])
    assert_identical_states(final_student_state(tmp_path), reference)
