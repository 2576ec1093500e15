"""mode=simulate's time that is not steps (issue #35's validation): the checkpoint saves and
evaluations the config schedules hold the simulated clock between steps, priced from the restart
priors, the measured async-save stall and the cost model's forward pass; no step's time has them,
so the detector does not see them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from synapse.partitioning import load_profile_csv
from synapse.rundir import PERFORMANCE, read_events, read_jsonl
from synapse.simulation.run import ASYNC_SAVE_SHARE
from tests.unit.test_simulate import PROFILES, simulate

PRIORS = Path(__file__).resolve().parents[2] / "synapse" / "failover" / "priors" / "restart_cost_cuda.json"
BATCH, PER_EPOCH, STEPS, EVERY, VAL, MICROBATCHES = 64, 20, 130, 25, 200, 4
SMALL_RUN = ("trainer.devices=1", "data=synthetic", f"data.batch_size={BATCH}",
             f"data.synthetic_train_size={BATCH * PER_EPOCH}", f"data.synthetic_val_size={VAL}",
             f"trainer.max_steps={STEPS}", f"checkpoint.every={EVERY}", f"pipeline.microbatches={MICROBATCHES}")


def prior_save_s() -> float:
    return float(json.loads(PRIORS.read_text())["paths"]["restart"]["checkpoint_save_s"])


def forward_pass_s() -> float:
    """One evaluation on one device: the validation split in training-sized batches, each of M
    micro-batches, through every teacher and student block's forward (the shared profiles are used
    at their own micro-batch, unscaled)."""
    blocks = [*load_profile_csv(PROFILES / "tnet_vit_large.csv").blocks,
              *load_profile_csv(PROFILES / "snet_resnet152.csv").blocks]
    return math.ceil(VAL / BATCH) * MICROBATCHES * sum(b.forward_time_ms for b in blocks) / 1000.0


def held_after_each_step(run_dir: Path) -> dict[int, float]:
    """Per step, the clock's time between its record and the next step's start."""
    records = read_jsonl(PERFORMANCE.path(run_dir))
    return {a["step"]: b["time"] - b["step_seconds"] - a["time"] for a, b in zip(records, records[1:])}


def test_checkpoints_and_evaluations_hold_the_clock_after_the_steps_the_config_puts_them_at(tmp_path):
    # no noise, so no host gaps between steps (test_simulate_noise.py): the clock between two steps
    # is then the checkpoint saves and evaluations alone
    result = simulate(tmp_path, *SMALL_RUN, "simulate.step_noise=none")
    epoch_ends = set(range(PER_EPOCH, STEPS + 1, PER_EPOCH))
    saves = epoch_ends | set(range(EVERY, STEPS + 1, EVERY)) | {STEPS}
    evaluations = epoch_ends | {STEPS}
    saved, evaluated = read_events(tmp_path, "checkpoint_saved"), read_events(tmp_path, "evaluation")
    assert [e["step"] for e in saved] == sorted(saves)
    assert [e["step"] for e in evaluated] == sorted(evaluations)
    stall = prior_save_s() * ASYNC_SAVE_SHARE["cuda"]  # checkpoint.async_save=true by default
    assert all(e["stall_s"] == pytest.approx(stall) for e in saved)
    assert all(e["seconds"] == pytest.approx(forward_pass_s()) for e in evaluated)
    held = held_after_each_step(tmp_path)
    for step, seconds in held.items():
        expected = (stall if step in saves else 0.0) + (forward_pass_s() if step in evaluations else 0.0)
        assert seconds == pytest.approx(expected, abs=1e-6), step
    records = read_jsonl(PERFORMANCE.path(tmp_path))
    steps_s = sum(r["step_seconds"] for r in records)
    # the wall time has them (the first launch's prior besides)
    assert result["wall_time_s"] > steps_s + len(saves) * stall + len(evaluations) * forward_pass_s()
    assert not read_events(tmp_path, "slowdown_detected") and result["decisions"] == []


def test_a_synchronous_save_holds_the_loop_for_the_whole_save(tmp_path):
    simulate(tmp_path, *SMALL_RUN, "checkpoint.async_save=false")
    saved = read_events(tmp_path, "checkpoint_saved")
    assert saved and all(e["stall_s"] == pytest.approx(prior_save_s()) for e in saved)


def test_evaluations_follow_eval_every_epochs_and_the_last_step(tmp_path):
    simulate(tmp_path, *SMALL_RUN, "trainer.eval_every_epochs=3", "checkpoint.at_epoch_end=false")
    assert [e["step"] for e in read_events(tmp_path, "evaluation")] == [60, 120, STEPS]
    assert [e["step"] for e in read_events(tmp_path, "checkpoint_saved")] == [25, 50, 75, 100, 125, STEPS]


def test_a_run_without_evaluation_has_none_and_the_same_steps(tmp_path):
    with_eval = simulate(tmp_path / "eval", *SMALL_RUN)
    without = simulate(tmp_path / "none", *SMALL_RUN, "data.synthetic_val_size=0")
    assert read_events(tmp_path / "none", "evaluation") == []
    assert read_events(tmp_path / "eval", "evaluation")
    # the same steps, to the digit: an evaluation is in no step's time, only in the clock
    step_times = {name: [r["step_seconds"] for r in read_jsonl(PERFORMANCE.path(tmp_path / name))]
                  for name in ("eval", "none")}
    assert step_times["eval"] == step_times["none"]
    evaluations = len(read_events(tmp_path / "eval", "evaluation"))
    assert with_eval["wall_time_s"] - without["wall_time_s"] == pytest.approx(evaluations * forward_pass_s())


def test_a_device_slowed_from_a_trace_slows_its_evaluation_by_its_factor(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("device,kind,start_step,end_step,factor\n0,slow_compute,50,,3\n")
    simulate(tmp_path / "run", *SMALL_RUN, "policy=keep", f"simulate.trace={trace}")
    seconds = {e["step"]: e["seconds"] for e in read_events(tmp_path / "run", "evaluation")}
    assert seconds[40] == pytest.approx(forward_pass_s())
    assert seconds[60] == pytest.approx(3 * forward_pass_s())


def test_an_injected_slowdown_leaves_the_evaluations_as_fast_as_before(tmp_path):
    """The injector's hooks fire in training steps only (an evaluation's step is below 1), so a real
    run's evaluations under an injected slowdown take what they took before it (measured: the epoch
    ends of the 3-rank demo with rank 1 x4 from step 50, 0.26-0.29 s before and after)."""
    simulate(tmp_path, *SMALL_RUN, "policy=keep", "injection.faults=[{kind:slow_compute,rank:0,start:50,factor:3}]")
    seconds = {e["step"]: e["seconds"] for e in read_events(tmp_path, "evaluation")}
    assert seconds[40] == pytest.approx(forward_pass_s())
    assert seconds[60] == pytest.approx(forward_pass_s())
    # the steps themselves are slowed
    records = {r["step"]: r for r in read_jsonl(PERFORMANCE.path(tmp_path))}
    assert records[60]["compute_s"][0] > 2 * records[40]["compute_s"][0]


def test_replicas_evaluate_their_part_of_the_split_in_their_training_micro_batches(tmp_path):
    """R = 4 replicas on a validation split of one training batch: each forwards one equal share (a quarter of
    the batch) in the run's M micro-batches, side by side, so the evaluation takes what one device's M
    micro-batches take (the shared profiles are used at their own micro-batch, whatever its images). It
    took 4x that when each replica forwarded whole training batches, R x M micro-batches each."""
    def evaluation_s(run_dir: Path, replicas: int) -> float:
        simulate(run_dir, f"trainer.devices={replicas}", f"trainer.replicas={replicas}", "data=synthetic",
                 f"data.batch_size={BATCH}", f"data.synthetic_train_size={BATCH * PER_EPOCH}",
                 f"data.synthetic_val_size={BATCH}", f"trainer.max_steps={PER_EPOCH}",
                 f"pipeline.microbatches={MICROBATCHES}", "simulate.step_noise=none")
        [evaluation] = read_events(run_dir, "evaluation")
        return float(evaluation["seconds"])

    one = evaluation_s(tmp_path / "one", 1)
    assert one == pytest.approx(MICROBATCHES * forward_pass_s() / (math.ceil(VAL / BATCH) * MICROBATCHES))
    assert evaluation_s(tmp_path / "four", 4) == pytest.approx(one)
