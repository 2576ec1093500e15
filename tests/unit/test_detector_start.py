"""Issue #33 item 3: devices slow from the first step, judged against the plan from the first step
after the warm-up (synapse/detection/start.py), on synthetic launches and on the recorded streams.

The launches below start at step 0, so the warm-up is steps 0-9 and the first step judged, J, is
step 10 (a run's records start at step 1: there J is step 11)."""
from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from statistics import median

import pytest
from omegaconf import OmegaConf
from test_detector import feed
from test_detector_early import FAULT_INDEX, FAULT_STREAMS, INDEX, KNOWN_UNSOLVED, recorded
from test_failover_controller import Timings, make_controller, planner, start  # noqa: F401  (planner: a fixture)

from synapse.detection import (
    COMPUTE,
    RECOVERY,
    SLOWDOWN,
    START_STEPS,
    DetectorConfig,
    SlowdownDetector,
    StartCheck,
    StepTiming,
    TimingRecordError,
    start_readings,
)

CONF = Path(__file__).resolve().parents[2] / "conf" / "trainer"


def platform(name: str) -> DetectorConfig:
    """The detector settings a trainer config sets (the defaults where it sets none)."""
    settings = OmegaConf.load(CONF / f"{name}.yaml").get("failover", {}).get("detector", {})
    return DetectorConfig(**OmegaConf.to_container(settings))


CPU_DEMO, GPU = platform("demo"), platform("gpu")
# A plan within 5% of each rank's measurement (10% between two ranks; one H200's graphed profile is
# within 10% of its stage): the thresholds it allows
ACCURATE = DetectorConfig(prior_threshold=1.25, alone_threshold=1.25)
J = DetectorConfig().warmup_steps  # the first step judged, in these launches
WINDOW = DetectorConfig().baseline_window  # the start check's last step is J + WINDOW - 1


def launch(num_ranks: int, num_steps: int, seed: int, *, slow: dict[int, float] | None = None, onset: int = 0,
           noise: float = 0.05, spike_prob: float = 0.0, plan_error: list[float] | None = None,
           wander: bool = False, microbatches: int = 4) -> tuple[list[StepTiming], list[float]]:
    """A launch's step records and its plan. Each rank computes ``base * level * slowdown`` seconds per
    step, times uniform noise of +-``noise`` and 2.5x spikes; ``plan_error[r]``: a healthy rank's
    measured over planned compute; ``wander``: each rank's speed switches by itself between 0.8 and
    1.45x for 8-25 steps (the recorded CPU streams' shape, as in test_detector_wander)."""
    rng = random.Random(seed)
    base = [rng.uniform(0.3, 0.6) for _ in range(num_ranks)]
    errors = plan_error or [1.0] * num_ranks
    expected = [b / e for b, e in zip(base, errors)]
    level, left = [1.0] * num_ranks, [0] * num_ranks
    records, clock = [], 1.7e9
    for step in range(num_steps):
        compute = []
        for rank in range(num_ranks):
            if wander and left[rank] == 0:
                level[rank], left[rank] = rng.choice([0.8, 0.9, 1.0, 1.0, 1.15, 1.3, 1.45]), rng.randint(8, 25)
            left[rank] -= 1
            factor = (slow or {}).get(rank, 1.0) if step >= onset else 1.0
            spike = 2.5 if rng.random() < spike_prob else 1.0
            compute.append(base[rank] * level[rank] * factor * rng.uniform(1 - noise, 1 + noise) * spike)
        per_micro = [c / microbatches for c in compute]
        step_s = sum(per_micro) + (microbatches - 1) * max(per_micro)
        clock += step_s
        records.append(StepTiming(step, clock, step_s, tuple(compute), tuple(step_s - c for c in compute)))
    return records, expected


def run(config: DetectorConfig, records: list[StepTiming], expected: list[float] | None):
    detector = SlowdownDetector(config)
    if expected is not None:
        detector.set_expected(expected)
    return detector, feed(detector, records)


def from_the_start(events, first_judged: int = J) -> list:
    """The start check's detections: those of the compute baseline's window."""
    return [e for e in events if e.event == SLOWDOWN and e.kind == COMPUTE and e.detected_step < first_judged + WINDOW]


def errors_within(rng: random.Random, num_ranks: int, spread: float) -> list[float]:
    """Per-rank plan errors, log-uniform within +-``spread`` (any two ranks within exp(2 * spread))."""
    return [math.exp(rng.uniform(-spread, spread)) for _ in range(num_ranks)]


# ----------------------------------------------------------------------- the first step judged
def test_the_first_step_judged_is_the_first_after_the_warm_up_and_the_onset_is_dated_there():
    records, expected = launch(3, 60, seed=1, slow={1: 6.0})
    _, events = run(DetectorConfig(), records, expected)
    assert [(e.rank, e.event, e.onset_step) for e in events] == [(1, SLOWDOWN, J)]
    assert events[0].detected_step == J + START_STEPS + DetectorConfig().sustain - 2  # J + 6
    assert events[0].latency_steps == events[0].detected_step - J
    assert events[0].ratio == pytest.approx(6.0, rel=0.1)


def test_the_warm_up_steps_are_not_judged():
    """A 10x first step on one rank (allocation, a CUDA graph captured) and none after: nothing."""
    records, expected = launch(3, 60, seed=2)
    heavy = [replace(r, compute_s=(r.compute_s[0], r.compute_s[1] * 10.0, r.compute_s[2])) if r.step < J else r
             for r in records]
    assert run(DetectorConfig(prior_threshold=1.35), heavy, expected)[1] == []


# ---------------------------------------------------- 1.5x or more, alone or with peers, within 10 steps of J
@pytest.mark.parametrize("factor", [1.5, 2.5, 4.0])
@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
def test_a_device_slow_by_1_5x_or_more_from_the_first_step_is_found_within_10_steps_of_j(factor, num_ranks):
    """Against a plan within 10% (the thresholds it allows: ACCURATE); every rank of the pipeline in turn."""
    for slow_rank in range(num_ranks):
        for seed in range(3):
            rng = random.Random(100 * seed + slow_rank)
            records, expected = launch(num_ranks, 60, seed=seed, slow={slow_rank: factor}, noise=0.1,
                                       plan_error=errors_within(rng, num_ranks, 0.05))
            _, events = run(ACCURATE, records, expected)
            found = [(e.rank, e.onset_step) for e in from_the_start(events)]
            assert found == [(slow_rank, J)], (slow_rank, seed, events)
            assert from_the_start(events)[0].detected_step - J <= 10
            assert events[0].ratio == pytest.approx(factor, rel=0.15)


@pytest.mark.parametrize("factors", [(1.5, 1.5), (3.0, 4.0)])
def test_two_of_three_ranks_slow_from_the_start_are_each_found_against_the_third(factors):
    """Their peers cannot be the reference (the median of a rank's peers would be half slow): the
    rank that runs at the plan's speed is. 1.5x needs the accurate plan; 3x and more the CPU demo's."""
    config = ACCURATE if min(factors) < 2 else CPU_DEMO
    for seed in range(4):
        spread = 0.05 if config is ACCURATE else 0.1
        records, expected = launch(3, 60, seed=seed, slow={1: factors[0], 2: factors[1]}, noise=0.1,
                                   plan_error=errors_within(random.Random(seed), 3, spread))
        detector, events = run(config, records, expected)
        assert sorted((e.rank, e.onset_step) for e in from_the_start(events)) == [(1, J), (2, J)], (seed, events)
        assert all(e.detected_step - J <= 10 for e in events)
        assert sorted(detector.prior_replaced) == [1, 2]
        baseline = detector.baseline(COMPUTE)
        for rank, factor in zip((1, 2), factors):  # each one's baseline is what rank 0 says it should be
            assert records[-1].compute_s[rank] / baseline[rank] == pytest.approx(factor, rel=0.25)


def test_every_rank_alike_slower_is_a_slow_machine_not_a_slow_device():
    records, expected = launch(3, 60, seed=3, slow={0: 3.0, 1: 3.0, 2: 3.0})
    assert run(ACCURATE, records, expected)[1] == []
    readings = start_readings([r.compute_s for r in records[J:J + 5]], expected, 1.35)
    assert all(reading is not None and reading.ratio == pytest.approx(1.0, abs=0.15) for reading in readings)


def test_a_rank_without_witnesses_is_not_judged():
    """Every other rank far above the fastest: only the fastest is a witness, and it has none itself."""
    steps = [(1.0, 3.0, 3.1)] * 5
    readings = start_readings(steps, [1.0, 1.0, 1.0], 2.0)
    assert readings[0] is None
    assert readings[1].ratio == pytest.approx(3.0) and readings[1].reference_s == pytest.approx(1.0)
    assert readings[2].ratio == pytest.approx(3.1)


# ---------------------------------------------------------------------------------- K = 1
def test_a_lone_device_is_judged_against_the_plan_alone_where_the_plan_is_close():
    """On a GPU (a K = 1 stage within 10% of its graphed profile) the lone device 1.5x slow is found
    within 10 steps of J, one whose plan is 10% off is not; on CPU (the plan of a lone stage 1.58x
    off without a fault) a lone device is not judged from the start."""
    assert GPU.alone_threshold is not None and CPU_DEMO.alone_threshold is None
    for seed in range(6):
        error = [random.Random(seed).uniform(1.0, 1.1)]
        slow, expected = launch(1, 60, seed=seed, slow={0: 1.5}, noise=0.03, spike_prob=0.01, plan_error=error)
        events = from_the_start(run(GPU, slow, expected)[1])
        assert [(e.rank, e.onset_step) for e in events] == [(0, J)] and events[0].detected_step - J <= 10, seed
        healthy, expected = launch(1, 60, seed=seed, noise=0.03, spike_prob=0.01, plan_error=[1.1])
        assert run(GPU, healthy, expected)[1] == [], seed
        assert run(CPU_DEMO, slow, expected)[1] == [], seed


def test_a_lone_gpu_slow_from_step_5_in_a_recorded_h200_run_is_found_within_10_steps_of_j():
    meta = FAULT_INDEX["h200_k1_slow_compute_x2_from_step5"]
    detector, events = run(GPU, recorded("h200_k1_slow_compute_x2_from_step5", FAULT_STREAMS),
                           meta["expected_compute_s"])
    first_judged = J + 1  # the records start at step 1
    assert [(e.rank, e.onset_step) for e in events] == [(0, first_judged)]
    assert events[0].detected_step - first_judged <= 10 and events[0].ratio == pytest.approx(2.0, rel=0.1)


# -------------------------------------------------------------- the CPU demo: the plan's error is large
@pytest.mark.parametrize("reads", [2.6, 2.8, 3.0])
def test_4x_measured_as_only_2_6_to_3x_of_its_peers_is_found_on_the_cpu_demo_settings(reads):
    """A rank 4x slow whose stage the plan overestimates (so it reads ``reads`` times the others
    against the plan, as the tester's did) in steps that scatter by 0.15 sd with 3% spikes: under
    the default 4.0 it was its own normal. The demo's 2.5 finds it within 10 steps of J from 2.8x
    on; at 2.6x, 4% above the threshold, the noise carries some launches' readings below it for a
    while (found later in the window, or not: measured here 14 of 20 within 10 steps, 17 in all)."""
    in_10 = found = 0
    for seed in range(20):
        rng = random.Random(seed)
        errors = errors_within(rng, 3, 0.1)
        errors[2] = reads / 4.0 * median(errors[:2])
        records, expected = launch(3, 80, seed=seed, slow={2: 4.0}, noise=0.2, spike_prob=0.03, plan_error=errors)
        readings = start_readings([r.compute_s for r in records[J:J + WINDOW]], expected, CPU_DEMO.prior_threshold)
        assert readings[2].ratio == pytest.approx(reads, rel=0.1), readings
        assert run(DetectorConfig(), records, expected)[1] == []
        events = from_the_start(run(CPU_DEMO, records, expected)[1])
        assert [(e.rank, e.onset_step) for e in events] in ([], [(2, J)]), (seed, events)
        found += bool(events)
        in_10 += bool(events) and events[0].detected_step - J <= 10
    assert (in_10, found) == (20, 20) if reads >= 2.8 else (in_10 >= 12 and found >= 15), (in_10, found)


def test_a_rank_read_3x_its_peers_from_the_first_step_of_a_recorded_cpu_run_is_found():
    """Replay: the recorded fault-free CPU demo runs with one rank's compute raised from the first step
    so that, against the plan, it reads 3x or 4x its peers (on these runs' own plan errors and noise).
    Every one is found from the start, and all but one within 10 steps of J: on the loaded 2-core
    machine (cpu3_demo_models_none_a) rank 0's steps flip between 25 and 57 ms, and at 3x its median
    of a few steps is not yet sure of the level (found by the window's last step)."""
    latencies = []
    for name in sorted(n for n, meta in INDEX.items() if n.startswith("cpu3") and meta["expected_compute_s"]):
        records, expected = recorded(name), INDEX[name]["expected_compute_s"]
        first_judged = records[J].step
        window = [r.compute_s for r in records[J:J + WINDOW]]
        for factor in (3.0, 4.0):
            for rank in range(3):
                healthy = start_readings(window, expected, CPU_DEMO.prior_threshold)[rank].ratio
                raised = [replace(r, compute_s=tuple(c * factor / healthy if k == rank else c
                                                     for k, c in enumerate(r.compute_s))) for r in records]
                events = from_the_start(run(CPU_DEMO, raised, expected)[1], first_judged)
                assert [(e.rank, e.onset_step) for e in events] == [(rank, first_judged)], (name, factor, rank)
                latencies.append(events[0].detected_step - first_judged)
    assert len(latencies) == 18 and sum(steps <= 10 for steps in latencies) >= 17, latencies


# --------------------------------------------------- the start probe: the same work on every device
# Start probes of 3 real CPU ranks on the loaded 2-core machine (tests/data/start_probe_cpu.json): 60
# healthy, 150 healthy with two busy-loops beside, 30 with ranks 1 and 2 injected 1.5x slow
PROBES = json.loads((Path(__file__).resolve().parents[1] / "data" / "start_probe_cpu.json").read_text())
HEALTHY_PROBES = [p["probe_s"] for p in PROBES["healthy"] + PROBES["busy"]]


def with_probe(records: list[StepTiming], probe_s: list[float]) -> list[StepTiming]:
    """The launch's records, its first carrying the start probe (as the last rank writes them)."""
    return [replace(records[0], probe_s=tuple(probe_s)), *records[1:]]


def slowed(probe_s: list[float], slow: dict[int, float]) -> list[float]:
    """A healthy probe with ``slow`` ranks' rounds slowed as the injector slows them (each round's work
    times the factor, so its fastest round too)."""
    return [s * slow.get(rank, 1.0) for rank, s in enumerate(probe_s)]


def test_the_recorded_probes_read_healthy_ranks_within_1_15x_and_slowed_ones_at_1_49x_or_more():
    """What probe_threshold stands on: 210 healthy probes under load, the largest ratio of a rank to the
    fastest 1.14 (far below the CPU plan's 1.68); 30 with two ranks 1.5x slow, each 1.49x or more."""
    worst = max(max(p) / min(p) for p in HEALTHY_PROBES)
    assert 1.02 < worst < 1.15, worst
    assert CPU_DEMO.probe_threshold is not None and worst < CPU_DEMO.probe_threshold
    slow = [min(p["probe_s"][1:]) / p["probe_s"][0] for p in PROBES["slow_1_2"]]
    assert min(slow) >= 1.45 and min(slow) > CPU_DEMO.probe_threshold, slow
    assert max(p["cost_s"] for p in PROBES["healthy"] + PROBES["busy"]) < 1.5  # 3 ranks in turn, all in


@pytest.mark.parametrize("slow_rank", [0, 1, 2])
def test_on_the_cpu_demo_settings_a_device_1_5x_slow_from_the_start_is_found(slow_rank):
    """Below the CPU plan's error (a healthy rank up to 1.68x its peers against it) the steps cannot tell
    a device 1.5x slow from a heavy stage; its start probe can: found at J + 4 on every recorded probe
    (each with the slow rank's reading 1.5x), plan 1.65x off and steps that wander as CPU ranks do, with
    its baseline the level its probe says it would have at nominal speed."""
    without = 0
    for seed, probe in enumerate(HEALTHY_PROBES[::8]):
        rng = random.Random(seed)
        records, expected = launch(3, 50, seed=seed, slow={slow_rank: 1.5}, noise=0.1, wander=seed % 2 == 1,
                                   plan_error=errors_within(rng, 3, 0.25))
        without += any(e.detected_step - J <= 10 for e in from_the_start(run(CPU_DEMO, records, expected)[1]))
        detector, events = run(CPU_DEMO, with_probe(records, slowed(probe, {slow_rank: 1.5})), expected)
        found = from_the_start(events)
        assert [(e.rank, e.onset_step, e.detected_step) for e in found] == [(slow_rank, J, J + START_STEPS - 1)], \
            (seed, events)
        assert found[0].ratio == pytest.approx(1.5, rel=0.15) and detector.prior_replaced == (slow_rank,)
        # Once the window closes, its baseline is its level there over what its probe read
        window = with_probe(records, slowed(probe, {slow_rank: 1.5}))[:J + WINDOW]
        learnt = run(CPU_DEMO, window, expected)[0].baseline(COMPUTE)
        level = median(r.compute_s[slow_rank] for r in records[J:J + WINDOW])
        assert learnt[slow_rank] == pytest.approx(level / found[0].ratio)
    assert without <= 4, without  # without the probe, most launches learn it as the rank's normal


def test_two_of_three_devices_1_5x_slow_are_each_found_against_the_third_on_the_recorded_probes():
    """The median of a rank's peers would be half slow; its witnesses are those within the threshold of the
    fastest. The recorded probes with ranks 1 and 2 injected 1.5x slow (real rounds, busy-loops beside)."""
    for seed, entry in enumerate(PROBES["slow_1_2"]):
        records, expected = launch(3, 50, seed=seed, slow={1: 1.5, 2: 1.5}, noise=0.1,
                                   plan_error=errors_within(random.Random(seed), 3, 0.25))
        detector, events = run(CPU_DEMO, with_probe(records, entry["probe_s"]), expected)
        assert sorted((e.rank, e.onset_step) for e in from_the_start(events)) == [(1, J), (2, J)], (seed, events)
        assert all(e.detected_step - J <= 10 for e in events) and sorted(detector.prior_replaced) == [1, 2]


def test_the_probe_needs_no_plan_and_a_slow_machine_is_no_slow_device():
    records, _ = launch(4, 40, seed=11, slow={3: 2.0}, noise=0.1)
    probe = slowed([0.002] * 4, {3: 2.0})
    assert [e.rank for e in from_the_start(run(CPU_DEMO, with_probe(records, probe), None)[1])] == [3]
    everyone = slowed([0.002] * 4, {rank: 2.0 for rank in range(4)})
    assert run(CPU_DEMO, with_probe(records, everyone), None)[1] == []  # no rank can vouch for nominal speed
    assert run(replace(CPU_DEMO, probe_threshold=None), with_probe(records, probe), None)[1] == []


@pytest.mark.parametrize("host", ["loaded", "wandering"])
def test_2000_noisy_cpu_steps_with_recorded_healthy_probes_raise_nothing_new(host):
    """The 40 launches of 50 steps above, each with a recorded healthy probe (80 of the 210, each once
    over the two hosts): the same detections as without a probe; at probe_threshold 1.05 the probe's own
    noise flags launches (it is there, and 1.3 clears it)."""
    flagged = 0
    for seed in range(40):
        shape = dict(noise=0.4, spike_prob=0.03) if host == "loaded" else dict(noise=0.1, wander=True)
        records, expected = launch(3, 50, seed=seed, plan_error=errors_within(random.Random(seed), 3, 0.25), **shape)
        probe = HEALTHY_PROBES[seed + (40 if host == "wandering" else 0)]
        assert run(CPU_DEMO, with_probe(records, probe), expected)[1] == run(CPU_DEMO, records, expected)[1], seed
        flagged += bool(from_the_start(run(replace(CPU_DEMO, probe_threshold=1.05), with_probe(records, probe),
                                           expected)[1]))
    assert flagged >= 3, flagged


@pytest.mark.parametrize("name", sorted(n for n, meta in INDEX.items() if meta["expected_compute_s"]))
def test_the_recorded_fault_free_streams_with_a_recorded_healthy_probe_raise_nothing_new(name):
    config = GPU if name.startswith("h200") else CPU_DEMO
    records, expected = recorded(name), INDEX[name]["expected_compute_s"]
    probe = HEALTHY_PROBES[sorted(INDEX).index(name) % len(HEALTHY_PROBES)]
    if records[0].num_ranks != len(probe):  # (an H200 stream of K = 1 or 2: as many of the recorded ranks)
        probe = probe[:records[0].num_ranks]
    assert run(config, with_probe(records, probe), expected)[1] == run(config, records, expected)[1]


def test_the_probe_follows_its_devices_over_a_live_re_partition_and_a_new_launch_brings_its_own():
    records, expected = launch(3, 200, seed=12, slow={1: 1.5}, noise=0.1)
    probe = slowed([0.002, 0.0021, 0.002], {1: 1.5})
    detector = SlowdownDetector(CPU_DEMO)
    detector.set_expected(expected)
    assert [e.rank for e in feed(detector, with_probe(records[:100], probe))] == [1]
    detector.rebase([1.0] * 3, relearn=[0, 2])  # a live re-partition: the same processes, no new probe
    assert detector._start.probe_s == tuple(probe)  # kept: the probe measured the devices, not the stages
    detector.set_expected(expected)
    assert feed(detector, records[100:]) == [] and [d.rank for d in detector.active] == [1]
    dropped = SlowdownDetector(CPU_DEMO)  # device 1 dropped: new ranks 0 and 1 are old ranks 0 and 2
    dropped.set_expected(expected)
    feed(dropped, with_probe(records[:100], probe))
    dropped.rebase([1.0] * 2, previous_rank=[0, 2])
    assert dropped._start.probe_s == (probe[0], probe[2])
    state = detector.state_dict()
    again = SlowdownDetector(CPU_DEMO)
    again.load_state_dict(state)
    assert again._start.probe_s is None  # a restarted launch: its own probe comes with its first record


def test_a_probe_that_does_not_fit_the_record_is_refused():
    record = launch(3, 1, seed=0)[0][0]
    for bad in ([0.002, 0.002], [0.002, 0.0, 0.002], [0.002, float("nan"), 0.002]):
        with pytest.raises(TimingRecordError, match="probe_s"):
            StepTiming.from_dict({**record.to_dict(), "probe_s": bad})
    assert StepTiming.from_dict(with_probe([record], [0.002] * 3)[0].to_dict()).probe_s == (0.002,) * 3


# ------------------------------------------------------------------ slowdowns that begin inside the window
def test_a_slowdown_from_the_step_after_j_is_found_from_the_start():
    """4x from step 12 of a run (J + 1 here): most of the baseline window is slow, so its median
    would learn the slowdown as normal; against the plan it is found within 10 steps of its onset."""
    for seed in range(4):
        records, expected = launch(3, 80, seed=seed, slow={2: 4.0}, onset=J + 1, noise=0.2, spike_prob=0.03,
                                   plan_error=errors_within(random.Random(seed), 3, 0.1))
        events = run(CPU_DEMO, records, expected)[1]
        assert [(e.rank, e.event) for e in events] == [(2, SLOWDOWN)], (seed, events)
        assert events[0].onset_step in (J, J + 1) and events[0].detected_step - (J + 1) <= 10


def test_a_slowdown_from_the_second_half_of_the_window_is_found_by_the_evaluation():
    """1.5x from J + 8: below any raw plan's error, but the window's median is still the healthy
    level, so the evaluation finds it once the window closes."""
    for seed in range(4):
        records, expected = launch(3, 80, seed=seed, slow={1: 1.5}, onset=J + 8, noise=0.1,
                                   plan_error=errors_within(random.Random(seed), 3, 0.1))
        events = run(CPU_DEMO, records, expected)[1]
        assert [(e.rank, e.event) for e in events][:1] == [(1, SLOWDOWN)] and not from_the_start(events), seed
        assert events[0].detected_step - (J + 8) <= 12, events[0]


# -------------------------------------------------------------------------- no new false detection
@pytest.mark.parametrize("name", sorted(n for n, meta in INDEX.items() if meta["expected_compute_s"]))
def test_the_recorded_fault_free_streams_raise_nothing_from_the_start_on_their_platform_s_settings(name):
    """The CPU demo's runs on its settings (2.5), the H200 runs on the GPU's (alone 1.35, 4.0)."""
    config = GPU if name.startswith("h200") else CPU_DEMO
    _, events = run(config, recorded(name), INDEX[name]["expected_compute_s"])
    assert from_the_start(events, recorded(name)[J].step) == []
    if name not in KNOWN_UNSOLVED:  # (its later flags are the evaluation's: test_detector_early)
        assert events == []


@pytest.mark.parametrize("name", sorted(n for n, meta in FAULT_INDEX.items() if meta["onset_step"] > 2 * J))
def test_the_recorded_faults_that_begin_later_are_not_found_from_the_start(name):
    meta = FAULT_INDEX[name]
    config = GPU if name.startswith("h200") else CPU_DEMO
    _, events = run(config, recorded(name, FAULT_STREAMS), meta["expected_compute_s"])
    assert events and all(e.detected_step >= meta["onset_step"] for e in events), events


@pytest.mark.parametrize("host", ["loaded", "wandering"])
def test_2000_noisy_cpu_steps_raise_nothing_from_the_start(host):
    """40 launches of 50 steps of 3 CPU ranks, as the recorded CPU runs show them: on the loaded
    2-core machine steps scatter by 0.3 sd with 3% spikes; on the idle 16-core host by 0.07 sd, but
    each rank's speed wanders by itself (0.8-1.45x for 8-25 steps). The plan is up to 1.65x off
    between two ranks (the recorded demo runs: up to 1.68x). Nothing from the start on the demo's
    settings, and the same detections as without the check; yet in 16 (loaded) and 20 (wandering)
    of the 40 a healthy rank reads 1.4x its witnesses or more at some step: the plan's error and the
    wander are there, to be told apart from a slow device."""
    far = 0
    for seed in range(40):
        shape = dict(noise=0.4, spike_prob=0.03) if host == "loaded" else dict(noise=0.1, wander=True)
        records, expected = launch(3, 50, seed=seed, plan_error=errors_within(random.Random(seed), 3, 0.25), **shape)
        _, events = run(CPU_DEMO, records, expected)
        assert from_the_start(events) == [], (seed, events)
        assert events == run(replace(CPU_DEMO, prior_threshold=None), records, expected)[1]
        steps = [r.compute_s for r in records[J:J + WINDOW]]
        far += any(reading is not None and reading.ratio >= 1.4 for n in range(START_STEPS, WINDOW + 1)
                   for reading in start_readings(steps[:n], expected, CPU_DEMO.prior_threshold))
    assert far >= 12, far


def test_2000_noisy_steps_of_a_lone_gpu_raise_nothing_from_the_start():
    """40 launches of 50 steps of one device: 3% step noise and 1% spikes (the recorded H200 runs:
    0.3-2.5% sd), the plan 1.00-1.10x the measurement; with the check at 1.05 they are flagged."""
    flagged = 0
    for seed in range(40):
        error = [random.Random(seed).uniform(1.0, 1.1)]
        records, expected = launch(1, 50, seed=seed, noise=0.05, spike_prob=0.01, plan_error=error)
        assert run(GPU, records, expected)[1] == [], seed
        flagged += bool(run(replace(GPU, alone_threshold=1.05), records, expected)[1])
    assert flagged >= 10, flagged


# ----------------------------------------------------------------------------- state and re-partitions
def test_found_early_the_others_baselines_go_on_being_learnt_until_the_window_closes():
    records, expected = launch(3, 60, seed=5, slow={2: 3.0}, noise=0.1)
    detector = SlowdownDetector(ACCURATE)
    detector.set_expected(expected)
    found_at = None
    for record in records[:J + WINDOW]:
        if detector.update(record):
            found_at = record.step
            provisional = detector.baseline(COMPUTE)
            assert provisional is not None and provisional[2] == pytest.approx(expected[2], rel=0.15)
    assert found_at == J + 6
    learnt = detector.baseline(COMPUTE)
    window = records[J:J + WINDOW]
    for rank in (0, 1):  # the median of the whole window, as without a slow rank
        assert learnt[rank] == pytest.approx(median(r.compute_s[rank] for r in window))
    assert not feed(detector, records[J + WINDOW:]) and [d.rank for d in detector.active] == [2]


def test_a_restart_inside_the_window_keeps_the_slow_rank_and_learns_the_others():
    records, expected = launch(3, 90, seed=6, slow={2: 3.0}, noise=0.1)
    first = SlowdownDetector(ACCURATE)
    first.set_expected(expected)
    assert [e.rank for e in feed(first, records[:J + 8])] == [2]
    state = first.state_dict()
    assert state["compute_provisional"] is True
    second = SlowdownDetector(ACCURATE)
    second.load_state_dict(state)
    second.set_expected(expected)
    events = feed(second, records[J + 8:])  # the next steps, in a new process (warm-up again)
    assert not [e for e in events if e.event == RECOVERY], events
    assert [d.rank for d in second.active] == [2]
    assert second.baseline(COMPUTE)[2] == pytest.approx(expected[2], rel=0.15)


def test_a_state_of_old_without_the_flag_loads_as_learnt():
    records, expected = launch(3, 40, seed=7)
    detector, _ = run(DetectorConfig(), records, expected)
    state = detector.state_dict()
    del state["compute_provisional"]
    again = SlowdownDetector()
    again.load_state_dict(state)
    assert again.baseline(COMPUTE) == detector.baseline(COMPUTE)


def test_the_check_needs_the_plan_and_a_threshold():
    check = StartCheck(prior_threshold=None, alone_threshold=None, sustain=3)
    steps = [(1.0, 5.0)] * 8
    assert check.judge(steps, [1.0, 1.0], final=True, found=()) == ({}, [None, None])
    check = StartCheck(prior_threshold=2.0, alone_threshold=None, sustain=3)
    assert check.judge(steps, None, final=True, found=())[0] == {}
    assert check.judge(steps[:START_STEPS - 1], [1.0, 1.0], final=True, found=())[0] == {}
    found, readings = check.judge(steps, [1.0, 1.0], final=True, found=())
    assert list(found) == [1] and found[1].ratio == pytest.approx(5.0) and readings[0] is None


def relaunched(config: DetectorConfig, records: list[StepTiming], expected: list[float], relearn: list[int]):
    """A detector that ran ``records[:100]`` healthy, then a re-partition (same stages) whose
    ``relearn`` ranks learn their baseline again, and the plan of the new stage."""
    detector = SlowdownDetector(config)
    detector.set_expected(expected)
    assert feed(detector, records[:100]) == []
    detector.rebase([1.0] * len(expected), relearn=relearn)
    detector.set_expected(expected)
    return detector


@pytest.mark.parametrize("factor", [1.5, 4.0])
def test_after_a_re_partition_a_rank_slow_from_the_new_stage_s_first_step_is_found_within_10_steps(factor):
    """The ranks that learn their baseline again are judged from the new launch's J (a spare that is
    itself a bad card, a device slowed while the stages were re-cut), their peers as witnesses:
    before, only once their window was complete, and against the median of their peers."""
    for seed in range(4):
        records, expected = launch(3, 200, seed=seed, slow={1: factor}, onset=100, noise=0.1,
                                   plan_error=errors_within(random.Random(seed), 3, 0.05))
        config = ACCURATE if factor < 2 else CPU_DEMO
        detector = relaunched(config, records, expected, relearn=[0, 1, 2])
        events = feed(detector, records[100:])
        new_j = 100 + J
        assert [(e.rank, e.onset_step) for e in events] == [(1, new_j)], (seed, events)
        assert events[0].detected_step - new_j <= 10 and detector.prior_replaced == (1,)
        assert detector.baseline(COMPUTE)[1] == pytest.approx(expected[1], rel=0.15)


def test_a_restart_while_ranks_re_learn_keeps_the_steps_judged():
    records, expected = launch(3, 240, seed=9, slow={2: 3.0}, onset=100, noise=0.1)
    detector = relaunched(ACCURATE, records, expected, relearn=[0, 1, 2])
    assert feed(detector, records[100:100 + J + 3]) == []  # 3 steps judged: too few yet
    state = json.loads(json.dumps(detector.state_dict()))
    assert len(state["launch_steps"]) == 3
    again = SlowdownDetector(ACCURATE)
    again.load_state_dict(state)
    again.set_expected(expected)
    events = feed(again, records[100 + J + 3:])  # the new process warms up, then goes on judging
    assert [(e.rank, e.onset_step) for e in events] == [(2, 100 + J)], events


def test_healthy_ranks_re_learning_after_a_re_partition_raise_nothing():
    for seed in range(10):
        records, expected = launch(3, 200, seed=seed, noise=0.4, spike_prob=0.03,
                                   plan_error=errors_within(random.Random(seed), 3, 0.25))
        detector = relaunched(CPU_DEMO, records, expected, relearn=[0, 1, 2])
        assert feed(detector, records[100:]) == [], seed


# ------------------------------------------------------------------------------- through the controller
def test_the_controller_takes_the_reference_of_a_rank_found_slow_from_the_start(planner):  # noqa: F811
    """3 ranks, device 2 2.5x slow from the first step on the CPU demo's settings: found within 10
    steps of J, with its reference (the plan on its witnesses' scale) known to the estimator at once."""
    events = []
    controller = make_controller(planner, policy="keep", events=events, detector=SlowdownDetector(CPU_DEMO))
    stage = start(controller)
    Timings(planner, seed=3).feed(controller, stage, {2: 2.5}, 40)
    detected = [e for e in events if e["event"] == "slowdown_detected"]
    assert [(e["rank"], e["onset_step"]) for e in detected] == [(2, J + 1)]
    assert detected[0]["detected_step"] - (J + 1) <= 10
    assert not [e for e in events if e["event"] == "controller_error"], events
    [reference] = [e["reference"] for e in events if e["event"] == "estimator_reference"]
    assert reference == pytest.approx(1.0, rel=0.15)
    assert controller.alphas()[stage.devices[2]] == pytest.approx(2.5, rel=0.2)


# ---------------------------------------------------- replicas: the other replicas of a stage are the reference
def replica_launch(replicas: int, stages: int, num_steps: int, seed: int, *, slow: dict[int, float] | None = None,
                   noise: float = 0.1, wander: bool = False) -> tuple[list[StepTiming], list[list[int]]]:
    """R x K ranks (replica-major); the ranks of one stage compute alike (the same blocks on as many
    images) up to noise and, with ``wander``, each rank's own drift (0.8-1.45x for 8-25 steps)."""
    rng = random.Random(seed)
    base = [rng.uniform(0.3, 0.6) for _ in range(stages)]
    level, left = [1.0] * (replicas * stages), [0] * (replicas * stages)
    records, clock = [], 1.7e9
    for step in range(num_steps):
        compute = []
        for rank in range(replicas * stages):
            if wander and left[rank] == 0:
                level[rank], left[rank] = rng.choice([0.8, 0.9, 1.0, 1.0, 1.15, 1.3, 1.45]), rng.randint(8, 25)
            left[rank] -= 1
            factor = (slow or {}).get(rank, 1.0)
            compute.append(base[rank % stages] * level[rank] * factor * rng.uniform(1 - noise, 1 + noise))
        step_s = max(compute) * 1.1
        clock += step_s
        records.append(StepTiming(step, clock, step_s, tuple(compute), tuple(step_s - c for c in compute)))
    same_work = [[r * stages + rank % stages for r in range(replicas)] for rank in range(replicas * stages)]
    return records, same_work


def run_replicas(config: DetectorConfig, records, same_work, expected=None):
    detector = SlowdownDetector(config)
    detector.set_replicas(same_work)
    if expected is not None:
        detector.set_expected(expected)
    return feed(detector, records)


@pytest.mark.parametrize("replicas, stages, slow_rank", [(4, 1, 3), (2, 1, 0), (2, 2, 3), (3, 2, 2)])
def test_a_replica_slow_from_the_first_step_is_found_against_the_other_replicas_of_its_stage(replicas, stages,
                                                                                            slow_rank):
    """2.5x slow from step 0, with no plan at all (or one 3x off): its stage's other replicas are the
    reference, found at J + 6 with its ratio to them."""
    for seed in range(5):
        records, same_work = replica_launch(replicas, stages, 60, seed, slow={slow_rank: 2.5})
        for expected in (None, [3.0 * c for c in records[0].compute_s]):
            events = from_the_start(run_replicas(DetectorConfig(), records, same_work, expected))
            assert [(e.rank, e.onset_step) for e in events] == [(slow_rank, J)], (seed, events)
            assert events[0].detected_step == J + START_STEPS + DetectorConfig().sustain - 2
            assert events[0].ratio == pytest.approx(2.5, rel=0.15)


def test_replicas_that_wander_as_cpu_ranks_do_are_not_found_slow():
    """Healthy R = 4 x K = 1 and 2 x 2 on the recorded CPU shape (each rank drifting 0.8-1.45x by itself,
    noise +-10%): 200 launches, no rank found slow from the start at the default replica_threshold."""
    found = []
    for seed in range(100):
        for replicas, stages in ((4, 1), (2, 2)):
            records, same_work = replica_launch(replicas, stages, 40, seed, wander=True)
            found += from_the_start(run_replicas(DetectorConfig(), records, same_work))
    assert found == []


def test_every_replica_alike_slow_has_no_witness():
    """A slow machine, not a slow device: no replica can vouch for nominal speed, none is found."""
    records, same_work = replica_launch(4, 1, 60, seed=3, slow={r: 3.0 for r in range(4)})
    assert from_the_start(run_replicas(DetectorConfig(), records, same_work)) == []


def test_the_replica_check_is_off_with_replica_threshold_none():
    records, same_work = replica_launch(4, 1, 60, seed=4, slow={1: 3.0})
    assert from_the_start(run_replicas(DetectorConfig(replica_threshold=None), records, same_work)) == []
