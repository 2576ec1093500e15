"""The cost model's CPU terms: core contention, per-micro-batch overhead, KD loss, link latency,
and their calibration from a single-device run."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from synapse import planning
from synapse.calibration import TermCalibration
from synapse.partitioning import (
    MESSAGES_PER_MICROBATCH,
    BlockProfile,
    CostModel,
    CostModelError,
    DeviceSpec,
    ModelProfile,
    StepSpec,
    cpu_contention,
    plan_with_cost_model,
)

KB = 1024


def profile(name: str, fwd, bwd, out_kb) -> ModelProfile:
    blocks = tuple(BlockProfile(f"{name}{k}", f, b, 1.0, o, 1.0, 1.0)
                   for k, (f, b, o) in enumerate(zip(fwd, bwd, out_kb)))
    return ModelProfile(name, blocks)


# Times in ms: teacher blocks 1, 2, 3 (forward only); student blocks 1+2, 1+4 (forward + backward).
TEACHER = profile("t", fwd=[1.0, 2.0, 3.0], bwd=[0, 0, 0], out_kb=[10, 20, 30])
STUDENT = profile("s", fwd=[1.0, 1.0], bwd=[2.0, 4.0], out_kb=[5, 7])


def model_with(devices=None, **step) -> CostModel:
    return CostModel(TEACHER, STUDENT, devices or [DeviceSpec("a"), DeviceSpec("b")], StepSpec(microbatches=4, **step))


# ---------------------------------------------------------------- contention


@pytest.mark.parametrize(
    ("ranks", "threads", "cores", "expected"),
    [(3, 1, 2, 1.5), (2, 1, 2, 1.0), (1, 1, 2, 1.0), (1, 4, 2, 2.0), (4, 2, 8, 1.0), (5, 2, 4, 2.5)],
)
def test_cpu_contention_is_the_fair_share_of_oversubscribed_cores(ranks, threads, cores, expected):
    assert cpu_contention(ranks, threads, cores) == pytest.approx(expected)


@pytest.mark.parametrize(("args", "name"), [((0, 1, 2), "ranks=0"), ((2, 1.5, 2), "threads_per_rank=1.5"),
                                            ((2, 1, True), "cores=True")])
def test_cpu_contention_rejects_non_counts(args, name):
    with pytest.raises(CostModelError, match=re.escape(name)):
        cpu_contention(*args)


def test_contention_slows_the_blocks_but_not_the_link():
    devices = [DeviceSpec("a", alpha=2.0, contention=1.5, link_bandwidth_bytes_per_s=1e6), DeviceSpec("b")]
    model = model_with(devices)
    comm = (20 + 2 * 5) * KB / 1e6  # cut after teacher block 1 and student block 0
    # stage 0: teacher 1 + 2 ms, student 1 + 2 ms of profile time, alpha 2, contention 1.5
    assert model.stage_time_s(0, 0, 2, 0, 1) == pytest.approx(1.5 * 2.0 * 6e-3 + comm)
    assert model.comm_time_s(0, 2, 1) == pytest.approx(comm)
    assert model.compute_scale(0) == 3.0 and model.compute_scale(1) == 1.0


def test_contention_scales_the_overhead_but_alpha_does_not():
    devices = [DeviceSpec("a", alpha=4.0, contention=2.0), DeviceSpec("b", alpha=3.0)]
    model = model_with(devices, per_microbatch_overhead_s=0.01)
    assert model.stage_overhead_s(0) == pytest.approx(0.02)
    assert model.stage_overhead_s(1) == pytest.approx(0.01)


@pytest.mark.parametrize(("value", "expected"), [(0.5, "contention=0.5 must be finite and >= 1"),
                                                 (math.inf, "contention=inf"), (math.nan, "contention=nan")])
def test_contention_below_one_or_not_finite_is_rejected(value, expected):
    with pytest.raises(CostModelError, match=re.escape(expected)):
        DeviceSpec("cpu:0", contention=value)


def test_a_contended_device_gets_less_work():
    teacher = profile("t", [1.0] * 6, [0.0] * 6, [1.0] * 6)
    student = profile("s", [1.0] * 6, [1.0] * 6, [1.0] * 6)
    free = [DeviceSpec("a"), DeviceSpec("b")]
    shared = [DeviceSpec("a"), DeviceSpec("b", contention=3.0)]
    even = plan_with_cost_model(CostModel(teacher, student, free, StepSpec(4)))
    skewed = plan_with_cost_model(CostModel(teacher, student, shared, StepSpec(4)))
    assert even.teacher_counts[1] + 2 * even.student_counts[1] > skewed.teacher_counts[1] + 2 * skewed.student_counts[1]
    assert skewed.step_time_s > even.step_time_s


# ---------------------------------------------------------------- per-micro-batch overhead and loss


def test_overhead_is_paid_by_every_stage_once_per_micro_batch():
    base, with_overhead = model_with(), model_with(per_microbatch_overhead_s=0.002)
    counts = ([2, 1], [1, 1])
    cost, cost0 = with_overhead.evaluate(*counts), base.evaluate(*counts)
    assert cost.stage_overhead_s == (0.002, 0.002)
    assert cost.stage_compute_s == pytest.approx(cost0.stage_compute_s)  # the blocks did not get slower
    for t, c, o, comm in zip(cost.stage_times_s, cost.stage_compute_s, cost.stage_overhead_s, cost.stage_comm_s):
        assert t == pytest.approx(c + o + comm)
    # fill/drain passes K stages once, then M - 1 micro-batches at the bottleneck: (K + M - 1) overheads
    assert cost.step_time_s - cost0.step_time_s == pytest.approx((2 + 4 - 1) * 0.002)


def test_loss_is_computed_on_the_last_stage_only_at_its_compute_speed():
    devices = [DeviceSpec("a"), DeviceSpec("b", alpha=2.0, contention=1.5)]
    base, with_loss = model_with(devices), model_with(devices, loss_s=0.004)
    cost, cost0 = with_loss.evaluate([2, 1], [1, 1]), base.evaluate([2, 1], [1, 1])
    assert cost.stage_times_s[0] == cost0.stage_times_s[0]
    assert cost.stage_times_s[1] - cost0.stage_times_s[1] == pytest.approx(2.0 * 1.5 * 0.004)
    # compute, like the clock
    assert cost.stage_compute_s[1] - cost0.stage_compute_s[1] == pytest.approx(2.0 * 1.5 * 0.004)
    assert cost.stage_overhead_s == (0.0, 0.0)


@pytest.mark.parametrize("field", ["per_microbatch_overhead_s", "loss_s"])
@pytest.mark.parametrize("value", [-1e-3, math.inf, math.nan])
def test_step_terms_must_be_non_negative_seconds(field, value):
    with pytest.raises(CostModelError, match=re.escape(f"{field}={value!r} must be >= 0 seconds")):
        StepSpec(microbatches=2, **{field: value})


def test_defaults_keep_the_model_without_cpu_terms():
    step, device = StepSpec(4), DeviceSpec("a")
    assert (step.per_microbatch_overhead_s, step.loss_s, device.contention, device.link_latency_s) == (0, 0, 1, 0)
    model = model_with()
    # stage 0 of [2, 1] / [1, 1]: 3 ms teacher + 3 ms student, nothing else (free link, no overhead)
    assert model.evaluate([2, 1], [1, 1]).stage_times_s[0] == pytest.approx(6e-3)


# ---------------------------------------------------------------- link latency


def test_link_latency_is_paid_per_message_even_on_an_infinitely_fast_link():
    # beta is a bandwidth slowdown: it prices bytes, not the per-message latency
    devices = [DeviceSpec("a", beta=2.0, link_latency_s=1e-4), DeviceSpec("b", link_latency_s=1.0)]
    model = model_with(devices)
    assert model.comm_time_s(0, 2, 1) == pytest.approx(MESSAGES_PER_MICROBATCH * 1e-4)
    assert model.comm_time_s(1, 3, 2) == 0.0  # the last stage sends nothing


def test_link_latency_adds_to_the_bandwidth_term():
    devices = [DeviceSpec("a", link_bandwidth_bytes_per_s=1e6, link_latency_s=5e-5), DeviceSpec("b")]
    expected = (20 + 2 * 5) * KB / 1e6 + MESSAGES_PER_MICROBATCH * 5e-5
    assert model_with(devices).comm_time_s(0, 2, 1) == pytest.approx(expected)


@pytest.mark.parametrize("value", [-1e-6, math.inf])
def test_negative_or_infinite_latency_is_rejected(value):
    with pytest.raises(CostModelError, match=re.escape(f"link_latency_s={value!r} must be >= 0")):
        DeviceSpec("a", link_latency_s=value)


# ---------------------------------------------------------------- structure the partitioner relies on


@pytest.mark.parametrize("seed", range(4))
def test_stage_time_never_grows_when_a_stage_starts_later_with_every_term_on(seed):
    rng = np.random.default_rng(seed)
    teacher = profile("t", rng.uniform(0, 5, 9), np.zeros(9), rng.uniform(0, 100, 9))
    student = profile("s", rng.uniform(0, 5, 11), rng.uniform(0, 9, 11), rng.uniform(0, 100, 11))
    devices = [DeviceSpec("a", alpha=rng.uniform(0.5, 3), contention=rng.uniform(1, 3), link_latency_s=1e-4,
                          link_bandwidth_bytes_per_s=1e8), DeviceSpec("b", contention=2.0)]
    model = CostModel(teacher, student, devices, StepSpec(4, per_microbatch_overhead_s=1e-3, loss_s=2e-3))
    for stage in range(2):
        for i0, i1 in [(0, 9), (2, 5), (4, 5)]:
            for j1 in range(1, 12):
                j0 = np.arange(j1 + 1)
                assert np.all(np.diff(model.stage_time_s(stage, i0, i1, j0, j1)) <= 0)


# ---------------------------------------------------------------- calibration from a K = 1 run


def single_device_truth(scale: float, overhead_s: float, loss_s: float, optimizer_s: float, m: int = 4) -> dict:
    """What a K = 1 run of TEACHER + STUDENT measures if the device is `scale` times slower than profiled."""
    blocks = m * scale * (6e-3 + 8e-3)  # teacher 1+2+3 ms, student (1+2) + (1+4) ms per micro-batch
    loss = m * loss_s
    return {"block_compute_s": blocks, "loss_s": loss, "optimizer_s": optimizer_s,
            "wall_s": blocks + loss + optimizer_s + m * overhead_s}


def test_calibration_corrects_a_model_four_times_too_optimistic():
    truth = {"scale": 4.0, "overhead_s": 3e-3, "loss_s": 1e-3, "optimizer_s": 5e-3}
    measured = single_device_truth(**truth)
    single = CostModel(TEACHER, STUDENT, [DeviceSpec("cpu:0")], StepSpec(4))
    raw = single.evaluate([3], [2]).step_time_s
    assert measured["wall_s"] / raw > 4  # several times below what was measured
    terms = TermCalibration.from_single_device_step(single, **measured)
    assert terms.compute_scale == pytest.approx(4.0)
    assert terms.per_microbatch_overhead_s == pytest.approx(3e-3)
    assert terms.loss_s * terms.compute_scale == pytest.approx(1e-3)
    assert terms.apply(single).evaluate([3], [2]).step_time_s == pytest.approx(measured["wall_s"])


def test_calibrated_terms_carry_over_to_a_two_stage_pipeline():
    single = CostModel(TEACHER, STUDENT, [DeviceSpec("cpu:0")], StepSpec(4))
    terms = TermCalibration.from_single_device_step(single, **single_device_truth(4.0, 3e-3, 1e-3, 5e-3))
    pipeline = CostModel(TEACHER, STUDENT, [DeviceSpec("cpu:0"), DeviceSpec("cpu:1", contention=1.5)], StepSpec(4))
    cost = terms.apply(pipeline).evaluate([2, 1], [1, 1])
    # by hand: stage 0 = 4 x 6 ms + 3 ms; stage 1 = 1.5 x (4 x 8 ms + 1 ms loss + 3 ms overhead)
    stage0, stage1 = 4 * 6e-3 + 3e-3, 1.5 * (4 * 8e-3 + 1e-3 + 3e-3)
    assert cost.stage_times_s == pytest.approx((stage0, stage1))
    assert cost.step_time_s == pytest.approx(stage0 + stage1 + 3 * max(stage0, stage1) + 5e-3)


def test_calibration_divides_out_what_the_single_device_model_already_knows():
    slow = CostModel(TEACHER, STUDENT, [DeviceSpec("cpu:0", alpha=2.0, contention=2.0)], StepSpec(4))
    measured = single_device_truth(4.0, 2e-3, 0.0, 0.0)
    measured["wall_s"] = measured["block_compute_s"] + 4 * 2 * 2e-3  # overhead under contention 2
    terms = TermCalibration.from_single_device_step(slow, **measured)
    assert terms.compute_scale == pytest.approx(1.0)  # alpha x contention = 4 already explains the blocks
    assert terms.per_microbatch_overhead_s == pytest.approx(2e-3)
    assert terms.apply(slow).evaluate([3], [2]).step_time_s == pytest.approx(measured["wall_s"])


def test_wall_time_below_the_measured_parts_means_no_overhead():
    single = CostModel(TEACHER, STUDENT, [DeviceSpec("cpu:0")], StepSpec(4))
    terms = TermCalibration.from_single_device_step(single, block_compute_s=0.1, loss_s=0.0, optimizer_s=0.0,
                                                    wall_s=0.09)
    assert terms.per_microbatch_overhead_s == 0.0


def test_calibration_needs_a_single_device_model_and_sane_numbers():
    two = model_with()
    with pytest.raises(CostModelError, match="single-device model, not one of 2 stages"):
        TermCalibration.from_single_device_step(two, 0.1, 0.0, 0.0, 0.1)
    single = CostModel(TEACHER, STUDENT, [DeviceSpec("cpu:0")], StepSpec(4))
    with pytest.raises(CostModelError, match="block compute > 0"):
        TermCalibration.from_single_device_step(single, 0.0, 0.0, 0.0, 0.1)
    with pytest.raises(CostModelError, match="must be finite"):
        TermCalibration.from_single_device_step(single, 0.1, math.nan, 0.0, 0.1)
    with pytest.raises(CostModelError, match="compute_scale=0"):
        TermCalibration(compute_scale=0)


# ---------------------------------------------------------------- device_specs on CPU


@pytest.mark.parametrize(("devices", "threads", "cores", "expected"),
                         [(3, "1", 2, 1.5), (2, "1", 2, 1.0), (2, "null", 2, 1.0), (3, "null", 2, 1.5),
                          (2, "2", 2, 2.0), (1, "null", 2, 1.0)])
def test_cpu_device_specs_know_how_the_ranks_share_the_cores(make_config, monkeypatch, devices, threads, cores,
                                                             expected):
    monkeypatch.setattr(planning, "available_cores", lambda: cores)
    monkeypatch.setattr(planning, "default_threads", lambda ranks: max(1, cores // ranks))
    cfg = make_config("trainer.accelerator=cpu", f"trainer.devices={devices}", f"trainer.threads={threads}")
    specs = planning.device_specs(cfg.trainer, cfg.partition, devices)
    assert [s.contention for s in specs] == [pytest.approx(expected)] * devices


# ---------------------------------------------------------------- plan vs measured


def write_records(path, walls, computes, comms) -> None:
    with open(path, "w") as f:
        for step, (wall, compute, comm) in enumerate(zip(walls, computes, comms), start=1):
            ranks = [{"teacher_fwd": c / 2, "student_fwd": c / 4, "loss": 0.0, "student_bwd": c / 4, "optimizer": 0.0,
                      "compute": c, "comm": m, "wall": c + m} for c, m in zip(compute, comm)]
            f.write(json.dumps({"step": step, "step_seconds": wall, "compute_s": compute, "comm_s": comm,
                                "ranks": ranks}) + "\n")


def test_measured_step_summary_takes_medians_after_warm_up(tmp_path):
    walls = [9.0, 9.0, 0.10, 0.30, 0.20]  # two slow warm-up steps, then 0.1, 0.3, 0.2
    computes = [[5.0, 5.0], [5.0, 5.0], [0.06, 0.05], [0.08, 0.07], [0.07, 0.09]]
    comms = [[1.0, 1.0], [1.0, 1.0], [0.04, 0.05], [0.02, 0.01], [0.03, 0.03]]
    write_records(tmp_path / "performance.jsonl", walls, computes, comms)
    summary = planning.measured_step_summary(tmp_path / "performance.jsonl", warmup_steps=2)
    assert summary["steps"] == 3 and summary["step_s"] == pytest.approx(0.20)
    assert summary["stage_compute_s"] == pytest.approx([0.07, 0.07])
    assert summary["stage_comm_s"] == pytest.approx([0.03, 0.03])
    assert summary["stage_parts_s"][1]["teacher_fwd"] == pytest.approx(0.035)
    assert planning.measured_step_summary(tmp_path / "performance.jsonl", warmup_steps=5) is None


def test_compare_plan_with_run_puts_overhead_with_the_non_compute_time(tmp_path):
    model = model_with([DeviceSpec("a", link_latency_s=1e-3), DeviceSpec("b")], per_microbatch_overhead_s=2e-3)
    plan = plan_with_cost_model(model)
    (tmp_path / "plan.json").write_text(json.dumps({"plan": plan.to_dict()}))
    write_records(tmp_path / "performance.jsonl", [0.1] * 4, [[0.05, 0.06]] * 4, [[0.05, 0.04]] * 4)
    result = planning.compare_plan_with_run(tmp_path, warmup_steps=1)
    assert result["steps_compared"] == 3 and result["measured_step_s"] == pytest.approx(0.1)
    # stage 0: 4 micro-batches x (2 ms overhead + 3 messages x 1 ms); stage 1: overhead only
    assert result["predicted_stage_noncompute_s"] == pytest.approx([4 * 5e-3, 4 * 2e-3])
    assert result["predicted_stage_compute_s"] == pytest.approx([4 * c for c in plan.stage_compute_s])
    assert result["step_error"] == pytest.approx(plan.step_time_s / 0.1 - 1)
    assert json.loads((tmp_path / "plan_vs_measured.json").read_text()) == json.loads(json.dumps(result))


def test_a_slow_link_prices_the_bytes_at_its_cut_and_the_latency_stays():
    devices = [DeviceSpec("a", beta=50.0, link_bandwidth_bytes_per_s=1e6, link_latency_s=5e-5), DeviceSpec("b")]
    expected = 50.0 * (20 + 2 * 5) * KB / 1e6 + MESSAGES_PER_MICROBATCH * 5e-5
    assert model_with(devices).comm_time_s(0, 2, 1) == pytest.approx(expected)
