"""Many replicas: a rank's compute is netted only against its own pipeline's ranks (issue #35: at
256 simulated GPUs, 256 x 1, no policy ever acted, because the dips of every healthy replica were
summed and subtracted from each rank's ratio, so every ratio read 0)."""
from __future__ import annotations

import random

from test_detector import feed, summary

from synapse.detection import COMPUTE, SLOWDOWN, SlowdownDetector, StepTiming
from synapse.detection.baseline import net_compute_ratios, pipelines_of
from synapse.partitioning import Placement

STEP_S, DIP, DIP_CHANCE = 0.45, 0.7, 0.05  # as the recorded H200 noise: now and then a step's compute reads 0.7x


def replicated(replicas: int, stages: int, steps: int, seed: int, slow_rank: int | None = None,
               slow_from: int = 60, factor: float = 2.0) -> list[StepTiming]:
    """Per-rank compute of R x K ranks (replica-major), each step a few healthy ranks dipping to 0.7x
    (compute that moved to a pipeline neighbour's clock), one rank ``factor`` slower from ``slow_from``."""
    rng, records, clock = random.Random(seed), [], 0.0
    for step in range(1, steps + 1):
        compute = []
        for rank in range(replicas * stages):
            value = STEP_S * rng.gauss(1.0, 0.01) * (DIP if rng.random() < DIP_CHANCE else 1.0)
            compute.append(value * (factor if rank == slow_rank and step >= slow_from else 1.0))
        step_s = max(compute) + 0.05
        records.append(StepTiming(step, clock, step_s, tuple(compute), tuple(step_s - c for c in compute)))
        clock += step_s
    return records


def stage_peers(replicas: int, stages: int) -> list[list[int]]:
    """As `Placement.stage_peers`: per rank, its stage's rank in every replica."""
    return [[r * stages + rank % stages for r in range(replicas)] for rank in range(replicas * stages)]


def test_a_2x_slow_replica_among_64_is_found_though_healthy_replicas_dip():
    detector = SlowdownDetector()
    detector.set_replicas(stage_peers(64, 1))
    events = feed(detector, replicated(64, 1, 140, seed=1, slow_rank=5))
    assert summary(events) == [(5, COMPUTE, SLOWDOWN)], events
    assert events[0].detected_step - 60 <= 15, events[0]


def test_the_pipelines_are_read_from_the_stage_peers():
    assert pipelines_of(stage_peers(3, 2)) == [[0, 1], [2, 3], [4, 5]]
    assert pipelines_of(stage_peers(4, 1)) == [[0], [1], [2], [3]]


def test_a_dip_counts_against_its_own_pipeline_only():
    ratios, baseline = [0.5, 1.8, 0.5, 1.0], [0.2, 0.1, 0.2, 0.1]  # 2 replicas x 2 stages
    # one pipeline (the old reading): both dips count against rank 1 and rank 3
    assert net_compute_ratios(ratios, baseline, 0.25) == [0.0, 0.0, 0.0, 0.0]
    # per pipeline: rank 1's excess is its neighbour's moved time; rank 3 is untouched by rank 0
    per_pipeline = net_compute_ratios(ratios, baseline, 0.25, [[0, 1], [2, 3]])
    assert per_pipeline[1] == 1.8 + (0.5 - 1.0) * 0.2 / 0.1
    assert per_pipeline[3] == 1.0 + (0.5 - 1.0) * 0.2 / 0.1
    assert per_pipeline[0] == max(0.0, 0.5 + 0.0)


def test_compute_moving_inside_one_replica_s_pipeline_is_still_no_slowdown():
    # 40 steps: longer, and the giving rank's quiet steps would teach it the lower level as its normal
    records = replicated(16, 2, 100, seed=2)
    for record in records[59:]:  # replica 3's stage 0 hands 0.2 s of its clock to stage 1 from step 60
        compute = list(record.compute_s)
        compute[6], compute[7] = compute[6] - 0.2, compute[7] + 0.2
        object.__setattr__(record, "compute_s", tuple(compute))
    detector = SlowdownDetector()
    detector.set_replicas(stage_peers(16, 2))
    assert feed(detector, records) == []


def test_a_shrunk_replica_is_a_pipeline_of_its_own():
    """Replicas of [2, 1] stages (a SHRINK): no stage is shared, so the ranks' places in their stage
    groups say nothing of their pipelines (they would read as one pipeline of all three ranks, and the
    shrunk replica's dips would be netted against rank 1). The placement names them."""
    shrunk = Placement.of_pipelines([Placement((0, 1), (4, 4), (5, 3)), Placement((2,), (8,), (8,))], (40, 24))
    assert shrunk.pipeline_ranks() == [[0, 1], [2]]
    assert pipelines_of(shrunk.stage_peers()) == [[0, 1, 2]]  # why the placement must say it
    ratios, baseline = [1.0, 2.0, 0.4], [0.1, 0.1, 0.3]  # rank 1 2x; rank 2 (alone) at 0.4x
    assert net_compute_ratios(ratios, baseline, 0.25, shrunk.pipeline_ranks())[1] == 2.0
    assert net_compute_ratios(ratios, baseline, 0.25, pipelines_of(shrunk.stage_peers()))[1] < 0.3
    rng, records, clock = random.Random(3), [], 0.0
    for step in range(1, 121):  # the same from step 60, with noise
        late = step >= 60
        compute = (0.1 * rng.gauss(1.0, 0.01), 0.1 * rng.gauss(1.0, 0.01) * (2.0 if late else 1.0),
                   0.3 * rng.gauss(1.0, 0.01) * (0.4 if late else 1.0))
        step_s = max(compute) + 0.05
        records.append(StepTiming(step, clock, step_s, compute, tuple(step_s - c for c in compute)))
        clock += step_s
    detector = SlowdownDetector()
    detector.set_replicas(shrunk.stage_peers(), shrunk.pipeline_ranks())
    assert summary(feed(detector, records)) == [(1, COMPUTE, SLOWDOWN)]
