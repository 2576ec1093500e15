"""mode=simulate's noise from recorded runs: besides the step and compute ratios, the host's time
between two steps' records (the records, the loader, the supervisor's reads), which no step's time
has and which the simulated clock now holds before every step."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

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
