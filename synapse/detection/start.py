"""Slow from the start: each rank judged against the plan from the first step after the warm-up (pure).

A device slow from a launch's first step (a bad card, a throttled node: the commonest straggler
of a fresh allocation) is its own normal to every rule that compares a rank with its own past,
since its first steps are what its baseline is learnt from. Only a reference from outside the
rank can show it: the plan (the cost model's per-step compute of each rank at nominal speed,
`SlowdownDetector.set_expected`), put on this machine's scale by the ranks that run at nominal
speed.

The first step that can be judged, J: the first step after the warm-up, that is the
(``warmup_steps`` + 1)-th record of a launch (step 11 of a fresh run at the defaults; after a
re-partition, for the ranks that learn their baseline again, the 11th step of the new launch).
Not earlier: the warm-up's steps time one-off costs, not the device (in the recorded runs the
first step took 1.3-5x a steady one on CPU ranks and 9-30x on H200s: allocation, autograd's first
graph, CUDA graph capture; on an H200 pair one run's steps settled only from step 7), and on a
device slow from the start there is no earlier, healthy step to compare with anyway. From J on,
each rank's level is the median of its compute over all its steps since J; it is judged once
``START_STEPS`` steps are in, and found slow after ``sustain`` judgements in a row: at
J + START_STEPS + sustain - 2 (J + 6, step 17, at the defaults) for a device clearly past the
threshold. The check ends when the compute baseline's window closes (``baseline_window`` steps
from J), where the median of the whole window is judged once more without ``sustain`` (the most
steps, the surest reading).

The reference. Each rank's ratio q = its level over its plan. Its *witnesses* are the other
ranks within ``threshold`` of the lowest q: a rank slow from the start cannot vouch for nominal
speed, so with two of three ranks slow the third is the reference (the plain median of the peers
would be half slow). Rank r's ratio is q_r over the median q of its witnesses, and its reference
(the baseline it gets when found slow) that median times its plan. A rank without witnesses is
not judged: every rank alike slower is a slow machine, and no re-partition helps it. A lone rank
(K = 1) has the plan alone: its ratio is q.

Replicas (R > 1) give a better reference than the plan: the other replicas of a rank's stage run
the same blocks on as many images, so the plan's error cancels. A rank with such peers is read
against them (`replica_readings`): its level over the median of those within ``replica_threshold``
of the group's fastest, slow at ``replica_threshold`` (2.0 by default: CPU ranks sharing two cores
wander up to 1.45x by themselves, see below; a GPU's replicas read far closer, unmeasured yet).

The thresholds are how far a healthy rank may read from its witnesses, so they are per platform
(the trainer configs set them). On the recorded fault-free streams (tests/data), with the medians
this check reads: CPU ranks of the demo models up to 1.68 (rank 0, the teacher-heavy stage, on the
idle H200 host), and a CPU rank's speed also wanders by itself (0.8-1.45x for 8-25 steps there);
2 H200s up to 3.7 (a first stage host-bound at 16 images per micro-batch, and compute that moves
between the ranks' clocks); one H200 against its graphed profile 1.00-1.10. Hence
``prior_threshold`` 4.0 by default (any platform); 2.5 for the CPU demo (``trainer=demo``), where
2.0 flagged 5-7% of 300 synthetic fault-free launches shaped like the wandering host and 2.5 none;
and ``alone_threshold`` 1.35 on a GPU (off on CPU, where a lone stage measured 1.58x its profile
without a fault). Against the plan alone a device 1.5x slow from the start is thus found only where
the plan is within ~10% (a lone GPU), not against a CPU or 2-GPU plan: there it reads like a stage the
plan got wrong. The check is only as good as the plan: a profile taken on a machine loaded 3.5x over
its cores (block sums 2.6-6.9x the whole model's time) put a healthy rank at 3.6x its peers.

The start probe removes the plan from the question (`probe_readings`): before the launch's first step
every rank timed the *same* fixed work (`synapse.health.speed_probe`; the readings come with the
launch's first record, ``StepTiming.probe_s``), so a rank whose probe reads ``probe_threshold`` times
its witnesses' (the others within that threshold of the fastest probe: two of three slow leave the
third as the reference) is slow whatever its stage. It is found at the first judgement (J + 4: the
median of 5 steps gives its level), no ``sustain``: the probe is one reading, its fastest of 15
rounds, which other load on the machine only ever slows. Its baseline (reference) is its level over
its probe ratio. 1.3 by default: 210 healthy probes of 3 CPU ranks on the loaded 2-core machine read
a rank at most 1.14x the fastest, ranks injected 1.5x slow 1.49x or more (tests/data/start_probe_cpu.json).
A rank found by the probe is found whatever the plan says; one the probe clears is still judged
against the plan (a slowdown that began after the probe).
"""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from statistics import median

from synapse.detection.baseline import MEDIAN_SD_FACTOR, robust_sd

START_STEPS = 5  # steps from J before a rank is judged: their median ignores two spikes
# The threshold carries the plan's error and the host's wander; the reading must also stand this
# many sd of its own scatter above nominal speed, so that a few scattered steps do not carry it over
# the threshold. 2, not the evaluation's 5 (whose threshold, 1.25, is close to nominal): on 300
# synthetic fault-free launches of each recorded CPU host kind, 2 and 3 flagged equally few (0-1 at
# 2.5); but on the loaded 2-core machine, whose steps scatter by ~0.3 sd, at 3 a rank 3x slow in a
# recorded run was confirmed only by the window's last step, and at 5 a rank 2.5x slow in a real one.
START_NOISE_Z = 2.0
_TINY = 1e-9


@dataclass(frozen=True)
class StartReading:
    """One rank read against the plan: its ratio and the compute it should have at nominal speed."""

    ratio: float  # its median compute since J over ``reference_s``
    reference_s: float  # its plan on this machine's scale (what its baseline is if it is slow)
    noise: float  # sd of ``ratio`` from the scatter of its steps and its witnesses'
    threshold: float | None = None  # the ratio that makes it slow (None: the check's own, from the plan)


def replica_readings(steps: Sequence[Sequence[float]], same_work: Sequence[Sequence[int]], threshold: float,
                     found: Collection[int] = ()) -> list[StartReading | None]:
    """Per rank, its reading against the other replicas of its stage (``same_work[rank]``: the ranks that
    run the same blocks on as many images, itself included): no plan in between, so ``threshold`` can be
    tight. Its witnesses are those within ``threshold`` of the group's fastest (not found slow before);
    None for a rank without one (every replica alike slow, or R = 1)."""
    levels, spread = _levels(steps)
    return [None if read is None else StartReading(read[0], read[1], read[2], threshold)
            for read in _against_witnesses(levels, spread, same_work, threshold, found)]


def probe_readings(steps: Sequence[Sequence[float]], probe_s: Sequence[float], threshold: float,
                   found: Collection[int] = ()) -> list[StartReading | None]:
    """Per rank, its start probe (``probe_s``: each rank's seconds on the same fixed work, timed before
    the launch's first step, `synapse.health.speed_probe`) over the median of its witnesses' (the
    others within ``threshold`` of the fastest, not found slow before), with the compute it would have
    at nominal speed: its median over ``steps`` over that ratio. None for a rank without witnesses."""
    levels, _ = _levels(steps)
    everyone = [range(len(probe_s))] * len(probe_s)
    return [None if read is None else StartReading(read[0], levels[rank] / max(read[0], _TINY), 0.0, threshold)
            for rank, read in enumerate(_against_witnesses(probe_s, [0.0] * len(probe_s), everyone, threshold, found))]


def start_readings(steps: Sequence[Sequence[float]], expected_s: Sequence[float], threshold: float,
                   found: Collection[int] = ()) -> list[StartReading | None]:
    """Per rank, its reading over ``steps`` (per-step compute seconds of every rank, oldest first),
    against the plan ``expected_s``; None for a rank without witnesses (see the module docstring).
    ``found``: ranks already found slow, never witnesses: they are known not to run at nominal speed,
    even where the plan's error brings one within ``threshold`` of the fastest."""
    levels, spread = _levels(steps)
    q = [level / max(e, _TINY) for level, e in zip(levels, expected_s)]
    if len(q) == 1:
        return [StartReading(q[0], expected_s[0], q[0] * spread[0])]
    everyone = [range(len(q))] * len(q)
    return [None if read is None else StartReading(read[0], read[1] * expected_s[rank], read[2])
            for rank, read in enumerate(_against_witnesses(q, spread, everyone, threshold, found))]


def _levels(steps: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Each rank's median compute over ``steps``, and that median's sd relative to itself (a median of
    n steps scatters ~1.25 sd / sqrt(n))."""
    per_rank = [list(values) for values in zip(*steps)]
    levels = [median(values) for values in per_rank]
    spread = [MEDIAN_SD_FACTOR * robust_sd(values) / max(level, _TINY) / math.sqrt(len(values))
              for values, level in zip(per_rank, levels)]
    return levels, spread


def _against_witnesses(q: Sequence[float], spread: Sequence[float], groups: Sequence[Sequence[int]],
                       threshold: float, found: Collection[int]) -> list[tuple[float, float, float] | None]:
    """Per rank, (its ratio to its witnesses' median, that median, the ratio's sd), its witnesses being
    the others of its group not found slow before and within ``threshold`` of the group's fastest."""
    readings: list[tuple[float, float, float] | None] = []
    for rank, group in enumerate(groups):
        healthy = [j for j in group if j not in found]
        fastest = min((q[j] for j in healthy), default=min(q[j] for j in group))
        witnesses = [j for j in healthy if j != rank and q[j] < threshold * fastest]
        if not witnesses:
            readings.append(None)
            continue
        scale = median(q[j] for j in witnesses)
        ratio = q[rank] / max(scale, _TINY)
        readings.append((ratio, scale, ratio * math.hypot(spread[rank], median(spread[j] for j in witnesses))))
    return readings


class StartCheck:
    """Judgements in a row per rank over one launch's first steps (`start_readings` each step)."""

    def __init__(self, prior_threshold: float | None, alone_threshold: float | None, sustain: int,
                 noise_z: float = START_NOISE_Z, replica_threshold: float | None = None,
                 probe_threshold: float | None = None) -> None:
        self.prior_threshold, self.alone_threshold = prior_threshold, alone_threshold
        self.replica_threshold, self.probe_threshold = replica_threshold, probe_threshold
        # Each rank's start probe of the running launch (`SlowdownDetector.update` takes it from the
        # launch's records); None: no probe (trainer.start_probe=false, records of old)
        self.probe_s: tuple[float, ...] | None = None
        self.sustain, self.noise_z = sustain, noise_z
        self.above: dict[int, int] = {}
        # Per rank, the ranks doing the same work (replicas; `SlowdownDetector.set_replicas`); None: R = 1
        self.same_work: list[tuple[int, ...]] | None = None

    def threshold(self, num_ranks: int) -> float | None:
        return self.alone_threshold if num_ranks == 1 else self.prior_threshold

    def reset(self) -> None:
        """A new launch's first steps: nothing judged yet, no probe read yet."""
        self.above = {}
        self.probe_s = None

    def judge(self, steps: Sequence[Sequence[float]], expected_s: Sequence[float] | None, final: bool,
              found: Collection[int]) -> tuple[dict[int, StartReading], list[StartReading | None]]:
        """One more step of the window (``steps``: all of it so far). Returns (the ranks found slow
        now, with their readings; every rank's reading, None where not judged). ``final``: the
        window's last step, judged without ``sustain``; ``found``: ranks found before (not again)."""
        num_ranks = len(steps[0]) if steps else 0
        threshold = self.threshold(num_ranks)
        planned = threshold is not None and expected_s is not None and len(expected_s) == num_ranks
        replicated = (self.replica_threshold is not None and self.same_work is not None
                      and len(self.same_work) == num_ranks)
        probed = self.probe_threshold is not None and self.probe_s is not None and len(self.probe_s) == num_ranks
        if not (planned or replicated or probed) or len(steps) < START_STEPS:
            return {}, [None] * num_ranks
        readings: list[StartReading | None] = (start_readings(steps, expected_s, threshold, found)  # type: ignore[arg-type]
                                               if planned else [None] * num_ranks)
        if replicated:  # a rank with other replicas of its stage is read against them, not the plan
            by_peers = replica_readings(steps, self.same_work, self.replica_threshold, found)  # type: ignore[arg-type]
            readings = [peer if peer is not None else plan for peer, plan in zip(by_peers, readings)]
        newly: dict[int, StartReading] = {}
        if probed:  # the same work on every device: slow there is slow, whatever the stage (no sustain:
            # the probe is one reading, its fastest round; the steps only give the reference its level)
            by_probe = probe_readings(steps, self.probe_s, self.probe_threshold, found)  # type: ignore[arg-type]
            for rank, reading in enumerate(by_probe):
                if reading is not None and reading.ratio >= self.probe_threshold:  # type: ignore[operator]
                    readings[rank] = reading
                    if rank not in found:
                        newly[rank] = reading
        for rank, reading in enumerate(readings):
            if rank in newly:
                continue
            limit = reading.threshold if reading is not None and reading.threshold is not None else threshold
            slow = (reading is not None and limit is not None and reading.ratio >= limit
                    and reading.ratio - 1.0 >= self.noise_z * reading.noise)
            self.above[rank] = self.above.get(rank, 0) + 1 if slow else 0
            if reading is not None and slow and rank not in found and (final or self.above[rank] >= self.sustain):
                newly[rank] = reading
        return newly, readings
