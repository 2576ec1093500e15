"""Issue #15 item 2: a slow link is attributed to its rank from each rank's own send time (pure).

The streams model a K-stage pipeline (the cost model's step formula) whose runtime records,
besides compute and comm = step - compute (waiting included), each rank's own send work
``send_s``: a few hundred microseconds of posting, plus what a slow link on that rank adds.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
from test_detector import Slow, feed, summary

from synapse.detection import (
    COMM,
    COMPUTE,
    SLOWDOWN,
    SlowdownDetector,
    StepTiming,
    link_send_seconds,
    peer_checked_send,
)
from synapse.injection import FaultSpec, InjectionError


def link_stream(num_ranks: int, num_steps: int, seed: int, *, link_slow=(), compute_slow=(),
                link_extra_s: float = 0.15, microbatches: int = 4, noise: float = 0.15,
                spike_prob: float = 0.01) -> list[StepTiming]:
    """``link_slow``: Slow(rank, 1.0 or anything, start, end) adds ``link_extra_s`` per step to that
    rank's own sends (and so to its stage time); ``compute_slow`` multiplies compute."""
    rng = random.Random(seed)
    base_compute = [rng.uniform(0.03, 0.06) for _ in range(num_ranks)]
    wall, records = 1.7e9, []
    for step in range(num_steps):
        spike = [3.0 if rng.random() < spike_prob else 1.0 for _ in range(num_ranks)]
        compute = [base_compute[r] * rng.uniform(1 - noise, 1 + noise) * spike[r]
                   * max([s.factor_at(r, step) for s in compute_slow] + [1.0]) for r in range(num_ranks)]
        send = [3e-4 * rng.uniform(0.5, 1.5) * (30.0 if rng.random() < spike_prob else 1.0)
                + sum(link_extra_s for s in link_slow if s.factor_at(r, step) != 1.0) for r in range(num_ranks)]
        per_micro = [(c + x) / microbatches for c, x in zip(compute, send)]
        step_s = sum(per_micro) + (microbatches - 1) * max(per_micro)
        wall += step_s
        records.append(StepTiming(step, wall, step_s, tuple(compute), tuple(step_s - c for c in compute),
                                  tuple(send)))
    return records


def without_send(records):
    return [replace(r, send_s=None) for r in records]


@pytest.mark.parametrize("num_ranks, rank", [(2, 0), (3, 1), (3, 0), (4, 2)])
def test_a_slow_link_is_attributed_to_its_rank_within_10_steps(num_ranks, rank):
    records = link_stream(num_ranks, 150, seed=num_ranks + rank, link_slow=[Slow(rank, 2.0, start=30)])
    events = feed(SlowdownDetector(), records)
    assert summary(events) == [(rank, COMM, SLOWDOWN)], events
    assert events[0].detected_step - 30 <= 10 and events[0].onset_step == 30


def test_the_same_slow_link_without_own_send_time_is_not_attributed():
    # control: with comm = step - compute alone every rank waits alike, and no rank is blamed
    records = link_stream(3, 150, seed=4, link_slow=[Slow(1, 2.0, start=30)])
    assert [e for e in feed(SlowdownDetector(), without_send(records)) if e.kind == COMM and e.rank == 1] == []


def test_a_slow_compute_is_not_read_as_a_slow_link():
    records = link_stream(3, 150, seed=5, compute_slow=[Slow(2, 3.0, start=30)])
    assert summary(feed(SlowdownDetector(), records)) == [(2, COMPUTE, SLOWDOWN)]


@pytest.mark.slow  # 2000 noisy steps through the detector
def test_2000_noisy_fault_free_steps_with_own_send_time_raise_nothing():
    for seed in range(4):
        records = link_stream(3, 500, seed=100 + seed, spike_prob=0.03)
        assert feed(SlowdownDetector(), records) == [], seed


def test_a_link_slow_from_step_0_is_found_from_its_peers():
    records = link_stream(3, 80, seed=6, link_slow=[Slow(2, 2.0, start=0)])
    detector = SlowdownDetector()
    events = feed(detector, records)
    assert summary(events) == [(2, COMM, SLOWDOWN)] and detector._link.replaced == (2,)
    assert peer_checked_send([3e-4, 0.15, 2e-4], 4.0, 0.005) == ([3e-4, 2.5e-4, 2e-4], [1])
    assert peer_checked_send([3e-4, 3e-3, 2e-4], 4.0, 0.005)[1] == []  # 10x but below min_comm_s: noise


def test_a_link_slowdown_follows_its_device_over_a_repartition_and_a_restart():
    # regression: a live re-plan with a link slowdown active crashed rebase() (no comm_scale)
    records = link_stream(3, 200, seed=7, link_slow=[Slow(1, 2.0, start=30)])
    detector = SlowdownDetector()
    feed(detector, records[:60])
    assert [(d.rank, d.kind) for d in detector.active] == [(1, COMM)]
    assert detector.rebase([0.8, 1.1, 1.2], None, previous_rank=[0, 1, 2]) == []
    restored = SlowdownDetector()
    restored.load_state_dict(detector.state_dict())
    assert feed(restored, records[60:140]) == []  # still slow: not re-learnt as normal, no new event
    assert [(d.rank, d.kind) for d in restored.active] == [(1, COMM)]


def test_link_send_seconds_puts_each_ranks_sends_on_the_link_the_cost_model_charges():
    ranks = [{"send_fwd": 0.1, "send_bwd": 0.0}, {"send_fwd": 0.2, "send_bwd": 0.03},
             {"send_fwd": 0.0, "send_bwd": 0.5}]
    # link 0 carries rank 0's forward and rank 1's backward sends; link 1 rank 1's forward and rank 2's backward
    assert link_send_seconds(ranks) == pytest.approx([0.13, 0.7, 0.0])
    assert link_send_seconds([{"compute": 1.0}]) is None and link_send_seconds(None) is None


def test_step_timing_carries_send_s_and_checks_it():
    record = StepTiming(3, 10.0, 1.0, (0.5, 0.5), (0.5, 0.5), (0.01, 0.2))
    assert StepTiming.from_json_line(record.to_json_line()) == record
    assert StepTiming.from_dict({**record.to_dict(), "send_s": None}).send_s is None
    with pytest.raises(ValueError, match="send_s has 1 ranks"):
        StepTiming(3, 10.0, 1.0, (0.5, 0.5), (0.5, 0.5), (0.01,))


def test_a_bandwidth_limited_slow_link_delays_each_send_by_its_bytes():
    spec = FaultSpec.from_config({"kind": "slow_comm", "rank": 1, "start": 30, "bytes_per_s": 1e6})
    assert spec.extra_seconds(30, None, nbytes=250_000) == pytest.approx(0.25)
    assert spec.extra_seconds(29, None, nbytes=250_000) == 0.0
    assert spec.describe()["bytes_per_s"] == 1e6
    with pytest.raises(InjectionError, match="exactly one of"):
        FaultSpec.from_config({"kind": "slow_comm", "rank": 1, "start": 30, "bytes_per_s": 1e6, "seconds": 0.1})
    with pytest.raises(InjectionError, match="unknown key"):
        FaultSpec.from_config({"kind": "slow_compute", "rank": 1, "start": 30, "bytes_per_s": 1e6})
