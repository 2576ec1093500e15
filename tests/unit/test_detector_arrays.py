"""The detector's all-ranks-at-once state and readings give exactly the answers of the plain per-rank
ones they stand in for: the waiting rule's and the own-link signals of all ranks in one numpy pass, the
wander's waiting steps and block medians in numpy rings, and the whole detector on random streams of
12 ranks against itself with every all-ranks path turned off (the per-rank paths few ranks take).

"Exactly": equal to the bit, 0.0 and -0.0 told apart, on values with ties and signed zeros."""
from __future__ import annotations

import json
import math
from collections import deque
from statistics import median

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synapse.detection.detector as detector_module
import synapse.detection.window as window_module
from synapse.detection import DetectorConfig, PeerWander, SlowdownDetector, StepTiming, own_comm_per_step
from synapse.detection.link import LinkBaseline
from synapse.detection.rolling import sorted_robust_sd
from synapse.detection.waiting import own_comm_rows
from synapse.detection.wander import DELAY_WINDOWS, FLOOR_CAP, MIN_BLOCKS, PRIOR_FACTOR

values = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 1.25, -0.5]), st.floats(-1e3, 1e3, allow_nan=False))
seconds = st.one_of(st.sampled_from([0.0, -0.0, 0.005, 0.01]), st.floats(0.0, 1.0, allow_nan=False))


def same(a: float, b: float) -> bool:
    """Equal to the bit (0.0 and -0.0 told apart)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def same_rows(got: np.ndarray, expected: list[list[float]]) -> bool:
    return all(same(g, e) for row, plain in zip(got.tolist(), expected) for g, e in zip(row, plain))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.integers(2, 20), st.data())
def test_the_waiting_rule_of_all_rows_at_once_is_the_per_step_one(rows, width, data):
    compute = [data.draw(st.lists(values, min_size=width, max_size=width)) for _ in range(rows)]
    comm = [data.draw(st.lists(values, min_size=width, max_size=width)) for _ in range(rows)]
    beyond_comm, beyond_step = own_comm_rows(np.array(compute), np.array(comm))
    plain = [own_comm_per_step(c, m) for c, m in zip(compute, comm)]
    assert same_rows(beyond_comm, [p[0] for p in plain]) and same_rows(beyond_step, [p[1] for p in plain])


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.integers(1, 20), st.sampled_from([0.0, 0.005]), st.data())
def test_own_link_signals_of_all_rows_at_once_are_the_per_step_ones(rows, width, min_comm_s, data):
    link = LinkBaseline(baseline_window=1, refine_window=10, min_comm_s=min_comm_s, prior_threshold=None)
    link.learn(data.draw(st.lists(seconds, min_size=width, max_size=width)))
    sends = [data.draw(st.lists(seconds, min_size=width, max_size=width)) for _ in range(rows)]
    excess, ratios = link.excess_and_ratio_rows(np.array(sends))
    assert same_rows(excess, [link.excess(s) for s in sends])
    assert same_rows(ratios, [link.ratios(link.excess(s)) for s in sends])
    assert all(same(d, link.denominator(r)) for r, d in enumerate(link.denominators().tolist()))


class PlainWander:
    """`PeerWander` as it was, one deque per rank: the waiting steps, the history, and each spread
    from the history's blocks read afresh (statistics.median, robust sd by sorting)."""

    def __init__(self, window: int, keep: int, z: float, num_ranks: int) -> None:
        self.window, self.keep, self.z = window, keep, z
        self.history: list[deque[float]] = [deque(maxlen=keep) for _ in range(num_ranks)]
        self.waiting: list[deque[float]] = [deque() for _ in range(num_ranks)]

    def observe(self, ratios: list[float], calm: list[int]) -> None:
        for rank in range(len(self.history)):
            if rank not in calm:
                self.waiting[rank].clear()
                continue
            others = [ratios[p] for p in calm if p != rank]
            if others:
                self.waiting[rank].append(ratios[rank] / max(median(others), 1e-9))
                if len(self.waiting[rank]) > DELAY_WINDOWS * self.window:
                    self.history[rank].append(self.waiting[rank].popleft())

    def carried(self, mapping: list[int], fresh: list[int]) -> None:
        self.history = [deque(() if new in fresh else self.history[old], maxlen=self.keep)
                        for new, old in enumerate(mapping)]
        self.waiting = [deque() for _ in self.history]

    def floors(self, least: float) -> list[float]:
        floors = []
        for seen in map(list, self.history):
            blocks = [median(seen[i:i + self.window]) for i in range(0, len(seen) - self.window + 1, self.window)]
            if len(seen) < 4:
                floors.append(least)
                continue
            if len(blocks) >= MIN_BLOCKS:
                sd = sorted_robust_sd(sorted(blocks))[0]
            else:
                sd = PRIOR_FACTOR * 1.2533 * sorted_robust_sd(sorted(seen))[0] / math.sqrt(self.window)
            floors.append(max(least, min(FLOOR_CAP, 1.0 + self.z * sd)))
        return floors


# the ranks not calm at a step: mostly none or a few (so ranks wait long enough to count), at times
# all but one (a calm rank without calm peers neither waits nor drops its waiting steps) or all
not_calm = st.one_of(st.just(set()), st.sets(st.integers(0, 11), max_size=1),
                     st.sets(st.integers(0, 11), min_size=11, max_size=11), st.just(set(range(12))))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([0.5, 0.9, 1.0, 1.0, 1.1, 2.0, 0.0]) | st.floats(0.0, 3.0),
                                   min_size=12, max_size=12), not_calm), min_size=30, max_size=160),
       st.integers(0, 159), st.sampled_from(["carry", "reload", "none"]))
def test_the_wander_s_rings_give_the_plain_per_rank_wander(steps, event_at, event):
    """12 ranks (the all-ranks paths), a short history (keep 50: it fills and moves on), ties and
    zeros among the ratios, calm sets of every size, and a re-partition (ranks reordered, one on a
    fresh device) or a restart (state reloaded) midway."""
    window, keep = 5, 50
    wander, plain = PeerWander(window, keep, 5.0), PlainWander(window, keep, 5.0, 12)
    wander.reset(12)
    for index, (ratios, excluded) in enumerate(steps):
        calm = set(range(12)) - excluded
        if index == event_at and event == "carry":
            mapping = [11 - r for r in range(12)]
            wander.carried(mapping, fresh=[3])
            plain.carried(mapping, fresh=[3])
        elif index == event_at and event == "reload":
            wander.load_state_dict(json.loads(json.dumps(wander.state_dict())))
            plain.waiting = [deque() for _ in plain.history]  # a restart's waiting steps start empty
        wander.observe(ratios, sorted(calm))
        plain.observe(ratios, sorted(calm))
        assert [list(h) for h in wander.history] == [list(h) for h in plain.history]
        assert all(same(g, e) for g, e in zip(wander.floors(1.15), plain.floors(1.15)))


def random_stream(seed: int, ranks: int, steps: int) -> list[StepTiming]:
    """Compute and comm per rank with noise, ties (values on a grid), one rank's compute 2x for a
    stretch and another's own sends 4x (+40 ms) for another, every rank 0.5x for a step now and then
    (time moving between clocks); own send seconds for odd seeds."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.05, 0.2, ranks)
    timings, wall = [], 0.0
    slow_rank, slow_from = int(rng.integers(ranks)), int(rng.integers(60, steps - 150))
    link_rank, link_from = (slow_rank + 5) % ranks, slow_from + 80
    for step in range(1, steps + 1):
        compute = base * np.round(1.0 + rng.normal(0.0, 0.03, ranks), 2)
        if slow_from <= step < slow_from + 40:
            compute[slow_rank] *= 2.0
        if step % 97 == 0:
            compute *= 0.5
        send = np.round(rng.uniform(0.004, 0.012, ranks), 3)
        if link_from <= step < link_from + 40:
            send[link_rank] = 4.0 * send[link_rank] + 0.04
        comm = send + rng.uniform(0.0, 0.02, ranks)
        step_s = float(np.max(compute + comm))
        wall += step_s
        timings.append(StepTiming(step, wall, step_s, tuple(compute.tolist()), tuple(comm.tolist()),
                                  send_s=tuple(send.tolist()) if seed % 2 else None))
    return timings


def kept_signals(detector: SlowdownDetector) -> list[dict[str, list[float]]]:
    """The per-step signals the detector holds for its history (those computed so far, none computed
    here: a signal is relative to the baseline of when it was computed)."""
    history = detector._history  # noqa: SLF001  (the cache is what is compared)
    return [{name: (entry.rows[name].tolist() if name in entry.rows else entry.signals[name])
             for name in sorted({*entry.rows, *entry.signals})} for entry in history]


def run_detector(timings: list[StepTiming], pipelines: list[list[int]]) -> list[str]:
    """Every step's events, ratios and active slowdowns, and the state every 50 steps and at the end."""
    detector, seen = SlowdownDetector(DetectorConfig(prior_threshold=2.5)), []
    stages = len(pipelines[0])  # rank r runs stage r % stages of replica r // stages
    detector.set_replicas([[p[r % stages] for p in pipelines] for r in range(len(timings[0].compute_s))], pipelines)
    for timing in timings:
        events = detector.update(timing)
        seen.append(repr(([e.to_dict() for e in events], detector.latest_ratios, detector.active)))
        if timing.step % 50 == 0:
            seen.append(json.dumps(detector.state_dict(), sort_keys=True))
            seen.append(repr(kept_signals(detector)))
    seen.append(json.dumps(detector.state_dict(), sort_keys=True))
    return seen


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_detector_of_12_ranks_answers_as_its_per_rank_paths_do(seed, monkeypatch):
    """The same detector with its all-ranks-at-once signals and window readings turned off (as for
    fewer than 8 ranks): every step's events and ratios and the states are the same. Odd seeds carry
    own send seconds (the link rule), even ones not (the waiting rule); 3 pipelines of 4 ranks."""
    timings = random_stream(seed, 12, 400)
    pipelines = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    at_once = run_detector(timings, pipelines)
    monkeypatch.setattr(detector_module, "VECTOR_FROM_RANKS", 10**9)
    monkeypatch.setattr(window_module, "VECTOR_FROM_RANKS", 10**9)
    per_rank = run_detector(timings, pipelines)
    found = "".join(at_once)
    assert "'kind': 'compute', 'event': 'slowdown'" in found and "'kind': 'comm', 'event': 'slowdown'" in found, \
        "the stream must hold a compute and a comm slowdown for the comparison to mean something"
    assert len(at_once) == len(per_rank)
    changed = [i for i, (a, b) in enumerate(zip(at_once, per_rank)) if a != b]
    assert not changed, f"first difference at record {changed[0]}: {at_once[changed[0]][:300]} != " \
                        f"{per_rank[changed[0]][:300]}"
