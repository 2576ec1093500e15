"""Issue #8's fault matrix: what a real run does when ranks die, hang (also inside a live
re-partition) or compute NaN, when the supervisor itself is killed, when checkpoints are damaged or
cannot be written or the disk fills up, and when the workers cannot meet.

Every case is a real run: K gloo ranks started by the elastic launcher under the failover
supervisor (or ``python train.py`` in a subprocess), tiny models, 8 steps. Where a run recovers,
its final student weights and optimizer state are bit-identical to an uninterrupted run on the
same data order (the single-device trainer: the pipeline is proven equal to it in
test_pipeline_equivalence.py): nothing finished is lost. After every test no process started by
it is left (``no_leftover_processes``). Rows of docs/reliability.md ("## Faults") name these tests.
"""
from __future__ import annotations

import contextlib
import errno
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from synapse import checkpoint as ckpt
from synapse.app import run
from synapse.config import ConfigError, validate
from synapse.failover import compose_segment_config, read_segments
from synapse.health import pid_alive, read_heartbeats
from synapse.launch import RendezvousSetupError, WorkerFailure, elastic, root_cause
from synapse.pipeline import ProgressBoard, progress_path, read_progress, write_failure
from synapse.rundir import read_events, read_jsonl
from tests.conftest import repo_env

from .helpers import BASE_OVERRIDES, assert_identical_states, final_student_state

pytestmark = [pytest.mark.dist]
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def quiet(message: str) -> None:
    """The runs' console lines are not needed: the tests read their records."""


# ---------------------------------------------------------------- runs
def overrides_for(run_dir: Path, teacher_file: Path, *extra: str, devices: int = 3) -> list[str]:
    """A tiny 8-step run on ``devices`` CPU ranks, checkpointed every 2 steps. The profile cache is
    the session's SYNAPSE_CACHE, so the failover planner profiles the models once per session."""
    return [*BASE_OVERRIDES, f"trainer.max_steps={STEPS}", f"run_dir={run_dir}", f"teacher.checkpoint={teacher_file}",
            f"trainer.devices={devices}", "checkpoint.every=2", "report=false", *extra]


def run_overrides(overrides: list[str]) -> dict:
    return run(compose_segment_config(overrides), log=quiet, overrides=overrides)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, teacher_file) -> Path:
    """The uninterrupted run (single device, same data order)."""
    run_dir = tmp_path_factory.mktemp("reference")
    run_overrides(overrides_for(run_dir, teacher_file, devices=1))
    return run_dir


@pytest.fixture(scope="module")
def reference(reference_run):
    """The uninterrupted run's final student weights and optimizer state."""
    return final_student_state(reference_run)


def events(run_dir: Path, name: str, **match) -> list[dict]:
    return read_events(run_dir / "failover_events.jsonl", name, **match)


def fired(run_dir: Path) -> list[tuple]:
    return [(e["kind"], e["rank"], e["step"], e["phase"]) for e in events(run_dir, "fault_injected")]


# ---------------------------------------------------------------- processes
def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every process, from /proc (no psutil needed)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def live_descendants(root: int) -> set[int]:
    table = process_table()
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        found.update(children)
        frontier.extend(children)
    return {pid for pid in found if table.get(pid, (0, 0, "Z"))[2] not in ("Z", "X")}


def session_helpers() -> set[int]:
    """Long-lived helpers of this pytest process, not of any one run: the fork server the launcher
    forks workers from, and multiprocessing's resource tracker."""
    pids = {getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
            getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)}
    return {pid for pid in pids if pid}


def describe(pids: set[int]) -> list[str]:
    lines = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            lines.append(f"{pid}: {command[:200]!r}")
    return lines


def in_group(pgid: int) -> set[int]:
    return {pid for pid, (_, group, state) in process_table().items() if group == pgid and state not in ("Z", "X")}


def started_here() -> set[int]:
    """This process's live descendants, and the members of its process group: a process whose
    parent died (a killed rank's data loader workers) is no one's descendant any more, but it
    keeps its process group."""
    return (live_descendants(os.getpid()) | in_group(os.getpgid(0))) - {os.getpid()}


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """No test may leave a worker (or anything else it started) running, orphans included."""
    before = started_here()
    yield
    deadline = time.monotonic() + 15.0  # the agent reaps its workers right after a launch ends
    while True:
        left = started_here() - before - session_helpers()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes left behind: {describe(left)}"


# ---------------------------------------------------------------- rank failures
@pytest.mark.timeout(240)
@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_rank_killed_in_a_phase_resumes_on_the_survivors_and_loses_nothing(tmp_path, teacher_file, reference,
                                                                            phase):
    summary = run_overrides(overrides_for(tmp_path, teacher_file,
                                          f"injection.faults=[{{kind:kill,rank:1,step:5,phase:{phase}}}]"))
    assert fired(tmp_path) == [("kill", 1, 5, phase)]
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"]
    assert segments[1].devices == [0, 2], "the killed rank's device leaves the pipeline"
    assert segments[1].start_step == 4, "resume from the last checkpoint before the kill"
    (restart,) = summary["experiment"]["restarts"]
    assert restart["trigger"] == "failure" and restart["action"] == "degrade"
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(240)
def test_a_killed_rank_takes_its_data_loader_workers_with_it(tmp_path, teacher_file, reference):
    # With data.num_workers > 0 the first and last ranks read through DataLoader worker processes;
    # when such a rank is SIGKILLed they must not live on as orphans (each holds a copy of the
    # data set; the fixture above finds them by process group).
    run_overrides(overrides_for(tmp_path, teacher_file, "data.num_workers=2",
                                "injection.faults=[{kind:kill,rank:0,step:5,phase:forward}]"))
    assert [s.outcome for s in read_segments(tmp_path)] == ["failed", "finished"]
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(240)
def test_rank_killed_while_writing_a_checkpoint_leaves_the_previous_one_in_use(tmp_path, teacher_file, reference):
    # Rank 0 commits checkpoints; it dies after writing its files of step 4, before any commit.
    run_overrides(overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:kill,rank:0,step:4,"
                                                        "phase:checkpoint_write}]"))
    assert fired(tmp_path) == [("kill", 0, 4, "checkpoint_write")]
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"] and segments[1].devices == [1, 2]
    assert segments[1].start_step == 2, "the half-written step 4 is not a checkpoint: step 2 is used"
    assert ckpt.read_manifest(Path(segments[1].resume))["step"] == 2
    saved_in_stage_0 = [e["step"] for e in events(tmp_path, "checkpoint_saved", segment=0)]
    assert saved_in_stage_0 == [2]
    root = tmp_path / "checkpoints"
    assert not list(root.glob("step_*.tmp-*")), "the torn save's directory was cleaned up"
    assert [r.step for r in ckpt.list_checkpoints(root)] == [2, 4, 6, 8]
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(240)
def test_hung_rank_is_found_by_the_watchdog_and_its_device_dropped(tmp_path, teacher_file, reference):
    hang_timeout = 4.0
    # The collective timeout is far longer than the test: the watchdog, not gloo, must end the hang.
    run_overrides(overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:hang,rank:1,step:5,phase:backward}]",
                                f"monitor.hang_timeout_s={hang_timeout}", "monitor.period_s=0.25",
                                "trainer.collective_timeout_s=900"))
    (hang,) = events(tmp_path, "fault_injected")
    hung = events(tmp_path, "rank_hung")
    # Reported once a rank made no progress for hang_timeout (its stall began at its last heartbeat,
    # before the hang fired), and far sooner than the collective timeout would have ended it.
    assert hung and all(e["stalled_s"] >= hang_timeout for e in hung)
    assert hung[0]["time"] - hang["time"] < hang_timeout + 60, "detected by the watchdog, in bounded time"
    # All three ranks stall (the others wait on rank 1); the one blamed is the one that hung.
    (ended,) = events(tmp_path, "segment_ended", segment=0)
    assert ended["cause"] == "rank_hung" and ended["rank"] == 1
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"]
    assert segments[1].devices == [0, 2] and segments[1].start_step == 4
    assert not pid_alive(hang["pid"]), "the hung process was ended"
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(240)
def test_a_stopped_rank_is_the_device_dropped_after_the_stall(tmp_path, teacher_file, reference):
    # An outside matrix SIGSTOPped rank 2 with a 10-s hang timeout: in 3 of 8 runs device 0 was
    # dropped (every board read a wait, and the first rank judged hung was blamed). A real stop here.
    stopped: list[int] = []

    def stop_rank_2_at_step_3() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped:
            beat = read_heartbeats(tmp_path).get(2)
            if beat and beat["step"] >= 3:
                os.kill(beat["pid"], signal.SIGSTOP)
                stopped.append(beat["pid"])
            time.sleep(0.02)

    stopper = threading.Thread(target=stop_rank_2_at_step_3, daemon=True)
    stopper.start()
    run_overrides(overrides_for(tmp_path, teacher_file, "monitor.hang_timeout_s=4", "monitor.period_s=0.25",
                                "trainer.collective_timeout_s=900"))
    stopper.join()
    assert stopped, "rank 2 was never seen at step 3"
    (ended,) = events(tmp_path, "segment_ended", segment=0)
    assert ended["cause"] == "rank_hung" and ended["rank"] == 2, ended
    assert [s.devices for s in read_segments(tmp_path)] == [[0, 1, 2], [0, 1]]
    assert not pid_alive(stopped[0]), "the stopped process was ended"
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(420)
def test_a_stall_whose_culprit_cannot_be_told_is_retried_on_the_same_devices_and_learns_exactly(tmp_path, teacher_file,
                                                                                                  reference):
    # Issue #33, 2: rank 0 SIGSTOPped while it waits for rank 1's gradients early in a step. The monitor
    # judges the rank stalled longest (rank 2, which began the step first: rank 1's slowed backward ends
    # every step late on rank 0) before rank 0 has stalled hang_timeout_s itself, so rank 0 is not yet
    # found stopped, and every board reads a wait: no culprit can be told. Before: the run ended
    # (FailoverError, "rerun with resume=auto"). Now: retried on the same devices from the newest checkpoint.
    run_dir, hang_timeout = tmp_path / "run", 10.0
    stopped: list[tuple[int, int]] = []  # (pid, steps done)

    def stop_rank_0_in_its_first_wait() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not stopped:
            beats = read_heartbeats(run_dir)
            first, last = beats.get(0), beats.get(2)
            board = read_progress(progress_path(run_dir, 0)) if first else None
            # a heartbeat counts the steps done; the board names the step in progress
            if (first and last and board and first["step"] == last["step"] >= 3 and board["step"] == first["step"] + 1
                    and board["pid"] == first["pid"] and board["phase"] == "recv"
                    and board["time"] - first["time"] < 0.5  # its first wait for gradients: forwards still to send
                    and first["time"] - last["time"] >= 0.8):  # began the step well after rank 2 (margin: 3 periods)
                os.kill(first["pid"], signal.SIGSTOP)
                stopped.append((first["pid"], first["step"]))
            time.sleep(0.005)

    stopper = threading.Thread(target=stop_rank_0_in_its_first_wait, daemon=True)
    stopper.start()
    args = [a for a in overrides_for(run_dir, teacher_file, f"monitor.hang_timeout_s={hang_timeout}",
                                     "monitor.period_s=0.25", "trainer.collective_timeout_s=900",
                                     "injection.faults=[{kind:slow_compute,rank:1,start:2,seconds:1.0,"
                                     "phase:backward}]") if a != "report=false"]
    proc = train_py(run_dir, args)
    try:
        code = proc.wait(400)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    stopper.join(5)
    log = (tmp_path / "run.train_py.log").read_text()
    assert stopped, "rank 0 was never seen in its first wait of a step > 3 well after rank 2 began it"
    assert code == 0, log[-4000:]
    (ended,) = events(run_dir, "segment_ended", segment=0)
    if ended["cause"] == "rank_hung" and ended["rank"] == 0:
        # The monitor read rank 0 stalled hang_timeout_s itself (its reading late by more than the 0.8 s
        # margin, as under a loaded suite once in two runs): the right culprit, but not the case under test
        pytest.skip("the monitor's reading came late enough to find rank 0 itself stopped; no retry to check")
    assert ended["cause"] == "rank_hung" and ended["rank"] is None, ended
    (retry,) = events(run_dir, "retry_same_devices")
    assert retry["devices"] == [0, 1, 2] and "no rank can be told" in retry["why"], retry
    segments = read_segments(run_dir)
    assert [s.devices for s in segments] == [[0, 1, 2], [0, 1, 2]], "no device was dropped"
    assert [s.outcome for s in segments] == ["failed", "finished"] and segments[1].reason == "retry"
    # the newest checkpoint (every 2 steps) before the stalled step: step 2 at least (the one of the step just
    # done may be unfinished, as rank 0 stopped right after it)
    resumed = retry["resume_step"]
    assert segments[1].start_step == resumed and resumed % 2 == 0 and 2 <= resumed <= stopped[0][1], (resumed, stopped)
    assert "retrying on the same devices [0, 1, 2]" in log
    assert (run_dir / "report" / "report.md").is_file(), "a run that trained to its end has its report"
    assert not pid_alive(stopped[0][0]), "the stopped process was ended"
    assert_identical_states(final_student_state(run_dir), reference)


@pytest.mark.extended  # a hang found and blamed is test_hung_rank_...; here during a live re-plan
@pytest.mark.timeout(300)
def test_a_hang_during_a_live_replan_drops_the_hung_device(tmp_path, teacher_file, reference):
    # A fire drill re-partitions live at step 3; rank 1 hangs while preparing its blocks. The others
    # wait for it in the re-partition's agreement, so every rank stalls: the one blamed must be 1.
    run_overrides(overrides_for(tmp_path, teacher_file, "failover.replan_mode=live",
                                "failover.drills=[{step:3,action:replan}]",
                                "injection.faults=[{kind:hang,rank:1,step:1,phase:repartition}]",
                                "monitor.hang_timeout_s=4", "monitor.period_s=0.25",
                                "trainer.collective_timeout_s=900"))
    assert [(e["rank"], e["phase"]) for e in events(tmp_path, "fault_injected")] == [(1, "repartition")]
    (ended,) = events(tmp_path, "segment_ended", segment=0)
    assert ended["cause"] == "rank_hung" and ended["rank"] == 1, ended
    stages = read_segments(tmp_path)
    assert stages[0].outcome == "failed" and stages[1].devices == [0, 2], [s.devices for s in stages]
    assert_identical_states(final_student_state(tmp_path), reference)


# ---------------------------------------------------------------- the supervisor killed
def train_py(run_dir: Path, args: list[str]) -> subprocess.Popen:
    """``python train.py`` in its own process group (so it and everything it starts can be killed at once)."""
    with open(run_dir.parent / f"{run_dir.name}.train_py.log", "ab") as log:
        return subprocess.Popen([sys.executable, str(REPO_ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"],
                                cwd=REPO_ROOT, env=repo_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_until(condition, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"train.py exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)


def steps_done(run_dir: Path) -> int:
    path = run_dir / "performance.jsonl"  # one record per finished step
    return len(read_jsonl(path)) if path.exists() else 0


@pytest.mark.timeout(300)
@pytest.mark.long  # 30 s; the default suite keeps test_supervisor's supervisor kill (the workers die
# with it, and the restarted supervisor continues the segment history from the last checkpoint, exactly)
def test_supervisor_killed_and_restarted_continues_its_stages_from_the_last_checkpoint(tmp_path, teacher_file,
                                                                                      reference):
    run_dir = tmp_path / "run"
    # Steps from 5 on are slowed (0.05 s per task, nothing else changes) so the kill lands mid-run;
    # policy=keep: the slowdown is only a delay here, not a reason to re-plan.
    args = overrides_for(run_dir, teacher_file, "policy=keep",
                         "injection.faults=[{kind:slow_compute,rank:0,start:5,seconds:0.05}]")
    first = train_py(run_dir, args)
    try:
        wait_until(lambda: steps_done(run_dir) >= 5, first, 200, "step 5")
        workers = {b["pid"] for b in read_heartbeats(run_dir).values()}
        assert workers and workers <= in_group(first.pid), "the workers share the supervisor's process group"
        os.killpg(first.pid, signal.SIGKILL)  # the supervisor and every worker, at once, mid-step
        first.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while in_group(first.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not in_group(first.pid) and not any(pid_alive(p) for p in workers), "no worker survives its supervisor"
    killed_at = steps_done(run_dir)
    assert killed_at < STEPS, "the run was killed before its end"
    (interrupted,) = read_segments(run_dir)
    assert interrupted.outcome is None

    second = train_py(run_dir, [*args, "resume=auto"])
    assert second.wait(240) == 0, (run_dir.parent / "run.train_py.log").read_text()[-3000:]
    assert_restarted_supervisor_continued(run_dir, killed_at)
    assert_identical_states(final_student_state(run_dir), reference)


def assert_restarted_supervisor_continued(run_dir: Path, killed_at: int) -> None:
    """After ``resume=auto``: segment 1 continues the history, from a checkpoint no later than the kill."""
    segments = read_segments(run_dir)
    assert [s.index for s in segments] == [0, 1], "the segment history continues"
    assert segments[1].reason == "supervisor_restart" and segments[1].outcome == "finished"
    assert segments[1].devices == segments[0].devices == [0, 1, 2]
    resumed = ckpt.read_manifest(Path(segments[1].resume))["step"]
    assert segments[1].start_step == resumed and 2 <= resumed <= killed_at


# ---------------------------------------------------------------- several faults
@pytest.mark.timeout(300)
@pytest.mark.long  # 15 s; the default suite keeps a fault during the recovery from a fault, and 10 random
# sequences of 1-3 faults (test_random_faults_real)
def test_two_faults_in_one_run_each_recovered(tmp_path, teacher_file, reference):
    summary = run_overrides(overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:kill,rank:2,step:3,"
                                          "phase:backward},{kind:cuda_error,rank:0,step:7,phase:forward}]"))
    # Segment 1 runs devices [0, 1]; the CUDA-style error of device 0 fires there as its rank 0.
    assert fired(tmp_path) == [("kill", 2, 3, "backward"), ("cuda_error", 0, 7, "forward")]
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "failed", "finished"]
    assert [s.devices for s in segments] == [[0, 1, 2], [0, 1], [1]]
    assert [s.start_step for s in segments] == [0, 2, 6]
    causes = [r["cause"] for r in summary["experiment"]["restarts"]]
    assert "CUDA error" in causes[1], causes
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(300)
def test_fault_during_recovery_from_a_fault(tmp_path, teacher_file, reference):
    # Rank 1 dies in step 6; the restarted segment redoes steps 5-6 from checkpoint 4, and device 2
    # dies in step 6's optimizer step of that redo (segment 0 never got that far: rank 2 waited on rank 1).
    run_overrides(overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:kill,rank:1,step:6,phase:forward},"
                                                        "{kind:kill,rank:2,step:6,phase:optimizer}]"))
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "failed", "finished"]
    assert [s.devices for s in segments] == [[0, 1, 2], [0, 2], [0]]
    assert [s.start_step for s in segments] == [0, 4, 4], "both recoveries resume from checkpoint 4"
    first, second = events(tmp_path, "fault_injected")
    (relaunch,) = events(tmp_path, "relaunch", segment=1)
    assert first["time"] < relaunch["time"] < second["time"], "the second fault hit the recovering segment"
    assert (second["rank"], second["phase"]) == (1, "optimizer")  # device 2 is rank 1 of segment 1
    assert_identical_states(final_student_state(tmp_path), reference)


# ---------------------------------------------------------------- damaged checkpoints
def flip_byte_in_the_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))  # same size: only the checksum can tell


@pytest.mark.timeout(240)
def test_corrupted_latest_checkpoint_is_skipped_with_an_event_and_the_previous_used(tmp_path, teacher_file,
                                                                                   reference):
    newest = tmp_path / "checkpoints" / ckpt.step_dir_name(6)
    corrupted = threading.Event()

    def corrupt_step_6_once_committed() -> None:  # bit rot between the commit and the failure
        deadline = time.monotonic() + 180
        while not (newest / ckpt.MANIFEST).exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        flip_byte_in_the_middle(newest / "__1_0.distcp")  # rank 1's tensors in DCP storage
        corrupted.set()

    corrupter = threading.Thread(target=corrupt_step_6_once_committed, daemon=True)
    corrupter.start()
    run_overrides(overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:kill,rank:1,step:8,phase:forward}]"))
    corrupter.join(5)
    assert corrupted.is_set()
    (skipped,) = events(tmp_path, "checkpoint_skipped")
    assert skipped["step"] == 6 and "checksum mismatch" in skipped["error"] and skipped["source"] == "supervisor"
    segments = read_segments(tmp_path)
    assert [s.outcome for s in segments] == ["failed", "finished"] and segments[1].start_step == 4
    assert_identical_states(final_student_state(tmp_path), reference)


@pytest.mark.timeout(120)
def test_truncated_latest_checkpoint_is_skipped_by_resume_auto_with_an_event(tmp_path, teacher_file, reference):
    overrides = overrides_for(tmp_path, teacher_file, devices=1)
    run_overrides([*overrides, "trainer.stop_after=4"])  # a run stopped at step 4 (checkpoints 2 and 4)
    state = tmp_path / "checkpoints" / ckpt.step_dir_name(4) / ckpt.STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    run_overrides([*overrides, "resume=auto"])
    (skipped,) = events(tmp_path, "checkpoint_skipped")
    assert skipped["step"] == 4 and "corrupt or truncated" in skipped["error"] and skipped["source"] == "resume"
    assert_identical_states(final_student_state(tmp_path), reference)


# ---------------------------------------------------------------- storage that fails
def mount_tmpfs(path: Path, size_bytes: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a small filesystem (a real full disk) needs mount rights: {done.stderr.strip()}")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


@pytest.mark.timeout(240)
def test_disk_full_while_checkpointing_is_a_clear_error_and_loses_nothing(tmp_path, teacher_file, reference_run,
                                                                         reference):
    one = checkpoint_bytes(ckpt.latest_valid_checkpoint(reference_run / "checkpoints").path)  # the same tensors
    root = tmp_path / "checkpoints"
    overrides = overrides_for(tmp_path, teacher_file, "checkpoint.keep=1")
    mount_tmpfs(root, int(1.5 * one))  # room for one checkpoint, not for the next beside it
    try:
        with pytest.raises(WorkerFailure) as failure:
            run_overrides(overrides)
        message = str(failure.value)
        assert "No space left on device" in message and "CheckpointWriteError" in message, message
        assert f"the newest intact checkpoint is {root / ckpt.step_dir_name(2)}" in message, message
        assert "resume=auto" in message
        assert [r.step for r in ckpt.list_checkpoints(root)] == [2]
        ckpt.verify_checkpoint(root / ckpt.step_dir_name(2))  # untouched
        assert len(read_segments(tmp_path)) == 1, "a full disk is not a device failure: no restart"
        # Space is freed (the filesystem grows to two checkpoints and a bit): the run continues.
        subprocess.run(["mount", "-o", f"remount,size={int(2.3 * one)}", str(root)], check=True)
        run_overrides([*overrides, "resume=auto"])
        assert [r.step for r in ckpt.list_checkpoints(root)] == [STEPS]
        assert not list(root.glob("step_*.tmp-*"))
        assert_identical_states(final_student_state(tmp_path), reference)
    finally:
        unmount(root)


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` unwritable, really: chmod binds only a non-root user, so root gets a read-only bind mount."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        unmount(path)


@pytest.mark.timeout(120)
def test_unwritable_checkpoint_directory_is_a_clear_error_and_the_last_checkpoint_untouched(tmp_path, teacher_file,
                                                                                         reference):
    overrides = overrides_for(tmp_path, teacher_file, devices=1)
    run_overrides([*overrides, "trainer.stop_after=4"])
    root = tmp_path / "checkpoints"
    before = {p.name: p.read_bytes() for p in (root / ckpt.step_dir_name(4)).iterdir()}
    with read_only(root):
        with pytest.raises(WorkerFailure) as failure:  # one device runs supervised, as K devices do
            run_overrides([*overrides, "resume=auto"])
    message = str(failure.value)
    assert "CheckpointWriteError" in message and not failure.value.device_failure, message
    assert any(f"[Errno {code}]" in message for code in (errno.EROFS, errno.EACCES, errno.EPERM)), message
    assert str(root) in message and f"the newest intact checkpoint is {root / ckpt.step_dir_name(4)}" in message
    assert {p.name: p.read_bytes() for p in (root / ckpt.step_dir_name(4)).iterdir()} == before
    run_overrides([*overrides, "resume=auto"])  # writable again: the run finishes, nothing lost
    assert_identical_states(final_student_state(tmp_path), reference)


def fill_disk(path: Path) -> Path:
    """Fill the filesystem holding ``path`` to the last byte (a real full disk); the filler file."""
    filler = path / "filler.bin"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


# -m long: the default suite keeps the disk full *while* checkpointing above (19 s here)
@pytest.mark.long
@pytest.mark.timeout(240)
def test_disk_full_between_checkpoints_names_enospc_and_loses_nothing(tmp_path, teacher_file, reference):
    run_dir = tmp_path / "run"
    mount_tmpfs(run_dir, 64 << 20)  # the run's own disk; filled once step 3 is done (checkpoint 2 is safe)
    try:
        overrides = overrides_for(run_dir, teacher_file, "policy=keep",
                                  "injection.faults=[{kind:slow_compute,rank:0,start:3,seconds:0.05}]")
        filled = threading.Event()

        def fill_after_step_3() -> None:
            deadline = time.monotonic() + 180
            while steps_done(run_dir) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            fill_disk(run_dir)
            filled.set()

        filler = threading.Thread(target=fill_after_step_3, daemon=True)
        filler.start()
        with pytest.raises(Exception) as failure:
            run_overrides(overrides)
        filler.join(5)
        assert filled.is_set()
        message = f"{type(failure.value).__name__}: {failure.value}"
        assert "No space left on device" in message and str(run_dir) in message, message
        assert "Fix: free space" in message and "resume=auto" in message, message
        (run_dir / "filler.bin").unlink()
        run_overrides([*overrides, "resume=auto"])
        assert_identical_states(final_student_state(run_dir), reference)
    finally:
        unmount(run_dir)


# ---------------------------------------------------------------- NaN / Inf loss
def all_finite(state: tuple[dict, dict]) -> bool:
    model, optim = state
    tensors = [*model.values(), *(v for s in optim.values() for v in s.values() if torch.is_tensor(v))]
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


@pytest.mark.timeout(180)
def test_nan_loss_stops_the_run_naming_the_step_before_it_reaches_the_weights(tmp_path, teacher_file):
    with pytest.raises(WorkerFailure) as failure:
        run_overrides(overrides_for(tmp_path, teacher_file, "injection.faults=[{kind:nan_loss,rank:1,step:5}]"))
    message = str(failure.value)
    assert "NonFiniteLossError: step 5: the loss is nan" in message and "trainer.nonfinite=skip" in message, message
    (report,) = events(tmp_path, "nonfinite_loss")
    assert (report["step"], report["loss"], report["action"]) == (5, "nan", "stopped")
    (segment,) = read_segments(tmp_path)  # not a device failure: no restart, and the segment says how it ended
    assert (segment.outcome, segment.end_step) == ("error", 4)
    (ended,) = events(tmp_path, "segment_ended")
    assert ended["outcome"] == "error" and "NonFiniteLossError" in ended["cause"]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3, 4]
    refs = ckpt.list_checkpoints(tmp_path / "checkpoints")
    assert [r.step for r in refs] == [2, 4]
    assert all(all_finite(ckpt.load_student_state(r.path)) for r in refs)


NAN_AT_STEP_3 = "injection.faults=[{kind:nan_loss,rank:0,step:3}]"


def stopped_by_nonfinite_loss(step: int, *overrides: str) -> None:
    """Run ``overrides``; the run must end with the error naming ``step`` and its loss."""
    with pytest.raises(WorkerFailure) as failure:
        run_overrides(list(overrides))
    assert f"NonFiniteLossError: step {step}: the loss is nan" in str(failure.value), str(failure.value)
    assert not failure.value.device_failure, "a nan loss is the run's, not a device's: no device is dropped"


@pytest.mark.timeout(60)
def test_nan_loss_stops_one_device_too(tmp_path, teacher_file):
    stopped_by_nonfinite_loss(3, *overrides_for(tmp_path, teacher_file, NAN_AT_STEP_3, devices=1))
    assert [e["step"] for e in events(tmp_path, "nonfinite_loss", action="stopped")] == [3]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("every, raised_at", [(1, "the checkpoint of step 3"), (2, "the record of step 3")])
def test_a_late_loss_check_still_stops_before_any_checkpoint_holds_the_step(tmp_path, teacher_file, every, raised_at):
    """nonfinite_check=late (auto's choice on CUDA, forced here on the CPU): no host sync in the step;
    the loss is checked when read for its record (after step 4 ran) or, on a checkpoint step, before
    the save. Either way the error names step 3, no record or checkpoint holds it, it is reported once."""
    stopped_by_nonfinite_loss(3, *overrides_for(tmp_path, teacher_file, NAN_AT_STEP_3, "trainer.nonfinite_check=late",
                                                f"checkpoint.every={every}", devices=1))
    assert [e["step"] for e in events(tmp_path, "nonfinite_loss", action="stopped")] == [3], raised_at
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"] == [1, 2]
    refs = ckpt.list_checkpoints(tmp_path / "checkpoints")
    assert [r.step for r in refs] == [1, 2] if every == 1 else [2]
    assert all(all_finite(ckpt.load_student_state(r.path)) for r in refs)


def test_a_late_loss_check_is_refused_with_skip(tmp_path, teacher_file):
    with pytest.raises(ConfigError, match="trainer.nonfinite_check: late cannot skip a step.*Fix: use "
                                          "trainer.nonfinite_check=auto"):
        validate(compose_segment_config(overrides_for(tmp_path, teacher_file, "trainer.nonfinite_check=late",
                                                    "trainer.nonfinite=skip")))


@pytest.mark.timeout(180)
def test_a_late_loss_check_stops_the_pipeline_before_any_checkpoint_holds_the_step(tmp_path, teacher_file):
    """nonfinite_check=late on 3 ranks (auto's choice on CUDA): the last rank applies step 5's update
    without reading its loss, then raises when it reads it for the record, after step 6 ran; no
    record and no checkpoint holds step 5 (checkpoints every 2 steps: the one of step 6 is never
    committed), and the error names step 5."""
    stopped_by_nonfinite_loss(5, *overrides_for(tmp_path, teacher_file, "trainer.nonfinite_check=late",
                                                "injection.faults=[{kind:nan_loss,rank:1,step:5}]"))
    assert [e["step"] for e in events(tmp_path, "nonfinite_loss", action="stopped")] == [5]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3, 4]
    refs = ckpt.list_checkpoints(tmp_path / "checkpoints")
    assert [r.step for r in refs] == [2, 4]
    assert all(all_finite(ckpt.load_student_state(r.path)) for r in refs)


@pytest.mark.timeout(240)
def test_nan_loss_skipped_on_every_rank_as_on_one_device(tmp_path, teacher_file, reference):
    skip = ["trainer.nonfinite=skip", "checkpoint.every=1", "checkpoint.keep=20"]
    single, pipeline = tmp_path / "single", tmp_path / "pipeline"
    run_overrides(overrides_for(single, teacher_file, "injection.faults=[{kind:nan_loss,rank:0,step:5}]", *skip,
                                devices=1))
    # The NaN appears on rank 1 and reaches the loss on rank 2; all three ranks skip together.
    run_overrides(overrides_for(pipeline, teacher_file, "injection.faults=[{kind:nan_loss,rank:1,step:5}]", *skip))
    for run_dir in (single, pipeline):
        (report,) = events(run_dir, "nonfinite_loss")
        assert (report["step"], report["loss"], report["action"]) == (5, "nan", "skipped")
        skipped = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("skipped")]
        assert skipped == [5]
        at = {r.step: r.path for r in ckpt.list_checkpoints(run_dir / "checkpoints")}
        # Step 5 changed nothing: weights, BatchNorm statistics and optimizer state are step 4's.
        assert_identical_states(ckpt.load_student_state(at[5]), ckpt.load_student_state(at[4]))
        assert all_finite(ckpt.load_student_state(at[STEPS]))
    assert_identical_states(final_student_state(pipeline), final_student_state(single))
    with pytest.raises(AssertionError):  # and the skipped step really was left out
        assert_identical_states(final_student_state(pipeline), reference)


# ---------------------------------------------------------------- workers that cannot meet
def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


@pytest.mark.timeout(120)
def test_rendezvous_port_in_use_is_a_clear_error(tmp_path, teacher_file):
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RendezvousSetupError) as failure:
            run_overrides(overrides_for(tmp_path, teacher_file, f"trainer.rdzv_endpoint=127.0.0.1:{port}",
                                        devices=2))
    message = str(failure.value)
    assert f"trainer.rdzv_endpoint=127.0.0.1:{port}: the port is already in use" in message, message
    assert "Fix: choose a free port" in message
    assert not (tmp_path / "live").exists(), "no worker was started"


@pytest.mark.timeout(120)
def test_a_picked_free_port_taken_before_use_is_picked_again(tmp_path, teacher_file, monkeypatch):
    taken = listening_socket()
    ports = iter([taken.getsockname()[1]])  # another process grabs the first pick before the store binds it
    real_free_port = elastic.free_port
    monkeypatch.setattr(elastic, "free_port", lambda: next(ports, None) or real_free_port())
    lines: list[str] = []
    overrides = overrides_for(tmp_path, teacher_file, "trainer.max_steps=2", "failover.enabled=false", devices=2)
    with taken:
        summary = run(compose_segment_config(overrides), log=lines.append, overrides=overrides)
    assert summary["steps"] == 2
    assert any("was taken before the rendezvous could use it" in line for line in lines), lines


@pytest.mark.timeout(60)
@pytest.mark.parametrize("node_rank, expected", [
    (0, "timed out after 2 s (trainer.rdzv_timeout_s, failover.decider_grace_s for a restarted decider): "
        "trainer.nodes=2 nodes were expected and node(s) [1] did not join"),
    (1, "failed for node_rank 1"),
], ids=["host_waits_for_a_node_that_never_joins", "node_finds_no_store"])
def test_rendezvous_that_never_completes_is_a_clear_error_within_its_timeout(tmp_path, teacher_file, node_rank,
                                                                            expected):
    endpoint = f"127.0.0.1:{elastic.free_port()}"  # node 0 hosts the store; node 1 finds nobody there
    with pytest.raises(RendezvousSetupError) as failure:
        run_overrides(overrides_for(tmp_path, teacher_file, "trainer.nodes=2", f"trainer.node_rank={node_rank}",
                                    f"trainer.rdzv_endpoint={endpoint}", "trainer.rdzv_timeout_s=2", devices=1))
    message = str(failure.value)
    assert expected in message and endpoint in message and "Fix:" in message, message
    assert not (tmp_path / "live").exists(), "no worker was started"


# ---------------------------------------------------------------- whom a failure is blamed on
# The multi-process tests above meet these orders of events by chance; here they are forced, from
# the same records the workers write (``write_failure``) and the same progress boards.
def launch_failure(failures: dict[int, BaseException], tmp_path: Path) -> ChildFailedError:
    for rank, error in failures.items():
        write_failure(tmp_path / "failures", rank, error)
    first = min(failures)
    return ChildFailedError("worker_main", {first: ProcessFailure(first, 1000 + first, 1, "/nonexistent")})


def raised(error: BaseException, wrapped_as: str | None = None) -> BaseException:
    """``error`` with its traceback, optionally re-raised the way torch.distributed.pipelining wraps it."""
    try:
        try:
            raise error
        except BaseException as inner:
            if wrapped_as is None:
                raise
            raise RuntimeError(wrapped_as) from inner
    except BaseException as outer:
        return outer


def test_a_rank_that_reported_its_error_is_not_blamed_for_dying_of_it(tmp_path):
    # Rank 2 hits a CUDA error (wrapped by the pipeline schedule); ranks 0 and 1 lose their peer and
    # exit, and the health monitor sees rank 0's pid gone before the agent ends the launch.
    cuda = getattr(torch, "AcceleratorError", RuntimeError)("CUDA error: an illegal memory access was encountered")
    lost = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:4242")
    exc = launch_failure({2: raised(cuda, "[Segment 2] failed to run forward"), 0: raised(lost), 1: raised(lost)},
                         tmp_path)
    beats = {r: {"rank": r, "pid": 1000 + r, "time": 1.0} for r in range(3)}
    dead = [{"event": "rank_dead", "rank": 0, "pid": 1000, "step": 2, "hard": True}]
    failure = root_cause.failure_of(tmp_path / "failures", exc.failures, tmp_path, dead, beats)
    assert failure.rank == 2 and failure.device_failure
    assert "CUDA error: an illegal memory access" in failure.cause, failure.cause
    # A pid that vanished without a record is still the monitor's to report.
    silent = root_cause.failure_of(tmp_path / "failures", exc.failures, tmp_path,
                                   [{"event": "rank_dead", "rank": 3, "hard": True}], {**beats, 3: {"pid": 1003}})
    assert silent.rank == 3 and silent.cause.startswith("rank_dead") and "SIGKILL" in silent.cause


def test_the_hung_rank_is_the_one_busy_in_its_own_work_not_one_waiting_for_it(tmp_path):
    boards = {}
    for rank, phase in enumerate(["recv", "backward", "sync"]):
        board = ProgressBoard(progress_path(tmp_path, rank))
        board.mark(phase, step=5)
        boards[rank] = read_progress(progress_path(tmp_path, rank))
    assert boards[1] == {"pid": os.getpid(), "step": 5, "time": pytest.approx(time.time(), abs=60),
                         "phase": "backward"}
    # The monitor saw rank 0 stall first (it had been waiting longest); the boards say who hung.
    hung = [{"event": "rank_hung", "rank": 0, "stalled_s": 4.1, "hang_timeout_s": 4.0, "hard": True}]
    exc = ChildFailedError("worker_main", {0: ProcessFailure(0, 1000, -signal.SIGKILL, "/nonexistent")})  # torn down
    failure = root_cause.failure_of(tmp_path / "failures", exc.failures, tmp_path, hung, {}, boards)
    assert (failure.rank, failure.cause, failure.device_failure) == (1, "rank_hung", True)
    assert "rank 1 hung in backward of step 5" in str(failure) and "rank(s) [0, 2] waited on it" in str(failure)
    # Everyone waiting (a hang in the network itself, or a rank stalled inside a wait): no rank can be
    # told apart, so none is blamed and no device dropped (the monitor's first hung rank was device 0
    # in 3 of 8 stalls of rank 2).
    waiting = {r: {**b, "phase": "recv"} for r, b in boards.items()}
    untold = root_cause.failure_of(tmp_path / "failures", exc.failures, tmp_path, hung, {}, waiting)
    assert untold.rank is None and untold.device_failure and "no rank can be told" in str(untold), untold
    assert untold.retry_same_devices, "no device to blame: the launch is retried on the same devices"
    # A rank found stopped (SIGSTOP) is the culprit whatever the boards say.
    stopped = [{**hung[0], "stopped_ranks": [2]}]
    failure = root_cause.failure_of(tmp_path / "failures", exc.failures, tmp_path, stopped, {}, waiting)
    assert failure.rank == 2 and "rank 2 was found stopped" in str(failure), failure


def test_a_launch_whose_process_group_did_not_form_blames_no_device_and_is_retried(tmp_path):
    # Issue #33, 1: the workers' bootstrap store is reachable by any local process while the group forms;
    # a value written there fails the formation. A real formation failure: rank 0 of 2 meets no rank 1.
    import torch.distributed as dist
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", elastic.free_port(), is_master=True, wait_for_workers=False)
    with pytest.raises(Exception) as formed:  # noqa: PT011 - gloo's own error type and wording
        dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=1))
    write_failure(tmp_path / "failures", 0, formed.value)
    failure = root_cause.failure_of(tmp_path / "failures", {}, tmp_path, [], {}, {})
    assert failure.rank is None and not failure.device_failure and failure.retry_same_devices, failure
    assert failure.cause == root_cause.FORMING_THE_GROUP and "did not form" in str(failure)
    # the same error raised after the group formed is the rank's own (an error in the code: not retried)
    formed.value.__traceback__ = None
    write_failure(tmp_path / "failures", 0, formed.value)
    failure = root_cause.failure_of(tmp_path / "failures", {}, tmp_path, [], {}, {})
    assert failure.rank == 0 and not failure.retry_same_devices
