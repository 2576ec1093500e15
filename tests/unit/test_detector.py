"""Slowdown detector and the StepTiming record, on synthetic seeded timing streams.

The streams model a K-stage pipeline with M micro-batches (per micro-batch
stage time t_r = (compute_r + transfer_r) / M, step = sum_r t_r + (M - 1) max_r t_r,
the cost model's formula) and two ways a runtime may account communication:

* ``waiting``:  comm_r = step - compute_r (all idle time is comm; the strict case)
* ``transfer``: comm_r = own transfer_r + the fill/drain bubble every rank waits
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from statistics import median

import numpy as np
import pytest

from synapse.detection import (
    COMM,
    COMPUTE,
    RECOVERY,
    SLOWDOWN,
    Detection,
    DetectorConfig,
    DetectorConfigError,
    DetectorInputError,
    SlowdownDetector,
    StepTiming,
    TimingRecordError,
    change_index,
    own_comm_per_step,
    read_step_timings,
)

CONFIG = DetectorConfig()  # the defaults are what the tests exercise
ONSET = 300


@dataclass(frozen=True)
class Slow:
    """Multiply `rank`'s compute or transfer time by `factor` on steps [start, end)."""

    rank: int
    factor: float
    start: int = ONSET
    end: int | None = None

    def factor_at(self, rank: int, step: int) -> float:
        hit = rank == self.rank and step >= self.start and (self.end is None or step < self.end)
        return self.factor if hit else 1.0


def stream(num_ranks: int, num_steps: int, seed: int, *, compute_slow=(), transfer_slow=(),
           model: str = "waiting", microbatches: int = 4, noise: float = 0.15, transfer_noise: float | None = None,
           spike_prob: float = 0.01, spike_factor: float = 3.0, first_step: int = 0) -> list[StepTiming]:
    rng = random.Random(seed)
    base_compute = [rng.uniform(0.3, 0.6) for _ in range(num_ranks)]
    base_transfer = [rng.uniform(0.1, 0.3) if num_ranks > 1 else 0.0 for _ in range(num_ranks)]
    wall, records = 1.7e9, []

    def draw(step: int, base: list[float], slows, rank: int, noise: float = noise) -> float:
        value = base[rank] * rng.uniform(1 - noise, 1 + noise)
        for slow in slows:
            value *= slow.factor_at(rank, step)
        return value * (spike_factor if rng.random() < spike_prob else 1.0)

    for step in range(first_step, first_step + num_steps):
        compute = [draw(step, base_compute, compute_slow, r) for r in range(num_ranks)]
        transfer = [draw(step, base_transfer, transfer_slow, r, transfer_noise or noise) for r in range(num_ranks)]
        per_micro = [(c + x) / microbatches for c, x in zip(compute, transfer)]
        step_s = sum(per_micro) + (microbatches - 1) * max(per_micro)
        if model == "waiting":
            comm = [step_s - c for c in compute]
        else:
            bubble = step_s - max(c + x for c, x in zip(compute, transfer))
            comm = [x + bubble for x in transfer]
        wall += step_s
        records.append(StepTiming(step, wall, step_s, tuple(compute), tuple(comm)))
    return records


def feed(detector: SlowdownDetector, records) -> list[Detection]:
    events = []
    for record in records:
        events += detector.update(record)
    return events


def summary(events) -> list[tuple[int, str, str]]:
    return [(e.rank, e.kind, e.event) for e in events]


# --------------------------------------------------------------- StepTiming
def test_step_timing_round_trips_through_json_lines_and_files(tmp_path):
    record = StepTiming(7, 1.7e9, 0.5, [0.3, 0.25], [0.1, 0.2])
    assert record.compute_s == (0.3, 0.25) and record.num_ranks == 2
    assert record.start_time == pytest.approx(1.7e9 - 0.5)
    assert StepTiming.from_json_line(record.to_json_line()) == record
    extra = dict(record.to_dict(), loss=1.23)  # a later runtime may add fields
    assert StepTiming.from_dict(extra) == record
    path = tmp_path / "performance.jsonl"
    other = StepTiming(8, 1.7e9 + 1, 0.6, [0.3, 0.3], [0.2, 0.2])
    path.write_text(record.to_json_line() + "\n\n" + other.to_json_line() + "\n")
    assert read_step_timings(path) == [record, other]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(step=-1), "step=-1"),
    (dict(step=True), "step=True"),
    (dict(step_seconds=-0.1), "step_seconds"),
    (dict(wall_time=math.nan), "wall_time"),
    (dict(compute_s=(0.1, -0.2)), "compute_s[1]"),
    (dict(comm_s=(0.1, math.inf)), "comm_s[1]"),
    (dict(comm_s=(0.1,)), "compute_s has 2 ranks but comm_s has 1"),
    (dict(compute_s=(), comm_s=()), "compute_s is empty"),
    (dict(compute_s="0.1"), "compute_s"),
    (dict(compute_s=(0.1, math.nan)), "compute_s[1]"),  # plain floats all: still each one checked
    (dict(send_s=(0.1, -math.inf)), "send_s[1]"),
    (dict(comm_s=(0.1, True)), "comm_s[1]=True"),
])
def test_step_timing_rejects_bad_values_naming_them(kwargs, needle):
    fields = dict(step=1, wall_time=10.0, step_seconds=1.0, compute_s=(0.5, 0.5), comm_s=(0.1, 0.1))
    with pytest.raises(TimingRecordError) as error:
        StepTiming(**{**fields, **kwargs})
    assert needle in str(error.value)


def test_step_timing_keeps_plain_floats_and_converts_other_numbers():
    timing = StepTiming(1, 10.0, 1.0, [0.5, -0.0, 2.0], (np.float64(0.25), 1, 0.0))
    assert timing.compute_s == (0.5, -0.0, 2.0) and math.copysign(1.0, timing.compute_s[1]) == -1.0
    assert timing.comm_s == (0.25, 1.0, 0.0)
    assert all(type(value) is float for value in (*timing.compute_s, *timing.comm_s))


def test_step_timing_from_dict_and_files_name_what_is_wrong(tmp_path):
    with pytest.raises(TimingRecordError, match=r"lacks \['comm_s'\]"):
        StepTiming.from_dict({"step": 1, "wall_time": 1.0, "step_seconds": 1.0, "compute_s": [1.0]})
    with pytest.raises(TimingRecordError, match="not a JSON object"):
        StepTiming.from_json_line("{oops")
    path = tmp_path / "performance.jsonl"
    path.write_text(StepTiming(1, 1.0, 1.0, [1.0], [0.0]).to_json_line() + "\n[1, 2]\n")
    with pytest.raises(TimingRecordError, match=r"performance.jsonl:2: .*JSON object"):
        read_step_timings(path)


# --------------------------------------------------------------- the config
@pytest.mark.parametrize("kwargs, needle", [
    (dict(warmup_steps=-1), "warmup_steps=-1"),
    (dict(baseline_window=0), "baseline_window=0"),
    (dict(window=2.5), "window=2.5"),
    (dict(sustain=True), "sustain=True"),
    (dict(threshold=1.0), "threshold=1.0"),
    (dict(threshold=math.nan), "threshold=nan"),
    (dict(peer_threshold=0.9), "peer_threshold=0.9"),
    (dict(min_comm_s=-0.001), "min_comm_s=-0.001"),
    (dict(wait_explain_factor=-1.0), "wait_explain_factor=-1.0"),
])
def test_config_rejects_out_of_range_values_naming_them(kwargs, needle):
    with pytest.raises(DetectorConfigError) as error:
        DetectorConfig(**kwargs)
    assert needle in str(error.value)


def test_config_derived_values():
    config = DetectorConfig(threshold=1.4, window=8, sustain=2, peer_threshold=None)
    assert config.recover_below == pytest.approx(1.2)
    assert config.history_len == 34


# ------------------------------------------------------------ pure helpers
@pytest.mark.parametrize("flags, expected", [
    ([False, False, True, True, True], 2),
    ([False, True, False, True, True, True], 3),  # a lone early True does not pull the onset forward
    ([True, True, True], 0),
    ([False, False, False], 2),  # nothing changed: the latest step
    ([True, False, True, False, True, True], 4),
])
def test_change_index_finds_the_start_of_the_sustained_run(flags, expected):
    assert change_index(flags) == expected


def test_waiting_never_reads_as_own_comm_when_comm_is_step_minus_compute():
    rng = random.Random(3)
    for num_ranks in range(2, 9):  # (K = 1 has nobody to wait for)
        for _ in range(200):
            compute = [rng.uniform(-0.3, 0.6) for _ in range(num_ranks)]  # excess over baseline
            step_excess = rng.uniform(-0.2, 1.0)
            comm = [step_excess - c for c in compute]
            _, beyond_step = own_comm_per_step(compute, comm)
            assert max(beyond_step) <= 1e-12


def test_own_comm_isolates_a_rank_whose_transfers_got_slower():
    shared_wait, own_extra = 0.4, 0.25
    comm = [shared_wait, shared_wait + own_extra, shared_wait, shared_wait]
    beyond_comm, beyond_step = own_comm_per_step([0.0] * 4, comm)
    assert beyond_comm == pytest.approx([0.0, own_extra, 0.0, 0.0])
    assert beyond_step == pytest.approx([0.0, own_extra, 0.0, 0.0])


# ---------------------------------------------------------- false positives
@pytest.mark.slow  # 2000 noisy steps through the detector, per kind
@pytest.mark.parametrize("model", ["waiting", "transfer"])
def test_no_false_positives_over_2000_noisy_steps_with_spikes(model):
    for num_ranks in range(1, 9):
        records = stream(num_ranks, 2000, seed=10 + num_ranks, model=model, spike_prob=0.02)
        for index in range(150, 2000, 173):  # also: everybody 3x for one step (e.g. a GC pause)
            r = records[index]
            records[index] = replace(r, compute_s=tuple(3 * c for c in r.compute_s),
                                     comm_s=tuple(3 * c for c in r.comm_s))
        detector = SlowdownDetector()
        assert feed(detector, records) == [], f"K={num_ranks}"
        assert len(detector.latest_ratios[COMPUTE]) == num_ranks  # it did evaluate


@pytest.mark.slow  # thousands of noisy steps through the detector
def test_no_false_positives_with_jittery_comm():
    # comm +-50% per step (plus the spikes): the own-comm noise floor must hold it
    for num_ranks in range(2, 9):
        records = stream(num_ranks, 2000, seed=20 + num_ranks, model="transfer", transfer_noise=0.5, microbatches=32)
        assert feed(SlowdownDetector(), records) == [], f"K={num_ranks}"


# -------------------------------------------------------- detection/attribution
@pytest.mark.slow  # a detector run per rank and factor
@pytest.mark.parametrize("factor", [1.3, 2.0, 5.0])
def test_compute_slowdown_is_detected_on_the_right_rank_only(factor):
    # waiting model: every other rank's comm grows too, and must not be blamed
    for num_ranks in range(1, 9):
        slow_rank = num_ranks // 2
        records = stream(num_ranks, 500, seed=num_ranks, compute_slow=[Slow(slow_rank, factor)])
        events = feed(SlowdownDetector(), records)
        assert summary(events) == [(slow_rank, COMPUTE, SLOWDOWN)], f"K={num_ranks}"
        event = events[0]
        delay = event.detected_step - ONSET
        if factor >= 2:
            assert 0 < delay <= CONFIG.window + CONFIG.sustain
            assert abs(event.onset_step - ONSET) <= 1
        else:  # 1.3x against a 1.25 threshold under +-15% noise is marginal: allow 5 windows
            assert 0 < delay <= 5 * CONFIG.window
            assert abs(event.onset_step - ONSET) <= CONFIG.window
        assert event.latency_steps == event.detected_step - event.onset_step
        assert event.ratio >= CONFIG.threshold


@pytest.mark.slow  # a detector run per rank and factor
@pytest.mark.parametrize("factor", [2.0, 5.0])
def test_comm_slowdown_is_detected_on_the_right_rank_only(factor):
    for num_ranks in range(2, 9):
        slow_rank = (num_ranks + 1) % num_ranks
        records = stream(num_ranks, 500, seed=num_ranks, model="transfer", microbatches=32,
                         transfer_slow=[Slow(slow_rank, factor)])
        events = feed(SlowdownDetector(), records)
        assert summary(events) == [(slow_rank, COMM, SLOWDOWN)], f"K={num_ranks}"
        assert 0 < events[0].detected_step - ONSET <= CONFIG.window + CONFIG.sustain


def test_neighbours_waiting_for_a_slow_stage_are_not_blamed_for_comm():
    records = stream(3, 500, seed=5, compute_slow=[Slow(1, 3.0)])
    before, after = records[ONSET - 60:ONSET], records[ONSET + 20:ONSET + 80]
    for rank in (0, 2):  # precondition: the neighbours really wait much longer
        ratio = sum(r.comm_s[rank] for r in after) / sum(r.comm_s[rank] for r in before)
        assert ratio > 1.5 * CONFIG.threshold
    assert summary(feed(SlowdownDetector(), records)) == [(1, COMPUTE, SLOWDOWN)]


def test_a_sub_threshold_compute_slowdown_does_not_make_the_waiting_rank_look_slow():
    # K = 2: the other rank waits 20% of a stage longer, which is a lot of its comm
    records = stream(2, 500, seed=3, noise=0.05, compute_slow=[Slow(0, 1.2)], microbatches=16)
    detector = SlowdownDetector()
    assert feed(detector, records) == []
    assert detector.latest_ratios[COMPUTE][0] > CONFIG.recover_below  # it did slow down


def test_a_rank_that_got_faster_is_not_blamed_for_waiting_longer():
    records = stream(3, 500, seed=4, compute_slow=[Slow(1, 0.6)], microbatches=16)
    before, after = records[ONSET - 50:ONSET], records[ONSET + 20:ONSET + 70]
    assert sum(r.comm_s[1] for r in after) > CONFIG.threshold * sum(r.comm_s[1] for r in before)
    assert feed(SlowdownDetector(), records) == []


def _neighbour_waits_more(records: list[StepTiming], slow_rank: int) -> list[StepTiming]:
    """A runtime that times only some idle time: the slow stage's neighbours see all of
    the extra waiting in comm, the other ranks half of it."""
    baseline_step = sum(r.step_seconds for r in records[:ONSET]) / ONSET
    out = []
    for r in records:
        extra = max(0.0, r.step_seconds - baseline_step)
        comm = [c - extra * (0.0 if abs(rank - slow_rank) == 1 else 0.5) for rank, c in enumerate(r.comm_s)]
        out.append(replace(r, comm_s=tuple(max(0.0, c) for c in comm)))
    return out


def test_wait_explain_factor_covers_neighbours_that_wait_more_than_distant_ranks():
    records = _neighbour_waits_more(stream(5, 500, seed=8, compute_slow=[Slow(0, 4.0)], spike_prob=0.0), 0)
    assert summary(feed(SlowdownDetector(), records)) == [(0, COMPUTE, SLOWDOWN)]
    no_rule = SlowdownDetector(DetectorConfig(wait_explain_factor=0.0))
    assert (1, COMM, SLOWDOWN) in summary(feed(no_rule, records))  # the rule is what prevents it


def test_a_slow_link_seen_only_as_shared_waiting_is_not_attributed_to_any_rank():
    # comm = step - compute: the slow link raises every rank's comm by the same seconds
    records = stream(4, 500, seed=2, transfer_slow=[Slow(1, 6.0)], microbatches=8)
    before, after = records[ONSET - 50:ONSET], records[ONSET + 20:ONSET + 70]
    assert sum(r.step_seconds for r in after) > 1.3 * sum(r.step_seconds for r in before)  # a real slowdown
    assert feed(SlowdownDetector(), records) == []


def test_a_slowdown_of_every_rank_alike_needs_peer_threshold_none():
    num_ranks = 4
    everyone = [Slow(rank, 2.0) for rank in range(num_ranks)]
    # Seed 2: a window median of 10 noisy per-step peer ratios crosses 1.15 for 3 evaluations in
    # about 1 stream in 20 (2 of seeds 1-40 with the 50-step baseline of old, 2 with the refined
    # one, different seeds); this test is about the rule, not that tail.
    records = stream(num_ranks, 400, seed=2, compute_slow=everyone)
    assert feed(SlowdownDetector(), records) == []
    events = feed(SlowdownDetector(DetectorConfig(peer_threshold=None)), records)
    assert sorted(summary(events)) == [(r, COMPUTE, SLOWDOWN) for r in range(num_ranks)]


def test_latency_seconds_run_from_the_start_of_the_onset_step():
    records = stream(3, 400, seed=4, compute_slow=[Slow(2, 2.0)])
    (event,) = feed(SlowdownDetector(), records)
    by_step = {r.step: r for r in records}
    expected = by_step[event.detected_step].wall_time - by_step[event.onset_step].start_time
    assert event.latency_s == pytest.approx(expected)


# ---------------------------------------------------------------- recovery
def test_recovery_is_reported_and_a_new_slowdown_is_detected_again():
    slows = [Slow(1, 2.0, ONSET, 500), Slow(1, 2.0, 700)]
    detector = SlowdownDetector()
    events = feed(detector, stream(3, 800, seed=6, compute_slow=slows))
    assert summary(events) == [(1, COMPUTE, SLOWDOWN), (1, COMPUTE, RECOVERY), (1, COMPUTE, SLOWDOWN)]
    recovery = events[1]
    assert abs(recovery.onset_step - 500) <= 1
    assert recovery.ratio < CONFIG.recover_below
    assert recovery.detected_step - 500 <= CONFIG.window + CONFIG.window // 2 + 1
    assert detector.active == (events[2],)


@pytest.mark.parametrize("num_ranks, seed", [(1, 122), (3, 102), (4, 100), (5, 126), (7, 112)])
def test_a_marginal_slowdown_does_not_flap_between_slowdown_and_recovery(num_ranks, seed):
    # streams in which the window median of a 1.3x slowdown dips below recover_below
    # for a few steps; recovery needs a whole window of such evaluations
    slow_rank = seed % num_ranks
    records = stream(num_ranks, 500, seed=seed, compute_slow=[Slow(slow_rank, 1.3)])
    assert summary(feed(SlowdownDetector(), records)) == [(slow_rank, COMPUTE, SLOWDOWN)]


def test_one_fast_step_while_slow_does_not_end_the_slowdown():
    records = stream(2, 600, seed=9, compute_slow=[Slow(0, 2.0)], spike_prob=0.0)
    for index in range(400, 600, 7):  # one step in seven is back to normal speed
        r = records[index]
        records[index] = replace(r, compute_s=(r.compute_s[0] / 2, r.compute_s[1]))
    detector = SlowdownDetector()
    assert summary(feed(detector, records)) == [(0, COMPUTE, SLOWDOWN)]
    assert [d.rank for d in detector.active] == [0]


# ------------------------------------------------------- checkpoint/restart
def _restored(detector: SlowdownDetector) -> SlowdownDetector:
    restored = SlowdownDetector()
    restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    return restored


def test_state_round_trips_through_json_exactly():
    detector = SlowdownDetector()
    feed(detector, stream(4, 330, seed=3, compute_slow=[Slow(2, 2.0)]))
    assert _restored(detector).state_dict() == detector.state_dict()


def test_restored_detector_flags_a_device_that_became_slow_across_the_restart():
    records = stream(4, 600, seed=12, compute_slow=[Slow(3, 2.0, start=320)])
    before_restart = SlowdownDetector()
    feed(before_restart, records[:300])
    restored = _restored(before_restart)
    events = feed(restored, records[300:])
    assert summary(events) == [(3, COMPUTE, SLOWDOWN)]
    # control: a detector learning from scratch while the device is already slow (from its
    # 5th step, inside its baseline window) takes the slow device as normal
    assert feed(SlowdownDetector(), records[315:]) == []


def test_restored_detector_keeps_an_active_slowdown_and_reports_its_end():
    records = stream(3, 900, seed=13, compute_slow=[Slow(0, 3.0, ONSET, 700)])
    detector = SlowdownDetector()
    (detection,) = feed(detector, records[:400])
    restored = _restored(detector)
    assert restored.active == (detection,)
    events = feed(restored, records[400:])
    assert summary(events) == [(0, COMPUTE, RECOVERY)]
    assert abs(events[0].onset_step - 700) <= 1


def test_restart_warm_up_steps_are_ignored():
    config = DetectorConfig(warmup_steps=10)  # long enough for the slow warm-up alone to be a slowdown
    records = stream(2, 500, seed=14)
    detector = SlowdownDetector(config)
    feed(detector, records[:300])
    warm_up, after = records[300:300 + config.warmup_steps], records[300 + config.warmup_steps:]
    slow_warm_up = [replace(r, compute_s=(4 * r.compute_s[0], r.compute_s[1])) for r in warm_up]
    restored = SlowdownDetector(config)
    restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert feed(restored, slow_warm_up + after) == []
    assert feed(detector, slow_warm_up) != []  # without the restart the same steps are a slowdown


def test_load_state_dict_rejects_foreign_input():
    detector = SlowdownDetector()
    with pytest.raises(DetectorInputError, match="version"):
        detector.load_state_dict({"version": 99})
    trained = SlowdownDetector()
    feed(trained, stream(2, 100, seed=1))
    state = trained.state_dict()
    state["compute_baseline"] = [1.0]  # one rank, but the state says two
    with pytest.raises(DetectorInputError, match="compute_baseline has 1 ranks"):
        detector.load_state_dict(state)


# ------------------------------------------------------------ re-partition
def _scaled(records, compute_scale, comm_scale=None):
    comm_scale = comm_scale or [1.0] * len(compute_scale)
    return [replace(r, compute_s=tuple(c * s for c, s in zip(r.compute_s, compute_scale)),
                    comm_s=tuple(c * s for c, s in zip(r.comm_s, comm_scale))) for r in records]


def test_rebase_carries_baselines_over_a_repartition():
    scale = [1.6, 0.7, 1.0]  # the new partition moves blocks from rank 1 to rank 0
    records = stream(3, 600, seed=21)
    rebased = SlowdownDetector()
    feed(rebased, records[:300])
    old_baseline = rebased.baseline(COMPUTE)
    assert rebased.rebase(scale, comm_scale=[1.0, 1.0, 1.0]) == []
    assert rebased.baseline(COMPUTE) == pytest.approx([b * s for b, s in zip(old_baseline, scale)])
    assert feed(rebased, _repartitioned(records[300:], [0, 1, 2], scale)) == []
    stale = SlowdownDetector()  # control: the same steps without rebase
    feed(stale, records[:300])
    assert (0, COMPUTE, SLOWDOWN) in summary(feed(stale, _repartitioned(records[300:], [0, 1, 2], scale)))


def _repartitioned(records, keep: list[int], compute_scale: list[float]) -> list[StepTiming]:
    """Steps after a re-partition: only the ranks in `keep`, compute scaled per new rank."""
    return [replace(r, compute_s=tuple(r.compute_s[old] * s for old, s in zip(keep, compute_scale)),
                    comm_s=tuple(r.comm_s[old] for old in keep)) for r in records]


def test_rebase_after_dropping_a_device_keeps_the_slow_device_slow():
    records = stream(4, 900, seed=22, compute_slow=[Slow(1, 2.0, ONSET, 700)])
    detector = SlowdownDetector()
    (detection,) = feed(detector, records[:400])
    keep, scale = [0, 1, 2], [1.1, 1.2, 1.3]  # DEGRADE: rank 3's device is dropped
    assert detector.rebase(scale, previous_rank=keep) == []
    assert detector.active == (detection,)  # the slow device is not learnt as normal
    events = feed(detector, _repartitioned(records[400:], keep, scale))
    assert summary(events) == [(1, COMPUTE, RECOVERY)]
    assert abs(events[0].onset_step - 700) <= 1


def test_rebase_drops_detections_of_removed_devices_and_relearns_comm_without_a_scale():
    detector = SlowdownDetector()
    (detection,) = feed(detector, stream(4, 400, seed=24, compute_slow=[Slow(2, 2.0)]))
    assert detector.rebase([1.0, 1.0, 1.0], previous_rank=[0, 1, 3]) == [detection]
    assert detector.active == () and detector.num_ranks == 3
    assert detector.baseline(COMM) is None and detector.baseline(COMPUTE) is not None
    feed(detector, stream(3, CONFIG.warmup_steps + CONFIG.comm_baseline_window, seed=25, first_step=400))
    assert detector.baseline(COMM) is not None


@pytest.mark.parametrize("relearn", [(2,), ()])
def test_a_rank_whose_scale_is_not_trusted_learns_its_baseline_again(relearn):
    """A re-plan leaves rank 2 the heads: predicted 0.05x its old compute, measured 0.3x (what the
    profiles do not hold). Carried, the baseline reads a healthy device 6x slow; re-learnt, nothing."""
    records = stream(3, 600, seed=27)
    detector = SlowdownDetector()
    feed(detector, records[:300])
    assert detector.rebase([1.2, 1.2, 0.05], comm_scale=[1.0, 1.0, 1.0], relearn=relearn) == []
    after = _repartitioned(records[300:], [0, 1, 2], [1.2, 1.2, 0.3])
    learning = CONFIG.warmup_steps + CONFIG.baseline_window
    events = feed(detector, after[:learning])
    state = json.loads(json.dumps(detector.state_dict()))  # a restart in the middle keeps what was learnt
    restored = SlowdownDetector()
    restored.load_state_dict(state)
    events += feed(restored, after[learning:])
    if relearn:
        healthy = median(r.compute_s[2] for r in records[:300])
        assert events == [] and restored.baseline(COMPUTE)[2] == pytest.approx(0.3 * healthy, rel=0.2)
    else:
        assert (2, COMPUTE, SLOWDOWN) in summary(events)


def test_a_rank_relearning_from_a_slow_start_is_found_against_its_peers_and_the_plan():
    records = stream(3, 400, seed=29)
    detector = SlowdownDetector()
    feed(detector, records[:200])
    detector.rebase([1.0, 1.0, 1.0], comm_scale=[1.0] * 3, relearn=[0, 1, 2])
    detector.set_expected([median(r.compute_s[rank] for r in records[:200]) for rank in range(3)])
    # device 1 is 5x slow from the new stage's first step: learnt as its normal, it would never show
    events = feed(detector, _repartitioned(records[200:], [0, 1, 2], [1.0, 5.0, 1.0]))
    assert summary(events)[:1] == [(1, COMPUTE, SLOWDOWN)] and detector.prior_replaced == (1,)


def test_a_rank_found_slow_keeps_its_detection_unless_it_relearns():
    detector = SlowdownDetector()
    (detection,) = feed(detector, stream(3, 400, seed=28, compute_slow=[Slow(2, 2.0)]))
    assert detector.rebase([1.0, 1.0, 0.5], comm_scale=[1.0] * 3, relearn=[2]) == [detection]


@pytest.mark.parametrize("slowed", ["compute", "transfer"])
def test_a_spare_in_the_place_of_a_slow_rank_takes_none_of_its_slowdowns(slowed):
    """REPLACE: the spare is a fresh device at the slow rank's place, its compute and its link."""
    detector = SlowdownDetector()
    records = stream(3, 500, seed=3, model="transfer", microbatches=32, **{f"{slowed}_slow": [Slow(1, 3.0)]})
    (detection,) = feed(detector, records)
    assert (detection.rank, detection.kind) == (1, COMM if slowed == "transfer" else COMPUTE)
    assert detector.rebase([1.0, 1.0, 1.0], comm_scale=[1.0] * 3, fresh=[1]) == [detection]
    assert detector.active == ()
    with pytest.raises(DetectorInputError, match="fresh"):
        detector.rebase([1.0, 1.0, 1.0], fresh=[3])


def test_rebase_restarts_the_warm_up():
    records = stream(2, 400, seed=26)
    detector = SlowdownDetector()
    feed(detector, records[:300])
    detector.rebase([1.0, 1.0], comm_scale=[1.0, 1.0])
    warm_up = records[300:300 + CONFIG.warmup_steps]
    slow_warm_up = [replace(r, compute_s=(4 * r.compute_s[0], r.compute_s[1])) for r in warm_up]
    assert feed(detector, slow_warm_up + records[300 + CONFIG.warmup_steps:]) == []


@pytest.mark.parametrize("kwargs, needle", [
    (dict(compute_scale=[1.0, 1.0]), "compute_scale has 2 entries"),
    (dict(compute_scale=[1.0, 0.0, 1.0]), "compute_scale[1]=0.0"),
    (dict(compute_scale=[1.0, 1.0, 1.0], comm_scale=[1.0]), "comm_scale has 1"),
    (dict(compute_scale=[1.0, 1.0], previous_rank=[0, 0]), "previous_rank=[0, 0]"),
    (dict(compute_scale=[1.0, 1.0], previous_rank=[0, 5]), "previous_rank=[0, 5]"),
    (dict(compute_scale=[1.0, 1.0, 1.0], relearn=[3]), "relearn=[3]"),
])
def test_rebase_rejects_bad_arguments(kwargs, needle):
    detector = SlowdownDetector()
    feed(detector, stream(3, 20, seed=1))
    with pytest.raises(DetectorInputError) as error:
        detector.rebase(**kwargs)
    assert needle in str(error.value)


def test_update_rejects_records_out_of_order_or_with_another_rank_count():
    detector = SlowdownDetector()
    records = stream(2, 5, seed=1)
    feed(detector, records)
    with pytest.raises(DetectorInputError, match="step 4 arrived after step 4"):
        detector.update(records[-1])
    with pytest.raises(DetectorInputError, match="3 ranks but the detector tracks 2"):
        detector.update(stream(3, 1, seed=1, first_step=10)[0])
    with pytest.raises(DetectorInputError, match="before any update"):
        SlowdownDetector().rebase([1.0])
