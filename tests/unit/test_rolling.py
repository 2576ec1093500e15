"""The detector's fast window statistics give exactly the answers of the plain computations they
replaced (synapse.detection.rolling, window.column_medians/current_levels, the cached wander
blocks, medians_without_each), on random streams and on every recorded stream in tests/data.

Regenerate the recorded digests only for a change meant to alter detections:
``python tests/unit/test_rolling.py --regenerate`` (and say why in the commit)."""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import sys
from collections import deque
from pathlib import Path
from statistics import median

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.detection import DetectorConfig, PeerWander, SlowdownDetector, StepTiming, current_level
from synapse.detection.baseline import (
    medians_without_each,
    net_compute_ratio_rows,
    net_compute_ratios,
    peer_ratio_rows,
    robust_sd,
)
from synapse.detection.rolling import SortedWindow, _kth_deviation, median_along, robust_sd_rows
from synapse.detection.waiting import peer_ratios
from synapse.detection.window import VECTOR_FROM_RANKS, column_medians, current_levels

DATA = Path(__file__).resolve().parents[1] / "data"
DIGESTS = DATA / "detector_replay_digests.json"
# Every call a simulated run of 16 ranks made on its detector (4 x 4 and 16 x 1, 450 steps, rank 5
# 3x slower at steps 150-250, the decision carried out): enough ranks for its all-ranks-at-once paths
SIMULATED = DATA / "simulated_detector_calls"
STREAM_FOLDERS = ("fault_free_streams", "fault_streams", "wandering_host_streams")
# repeated values and both zeros, where ties and signs could tell two computations apart
values = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 1.25, 2.0]), st.floats(-1e6, 1e6, allow_nan=False))


def plain_robust_sd(window: list[float]) -> float:
    center = median(window)
    return 1.4826 * median([abs(v - center) for v in window])


def same(a: float, b: float) -> bool:
    """Equal to the bit (0.0 and -0.0 told apart)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@settings(max_examples=150, deadline=None)
@given(st.lists(values, min_size=1, max_size=250), st.one_of(st.none(), st.integers(0, 40)))
def test_a_sorted_window_reads_the_same_median_and_robust_sd_as_sorting_afresh(stream, maxlen):
    window, plain = SortedWindow(maxlen=maxlen), deque(maxlen=maxlen)
    for value in stream:
        window.append(value)
        plain.append(value)
        assert list(window) == list(plain) and len(window) == len(plain)
        if plain:
            assert same(window.median(), median(plain))
            assert same(window.robust_sd(), plain_robust_sd(list(plain)))
            assert same(robust_sd(list(plain)), plain_robust_sd(list(plain)))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 2 * VECTOR_FROM_RANKS), st.data())
def test_all_ranks_at_once_read_the_same_as_one_rank_at_a_time(steps, ranks, data):
    rows = [data.draw(st.lists(values, min_size=ranks, max_size=ranks)) for _ in range(steps)]
    columns = [list(c) for c in zip(*rows)]
    # Equal as numbers; only the sign of a zero may differ: among equal 0.0 and -0.0, numpy's selection
    # (not stable) may pick the other one than a stable sort. No comparison, sum or product tells them
    # apart, and a window median is never a divisor unguarded (max(x, tiny)).
    assert column_medians(rows) == [median(c) for c in columns]
    if steps >= 2:
        assert current_levels(rows) == [current_level(c) for c in columns]


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=0, max_size=3 * VECTOR_FROM_RANKS))
def test_each_rank_s_peers_median_is_the_median_without_it(stream):
    expected = [median(stream[:i] + stream[i + 1:]) if len(stream) > 1 else None for i in range(len(stream))]
    got = medians_without_each(stream)
    assert [g is None for g in got] == [e is None for e in expected]
    assert all(same(g, e) for g, e in zip(got, expected) if e is not None)


def plain_spread(wander: PeerWander, rank: int) -> float | None:
    """`PeerWander.spread` as it was computed before its blocks were cached."""
    seen = list(wander.history[rank])
    if len(seen) < 4:
        return None
    blocks = [median(seen[i:i + wander.window]) for i in range(0, len(seen) - wander.window + 1, wander.window)]
    if len(blocks) >= 4:
        return plain_robust_sd(blocks)
    return 2.0 * 1.2533 * plain_robust_sd(seen) / math.sqrt(wander.window)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0.5, 2.0), min_size=4, max_size=4), st.sets(st.integers(0, 3))),
                min_size=1, max_size=150), st.integers(0, 149))
def test_the_wander_s_cached_blocks_give_the_spread_of_the_plain_blocks(steps, carry_at):
    wander = PeerWander(window=5, keep=60, z=5.0)
    wander.reset(4)
    for index, (ratios, calm) in enumerate(steps):
        if index == carry_at:  # a re-partition (ranks reordered) or a restart (state reloaded)
            wander.carried([1, 0, 3, 2], fresh=[]) if index % 2 else wander.load_state_dict(wander.state_dict())
        wander.observe(ratios, sorted(calm))
        for rank in range(4):
            got, expected = wander.spread(rank), plain_spread(wander, rank)
            assert got == expected if expected is None else same(got, expected)


def replay_digests() -> dict[str, str]:
    """Per recorded stream and detector setting: a digest of every step's events and ratios and
    of the final state (baselines, samples, wander), so any changed answer shows."""
    digests = {}
    settings_ = {"default": DetectorConfig(), "gpu": DetectorConfig(alone_threshold=1.35),
                 "demo": DetectorConfig(prior_threshold=2.5), "no_trend": DetectorConfig(trend=False, refine_window=20)}
    for folder in STREAM_FOLDERS:
        index = json.loads((DATA / folder / "index.json").read_text())
        for path in sorted((DATA / folder).glob("*.jsonl")):
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            for name, config in settings_.items():
                detector, digest = SlowdownDetector(config), hashlib.sha256()
                if index.get(path.stem, {}).get("expected_compute_s"):
                    detector.set_expected(index[path.stem]["expected_compute_s"])
                for r in rows:
                    events = detector.update(StepTiming(r["step"], r["time"], r["step_seconds"], tuple(r["compute_s"]),
                                                        tuple(r["comm_s"])))
                    digest.update(repr([e.to_dict() for e in events]).encode())
                    digest.update(repr(detector.latest_ratios).encode())
                digest.update(json.dumps(detector.state_dict(), sort_keys=True).encode())
                digests[f"{folder}/{path.stem}/{name}"] = digest.hexdigest()
    return digests


def test_the_recorded_streams_give_the_same_detections_ratios_and_state_as_before():
    """Digests taken with the detector before its windows were made incremental (main at a574c85)."""
    expected = json.loads(DIGESTS.read_text())
    got = replay_digests()
    assert sorted(got) == sorted(expected), "a recorded stream was added or removed: regenerate (see module doc)"
    changed = [name for name in expected if got[name] != expected[name]]
    assert not changed, f"these replays changed: {changed}"


@settings(max_examples=150, deadline=None)
@given(st.lists(values, min_size=1, max_size=250), st.integers(0, 300), st.integers(0, 300))
def test_a_hinted_deviation_search_finds_what_the_plain_one_finds(stream, k_seed, hint):
    ordered = sorted(stream)
    center = median(ordered)
    split = sum(1 for v in ordered if v < center)
    k = k_seed % len(ordered)
    assert _kth_deviation(ordered, center, split, k, hint) == _kth_deviation(ordered, center, split, k)
    assert _kth_deviation(ordered, center, split, k)[0] == sorted(abs(v - center) for v in ordered)[k]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 30), st.data())
def test_the_all_rows_readings_are_the_per_row_ones(rows, width, data):
    table = [data.draw(st.lists(values, min_size=width, max_size=width)) for _ in range(rows)]
    array = np.array(table, dtype=np.float64)
    sds = robust_sd_rows(array).tolist()
    assert all(same(got, plain_robust_sd(row)) for got, row in zip(sds, table))
    peers = peer_ratio_rows(array).tolist()
    assert all(same(g, e) for got, row in zip(peers, table) for g, e in zip(got, peer_ratios(row)))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.sampled_from([(1, 12), (12, 1), (3, 4), (2, 5), None]), st.floats(0.0, 0.9),
       st.data())
def test_net_compute_ratios_of_all_rows_are_the_per_row_ones(rows, mesh, margin, data):
    n = 12 if mesh is None else mesh[0] * mesh[1]
    ratios = st.one_of(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.25]), st.floats(0.0, 5.0))
    table = [data.draw(st.lists(ratios, min_size=n, max_size=n)) for _ in range(rows)]
    baseline = data.draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-12, 10.0)), min_size=n, max_size=n))
    pipelines = None if mesh is None else [list(range(r * mesh[1], (r + 1) * mesh[1])) for r in range(mesh[0])]
    if mesh == (3, 4):  # pipelines of unequal length, ranks out of order
        pipelines = [[0, 5, 2], [1, 3, 4, 6, 7, 8], [11, 10, 9]]
    got = net_compute_ratio_rows(np.array(table, dtype=np.float64), baseline, margin, pipelines).tolist()
    for got_row, row in zip(got, table):
        assert all(same(g, e) for g, e in zip(got_row, net_compute_ratios(row, baseline, margin, pipelines)))


def test_net_compute_ratios_of_64_ranks_sum_their_pipelines_shortfalls_in_rank_order():
    """Half the peers far below their baselines, half far above (so that the net ratios stay above 0): a
    sum of many rounded terms, whose order shows in the last bits."""
    rng = np.random.default_rng(7)
    table = np.where(rng.random((50, 64)) < 0.5, rng.uniform(0.0, 0.7, (50, 64)), rng.uniform(20.0, 100.0, (50, 64)))
    baseline = rng.uniform(0.5, 1.0, 64).tolist()
    for pipelines in (None, [list(range(r * 8, r * 8 + 8)) for r in range(8)]):
        got = net_compute_ratio_rows(table, baseline, 0.25, pipelines).tolist()
        for got_row, row in zip(got, table.tolist()):
            assert all(same(g, e) for g, e in zip(got_row, net_compute_ratios(row, baseline, 0.25, pipelines)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0.5, 2.0), min_size=12, max_size=12), st.sets(st.integers(0, 11))),
                min_size=1, max_size=120))
def test_the_wander_floors_of_many_ranks_at_once_are_the_per_rank_ones(steps):
    wander = PeerWander(window=5, keep=40, z=5.0)
    wander.reset(12)
    for ratios, calm in steps:
        wander.observe(ratios, sorted(calm))
        spreads = [plain_spread(wander, rank) for rank in range(12)]
        expected = [1.15 if sd is None else max(1.15, min(1.6, 1.0 + 5.0 * sd)) for sd in spreads]
        assert all(same(g, e) for g, e in zip(wander.floors(1.15), expected))


def simulated_replay_digests() -> dict[str, str]:
    """Per recorded simulated run: a digest of every call's events, the ratios and active slowdowns
    after it, and the final state."""
    digests = {}
    for path in sorted(SIMULATED.glob("*.json.gz")):
        data = json.loads(gzip.decompress(path.read_bytes()))
        detector, digest = SlowdownDetector(DetectorConfig(**data["config"])), hashlib.sha256()
        for call in data["calls"]:
            args = [StepTiming(**call["args"][0])] if call["call"] == "update" else call["args"]
            out = getattr(detector, call["call"])(*args, **call["kwargs"])
            digest.update(repr([e.to_dict() for e in out or []]).encode())
            digest.update(repr((detector.latest_ratios, detector.active)).encode())
        digest.update(json.dumps(detector.state_dict(), sort_keys=True).encode())
        digests[path.name.removesuffix(".json.gz")] = digest.hexdigest()
    return digests


def test_simulated_runs_of_16_ranks_give_the_same_detections_ratios_and_state_as_before():
    """Digests taken with the detector on main at 96e4bbc, before its all-ranks-at-once signals,
    wander floors, hinted deviation searches and deferred comm spreads."""
    assert simulated_replay_digests() == json.loads((SIMULATED / "digests.json").read_text())


if __name__ == "__main__" and "--regenerate" in sys.argv:
    DIGESTS.write_text(json.dumps(replay_digests(), indent=1, sort_keys=True) + "\n")
elif __name__ == "__main__":
    pytest.main([__file__])


_MEDIAN_VALUES = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, math.inf, -math.inf, math.nan]),
                           st.floats(allow_nan=False, allow_infinity=False, width=64))


@settings(max_examples=400, deadline=None)
@given(rows=st.integers(1, 11), columns=st.integers(1, 20), axis=st.sampled_from([0, 1]),
       values=st.lists(_MEDIAN_VALUES, min_size=11 * 20, max_size=11 * 20))
def test_median_along_an_axis_is_numpys_median_bit_for_bit(rows, columns, axis, values):
    """The detector's window medians: the same bits as np.median, signed zeros (its sum starts from
    +0.0), ties, infinities and NaN included; odd and even counts."""
    array = np.array(values[: rows * columns]).reshape(rows, columns)
    with np.errstate(invalid="ignore"):
        assert median_along(array, axis).tobytes() == np.median(array, axis=axis).tobytes()
