"""Issue #15 item 1: slowdowns that start early, devices slow from the start, and real
fault-free streams recorded on H200s (tests/data/fault_free_streams, see its index.json)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from statistics import median

import pytest
from omegaconf import OmegaConf
from test_detector import Slow, feed, stream, summary

from synapse.detection import (
    COMPUTE,
    SLOWDOWN,
    DetectorConfig,
    SlowdownDetector,
    StepTiming,
    net_compute_ratios,
    prior_checked,
)

DATA = Path(__file__).resolve().parents[1] / "data"
STREAMS = DATA / "fault_free_streams"
INDEX = json.loads((STREAMS / "index.json").read_text())
FAULT_STREAMS = DATA / "fault_streams"  # recorded with a fault injected (see its index.json)
FAULT_INDEX = json.loads((FAULT_STREAMS / "index.json").read_text())
# What `trainer=gpu` sets: a lone GPU is judged against the plan
GPU_ALONE = OmegaConf.load(Path(__file__).resolve().parents[2]
                           / "conf/trainer/gpu.yaml").failover.detector.alone_threshold


def recorded(name: str, folder: Path = STREAMS) -> list[StepTiming]:
    rows = [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
    return [StepTiming(r["step"], r["time"], r["step_seconds"], tuple(r["compute_s"]), tuple(r["comm_s"]))
            for r in rows]


KNOWN_UNSOLVED = {
    # The 2-H200 no-load control (batch 128 of ViT-L -> ResNet-152, host-bound micro-batches).
    # Its per-rank "compute" (CUDA events around kernels that queue behind NCCL receives) moves
    # between the ranks with the step time unchanged: steps 25-47 rank 0 +50% (the step +35%),
    # steps 77-120 rank 1 +45% (the step +0-5%). The step-62 flag of old (rank 1, 1.71, the two
    # ranks swapping ~0.09 s) is gone (net_compute_ratios), but these two are still flagged; the
    # fix is per-rank own-time measurement (issue #15 item 5), not a detector threshold: a
    # 1.5x change of one rank is what a real fault looks like too.
    "h200x2_failover_no_load",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    n in KNOWN_UNSOLVED, reason="per-rank CUDA compute moves between ranks (see KNOWN_UNSOLVED)", strict=True))
    for n in sorted(INDEX)])
def test_real_fault_free_streams_raise_no_false_detection(name):
    on_gpu = name.startswith("h200")
    detector = SlowdownDetector(DetectorConfig(alone_threshold=GPU_ALONE) if on_gpu else None)
    if INDEX[name]["expected_compute_s"]:
        detector.set_expected(INDEX[name]["expected_compute_s"])
    assert feed(detector, recorded(name)) == [], name


def test_the_two_h200_ranks_swapping_compute_is_no_longer_flagged_at_step_62():
    detector = SlowdownDetector()
    events = feed(detector, [r for r in recorded("h200x2_failover_no_load") if r.step <= 70])
    assert not [e for e in events if e.rank == 1], events


def test_the_recorded_no_load_stream_has_over_100_steps_and_all_streams_500():
    assert INDEX["h200x2_failover_no_load"]["steps"] == 120
    assert sum(meta["steps"] for meta in INDEX.values()) >= 500


@pytest.mark.parametrize("onset, factor", [(20, 2.0), (25, 3.0), (30, 3.0), (30, 4.0)])
def test_a_slowdown_from_an_early_step_is_detected_within_10_steps(onset, factor):
    for num_ranks in (2, 3, 4):
        records = stream(num_ranks, 150, seed=onset + num_ranks, compute_slow=[Slow(1, factor, start=onset)])
        events = feed(SlowdownDetector(), records)
        assert summary(events) == [(1, COMPUTE, SLOWDOWN)], f"K={num_ranks}"
        assert events[0].detected_step - onset <= 10, f"K={num_ranks}: {events[0]}"


def test_an_intermittent_slowdown_from_step_30_is_detected_within_10_steps():
    bursts = [Slow(2, 3.0, start, start + 10) for start in range(30, 150, 20)]
    events = feed(SlowdownDetector(), stream(3, 150, seed=3, compute_slow=bursts))
    first = events[0]
    assert (first.rank, first.kind, first.event) == (2, COMPUTE, SLOWDOWN) and first.detected_step - 30 <= 10


def test_a_device_slow_from_step_0_is_found_from_the_plan_and_its_peers():
    expected = [0.4, 0.5, 0.3]  # the plan's per-step compute of each rank
    records = stream(3, 120, seed=8, noise=0.1, spike_prob=0.0)
    scale = [e / c for e, c in zip(expected, records[0].compute_s)]  # make the plan exact up to noise
    records = [replace(r, compute_s=tuple(c * s * (5.0 if rank == 1 else 1.0)
                                         for rank, (c, s) in enumerate(zip(r.compute_s, scale))))
               for r in records]
    assert feed(SlowdownDetector(), records) == [], "without the plan a device slow from the start is its normal"
    detector = SlowdownDetector()
    detector.set_expected(expected)
    events = feed(detector, records)
    assert summary(events) == [(1, COMPUTE, SLOWDOWN)] and detector.prior_replaced == (1,)
    assert events[0].ratio > 4.0


def test_prior_check_replaces_only_a_rank_far_slower_than_its_peers_against_the_plan():
    learned = [0.2, 0.9, 0.3]
    assert prior_checked(learned, [0.1, 0.1, 0.15], 4.0) == ([0.2, pytest.approx(0.2), 0.3], [1])
    assert prior_checked(learned, [0.1, 0.3, 0.15], 4.0) == (learned, [])  # the plan expected it
    assert prior_checked(learned, None, 4.0) == (learned, [])
    assert prior_checked([0.5], [0.1], 4.0) == ([0.5], [])  # no peers
    assert prior_checked([0.5], [0.1], 4.0, alone_threshold=1.5) == ([0.1], [0])  # no peers: the plan
    assert prior_checked([0.14], [0.1], 4.0, alone_threshold=1.5) == ([0.14], [])  # within the plan's error
    assert prior_checked([0.9, 0.3], [0.1, 0.1], None, alone_threshold=1.5) == ([0.9, 0.3], [])  # peers: not alone


@pytest.mark.parametrize("name", sorted(n for n, meta in FAULT_INDEX.items() if meta["onset_step"] <= 10))
def test_a_lone_gpu_slow_from_step_5_in_a_recorded_h200_run_is_found_from_the_plan(name):
    """Recorded on an H200 (K = 1, tests/data/fault_streams): a device 2x slower from step 5 on,
    before the detector's warm-up ended. Judged against its own first steps it was its normal (the
    run logged no detection and calibrated its profile by 1.98x); judged against the plan, it is
    slow, and the detection dates it from the first step the detector sees."""
    meta = FAULT_INDEX[name]
    records = recorded(name, FAULT_STREAMS)
    assert feed(SlowdownDetector(DetectorConfig(alone_threshold=None)), records) == []
    detector = SlowdownDetector(DetectorConfig(alone_threshold=GPU_ALONE))
    detector.set_expected(meta["expected_compute_s"])
    events = feed(detector, records)
    assert summary(events) == [(meta["slow_rank"], COMPUTE, SLOWDOWN)] and detector.prior_replaced == (0,)
    assert events[0].ratio == pytest.approx(meta["factor"], rel=0.1)
    warmup = detector.config.warmup_steps
    assert events[0].onset_step <= warmup + 1, events[0]  # the first step after the warm-up


def test_a_lone_device_within_the_plans_error_is_not_slow():
    records = stream(1, 80, seed=2, noise=0.05, spike_prob=0.0)
    measured = median(r.compute_s[0] for r in records)
    for factor, found in ((1.1, False), (1.4, False), (2.0, True)):  # measured / plan
        detector = SlowdownDetector(DetectorConfig(alone_threshold=1.5))
        detector.set_expected([measured / factor])
        assert bool(feed(detector, records)) is found, factor


def test_compute_that_moved_between_ranks_is_not_a_slowdown():
    # rank 0 measures 0.09 s less, rank 1 0.09 s more: the step did not change
    assert net_compute_ratios([0.45, 1.8], [0.18, 0.11], margin=0.25) == pytest.approx([0.45, 1.8 - 0.099 / 0.11])
    assert net_compute_ratios([1.0, 2.0], [0.18, 0.11], margin=0.25) == [1.0, 2.0]  # no peer dropped
    records = stream(2, 200, seed=4, spike_prob=0.0, noise=0.05)
    swapped = [replace(r, compute_s=(r.compute_s[0] * 0.5, r.compute_s[1] + r.compute_s[0] * 0.5))
               if 60 <= r.step < 90 else r for r in records]
    assert feed(SlowdownDetector(), swapped) == []


def test_config_rejects_bad_new_keys():
    with pytest.raises(ValueError, match="prior_threshold"):
        DetectorConfig(prior_threshold=1.0)
    for bad in (1.0, 0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alone_threshold"):
            DetectorConfig(alone_threshold=bad)
    with pytest.raises(ValueError, match="refine_window"):
        DetectorConfig(refine_window=-1)
