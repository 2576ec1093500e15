"""mode=simulate's noise from recorded runs: besides the step and compute ratios, the host's time
between two steps' records (the records, the loader, the supervisor's reads), which no step's time
has and which the simulated clock now holds before every step."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from synapse.engine.device import available_cores
from synapse.rundir import PERFORMANCE, read_jsonl
from synapse.simulation.noise import PAUSE_FACTOR, host_gaps, load_noise, noise_from_stream
from tests.unit.test_simulate import simulate

STEPS = 40


def write_stream(path: Path, gap_s: float, pause_at: int | None = None) -> Path:
    """A fault-free stream of 2 ranks whose steps vary, ``gap_s`` between one record and the next
    step's start (``pause_at``: an epoch end's 1 s pause before that step)."""
    clock, lines = 1000.0, []
    for step in range(1, STEPS + 1):
        step_s = 0.1 + 0.01 * (step % 7)
        clock += gap_s + (1.0 if step == pause_at else 0.0) + step_s
        lines.append(json.dumps({"step": step, "time": clock, "step_seconds": step_s,
                                 "compute_s": [0.5 * step_s, 0.4 * step_s + 0.001 * (step % 3)],
                                 "comm_s": [0.5 * step_s, 0.6 * step_s]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_host_gaps_are_read_from_a_stream_leaving_out_epoch_pauses_and_negative_gaps(tmp_path):
    noise = noise_from_stream(write_stream(tmp_path / "s.jsonl", 0.02, pause_at=20))
    assert len(noise.host_gaps_s) == STEPS - 5 - 2  # after the warm-up, one a pair, the pause left out
    assert noise.host_gaps_s == pytest.approx([0.02] * len(noise.host_gaps_s), abs=1e-9)
    records = [{"step": 1, "time": 10.0, "step_seconds": 1.0}, {"step": 2, "time": 11.5, "step_seconds": 1.0},
               {"step": 3, "time": 12.0, "step_seconds": 1.0}, {"step": 4, "time": 13.7, "step_seconds": 1.0},
               {"step": 6, "time": 20.0, "step_seconds": 1.0}]  # 3 -> 4 negative, 4 -> 6 not consecutive
    assert host_gaps(records) == pytest.approx((0.5, 0.7))
    steady = [{"step": step, "time": 1.5 * step, "step_seconds": 1.0} for step in range(1, 8)]  # gaps of 0.5
    paused = {"step": 8, "time": steady[-1]["time"] + 1.0 + PAUSE_FACTOR * 0.5 + 0.1, "step_seconds": 1.0}
    assert host_gaps([*steady, paused]) == pytest.approx((0.5,) * 6)


def test_the_shipped_noise_has_the_host_gaps_measured_on_the_cpu_demo_and_the_h200s():
    cpu, cuda = load_noise("auto", "cpu"), load_noise("auto", "cuda")
    assert 0.015 <= statistics.median(cpu.host_gaps_s) <= 0.020  # the CPU demo's streams: 0.0147 and 0.0201
    assert 0.002 <= statistics.median(cuda.host_gaps_s) <= 0.004  # 2 x H200: 0.0027
    assert max(cpu.host_gaps_s) < 0.3  # no epoch end's evaluation and save (0.30-0.62 s)


def test_each_step_waits_for_a_drawn_host_gap_and_the_steps_are_the_same_as_without(tmp_path):
    with_gaps = write_stream(tmp_path / "gaps.jsonl", 0.05)
    without = write_stream(tmp_path / "none.jsonl", 0.0)
    runs = {}
    for name, stream in (("gaps", with_gaps), ("none", without)):
        result = simulate(tmp_path / name, "trainer.max_steps=60", "checkpoint.every=0", "data.synthetic_val_size=0",
                          f"simulate.step_noise={stream}")
        runs[name] = (result, read_jsonl(PERFORMANCE.path(tmp_path / name)))
    (gapped, gapped_records), (plain, plain_records) = runs["gaps"], runs["none"]
    # the seed's step and compute noise are as they were (the gaps have a generator of their own)
    assert [r["step_seconds"] for r in gapped_records] == [r["step_seconds"] for r in plain_records]
    assert [r["compute_s"] for r in gapped_records] == [r["compute_s"] for r in plain_records]
    held = [b["time"] - b["step_seconds"] - a["time"] for a, b in zip(gapped_records, gapped_records[1:])]
    saved_or_evaluated = [b["time"] - b["step_seconds"] - a["time"] for a, b in zip(plain_records, plain_records[1:])]
    assert [h - s for h, s in zip(held, saved_or_evaluated)] == pytest.approx([0.05] * len(held), abs=1e-6)
    assert gapped["wall_time_s"] - plain["wall_time_s"] == pytest.approx(60 * 0.05, abs=1e-5)  # on a clock of 1.8e9 s
    assert gapped["decisions"] == plain["decisions"]


CPU_PROFILES = Path(__file__).resolve().parents[2] / "experiments" / "results" / "simulate_profiles_cpu"


def test_a_cpu_rank_slowed_by_the_injector_takes_its_factor_and_the_others_keep_their_compute(tmp_path):
    """3 CPU ranks of as many threads as the cores, at the cost model's fair share (3x the profile).
    Rank 1 slowed x4 by the injector's sleep takes 4x its compute; the others keep theirs. Measured on
    the 3-rank demo with rank 1 x4 from step 50 (simulate_validation_runs_2026-12-05: degrade_0, eta_0,
    the steps before they acted): ranks 0 and 2 computed 0.031 / 0.029 s a step against 0.030 / 0.032 s
    before, rank 1 3.8-4.0x its own; the freed-core share (ranks on the CPU sum(1 / f)) would have put
    ranks 0 and 2 at 0.75x and rank 1 at 3x."""
    simulate(tmp_path, "trainer.accelerator=cpu", "trainer.devices=3", f"trainer.threads={available_cores()}",
             "teacher=resnet_mini", "student=resnet_micro", "data=digits", "partition=even", "policy=keep",
             "trainer.max_steps=60", "simulate.step_noise=none",
             f"simulate.teacher_profile={CPU_PROFILES / 'resnet_mini_teacher_mb16_fp32_amd-epyc_32px_1ch_10cls.csv'}",
             f"simulate.student_profile={CPU_PROFILES / 'resnet_micro_student_mb16_fp32_amd-epyc_32px_1ch_10cls.csv'}",
             "injection.faults=[{kind:slow_compute,rank:1,start:30,factor:4.0}]")
    records = read_jsonl(PERFORMANCE.path(tmp_path))
    before, after = records[20]["compute_s"], records[40]["compute_s"]
    assert after[0] == pytest.approx(before[0], rel=1e-9)
    assert after[2] == pytest.approx(before[2], rel=1e-9)
    assert after[1] / before[1] == pytest.approx(4.0, rel=1e-9)
