"""mode=simulate against the measured CPU runs (issue #35's validation): what a real run spends that
the simulator priced wrongly, each checked here against the rule the measurement showed.

* the first launch starts the launcher's forkserver (torch and the worker modules imported) before
  any worker exists: 3.8-4.4 s on the 3-rank demo, against a relaunch's 0.59 s;
* an evaluation runs on the ranks' share of the host's cores, as a step's compute does;
* the run ends when its workers have exited (the restart prior's teardown), not at its last step.
* a relaunch on fewer CPU ranks runs at their share of the host's cores, not the first placement's.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from synapse.engine.device import available_cores
from synapse.partitioning import even_counts, load_profile_csv
from synapse.rundir import PERFORMANCE, read_events, read_jsonl
from synapse.simulation import START_TIME
from synapse.simulation.launch import SHIPPED, FirstLaunchError, first_launch_of, measured_first_launch
from tests.unit.test_simulate import simulate
from tests.unit.test_simulate_noise import CPU_PROFILES

PRIORS = Path(__file__).resolve().parents[2] / "synapse" / "failover" / "priors"
TEACHER = CPU_PROFILES / "resnet_mini_teacher_mb16_fp32_amd-epyc_32px_1ch_10cls.csv"
STUDENT = CPU_PROFILES / "resnet_micro_student_mb16_fp32_amd-epyc_32px_1ch_10cls.csv"
CPU_RUN = ("trainer.accelerator=cpu", "trainer.devices=3", "teacher=resnet_mini", "student=resnet_micro",
           "data=digits", "partition=even", "policy=keep", "trainer.max_steps=60", "simulate.step_noise=none",
           f"simulate.teacher_profile={TEACHER}", f"simulate.student_profile={STUDENT}")


def restart_prior(accelerator: str) -> dict[str, float]:
    return json.loads((PRIORS / f"restart_cost_{accelerator}.json").read_text())["paths"]["restart"]


def write_run(run_dir: Path, started_at: float, process_started: float, build_s: float, ready_at: float,
              steps: list[float]) -> Path:
    """A finished run's files as the supervisor and the workers write them (only what is read)."""
    (run_dir / "segments" / "0").mkdir(parents=True)
    (run_dir / "segments" / "0" / "segment.json").write_text(json.dumps({"started_at": started_at}))
    (run_dir / "failover_events.jsonl").write_text(json.dumps(
        {"event": "launch_ready", "segment": 0, "time": ready_at, "process_started": process_started,
         "build_s": build_s}) + "\n")
    clock, lines = ready_at, []
    for step, seconds in enumerate(steps, start=1):
        clock += seconds
        lines.append(json.dumps({"step": step, "segment": 0, "time": clock, "step_seconds": seconds}))
    PERFORMANCE.path(run_dir).write_text("\n".join(lines) + "\n")
    return run_dir


def test_a_first_launch_is_measured_from_the_supervisors_start_to_the_first_step(tmp_path):
    # started at 100 s; the workers' processes at 103.5 s, built 0.4 s later, ready at 104.0 s; the first
    # step (probe and warm-up in it) ends at 104.5 s, the next steps take 0.1 s
    run = write_run(tmp_path / "a", 100.0, 103.5, 0.4, 104.0, [0.5, 0.1, 0.1, 0.12, 0.1])
    launch = first_launch_of(run)
    assert launch.launch_s == pytest.approx(3.9)
    assert launch.warmup_s == pytest.approx(0.4)  # 0.5 s to the first step's end, less a steady 0.1 s step
    other = write_run(tmp_path / "b", 0.0, 4.5, 0.5, 5.2, [0.3, 0.1, 0.1])
    assert measured_first_launch([run, other]).launch_s == pytest.approx((3.9 + 5.0) / 2)
    with pytest.raises(FirstLaunchError, match="finished train.py run"):
        first_launch_of(tmp_path / "missing")


def test_a_simulated_cpu_run_starts_after_the_measured_first_launch_not_a_relaunch(tmp_path):
    simulate(tmp_path, *CPU_RUN)
    first = read_jsonl(PERFORMANCE.path(tmp_path))[0]
    shipped = json.loads((SHIPPED / "cpu.json").read_text())
    started = first["time"] - first["step_seconds"] - START_TIME  # no noise: no host gap before it
    assert started == pytest.approx(shipped["launch_s"] + shipped["warmup_s"], abs=1e-6)
    relaunch = restart_prior("cpu")
    assert started > 3 * (relaunch["launch_s"] + relaunch["warmup_s"])  # the forkserver's start is most of it


def test_without_a_measured_first_launch_a_gpu_run_starts_after_the_restart_priors_launch(tmp_path):
    assert not (SHIPPED / "cuda.json").exists()
    simulate(tmp_path, "simulate.step_noise=none")
    first = read_jsonl(PERFORMANCE.path(tmp_path))[0]
    prior = restart_prior("cuda")
    assert first["time"] - first["step_seconds"] - START_TIME == pytest.approx(prior["launch_s"] + prior["warmup_s"],
                                                                                abs=1e-6)


def test_a_cpu_evaluation_runs_at_the_ranks_share_of_the_cores(tmp_path):
    """3 ranks of as many threads as the cores: a step's compute, and an evaluation's, take 3x the
    profile's time (the fair share, ``cpu_contention``)."""
    simulate(tmp_path, *CPU_RUN, f"trainer.threads={available_cores()}")
    teacher, student = load_profile_csv(TEACHER).blocks, load_profile_csv(STUDENT).blocks
    counts_t, counts_s = even_counts(len(teacher), 3), even_counts(len(student), 3)
    stage_s, t0, s0 = [], 0, 0
    for ct, cs in zip(counts_t, counts_s):
        stage_s.append(sum(b.forward_time_ms for b in [*teacher[t0:t0 + ct], *student[s0:s0 + cs]]) / 1000.0)
        t0, s0 = t0 + ct, s0 + cs
    batches, per_batch = math.ceil(359 / 64), 4  # the digits' validation split; 64 images in 4 micro-batches
    alone = batches * (sum(stage_s) + (per_batch - 1) * max(stage_s))
    evaluated = read_events(tmp_path, "evaluation")
    assert evaluated and all(e["seconds"] == pytest.approx(3 * alone, rel=1e-9) for e in evaluated)


def test_a_run_ends_when_its_workers_have_exited_after_its_last_save_and_evaluation(tmp_path):
    result = simulate(tmp_path, "simulate.step_noise=none")
    last = read_jsonl(PERFORMANCE.path(tmp_path))[-1]
    saved, evaluated = read_events(tmp_path, "checkpoint_saved")[-1], read_events(tmp_path, "evaluation")[-1]
    assert saved["step"] == evaluated["step"] == last["step"]
    after_last_step = result["wall_time_s"] - (last["time"] - START_TIME)
    teardown = restart_prior("cuda")["teardown_s"]
    assert after_last_step == pytest.approx(saved["stall_s"] + evaluated["seconds"] + teardown, abs=1e-6)


def test_a_cpu_run_relaunched_on_fewer_ranks_runs_at_their_share_of_the_cores(tmp_path):
    """3 ranks of as many threads as the cores run at a third of the host each; degraded to 2 they run at
    a half, as a run started on those 2 ranks and that cut does (its own segment's planning prices so)."""
    threads = f"trainer.threads={available_cores()}"
    simulate(tmp_path / "degraded", *CPU_RUN, threads, "policy=degrade", "trainer.max_steps=90",
             "injection.faults=[{kind:slow_compute,rank:1,start:30,factor:4.0}]")
    segment = json.loads((tmp_path / "degraded" / "segments" / "1" / "segment.json").read_text())
    assert len(segment["devices"]) == 2
    degraded = [r for r in read_jsonl(PERFORMANCE.path(tmp_path / "degraded")) if r["segment"] == 1]
    teacher, student = ",".join(map(str, segment["teacher_counts"])), ",".join(map(str, segment["student_counts"]))
    simulate(tmp_path / "two", *CPU_RUN, threads, "trainer.devices=2", "partition=manual",
             f"partition.teacher=[{teacher}]", f"partition.student=[{student}]")
    started = read_jsonl(PERFORMANCE.path(tmp_path / "two"))
    assert degraded[-1]["compute_s"] == pytest.approx(started[-1]["compute_s"], rel=1e-9)
    first = [r for r in read_jsonl(PERFORMANCE.path(tmp_path / "degraded")) if r["segment"] == 0][5]
    assert sum(first["compute_s"]) > sum(degraded[-1]["compute_s"])
