"""Per-rank compute baselines from the plan and from peers: the detector's pure helpers.

Why not learn every baseline from the first steps alone: a device slow from the start
would become its own normal. Before the first step the plan says what each rank's stage
should cost at nominal speed (``expected_s``, the cost model's per-step compute); the
measurement says by how much this machine differs from the profile. That difference is
common to healthy ranks, so each rank is judged against its *peers'* measured/expected
ratio: a rank whose ratio is ``prior_threshold`` times its peers' is slow from the start,
and its baseline is what its peers say it should be. A launch's first steps are judged so
by `synapse.detection.start` (from the first step after the warm-up, and with two of three
ranks slow), at a run's start and for the ranks that learn their baseline again after a
re-partition; `prior_checked` is the same check on learnt baselines, in one call.

The threshold is generous on purpose: the cost model's per-stage error is real. On the CPU
demo's recorded fault-free runs a healthy rank stood up to 1.68x its peers against the plan;
on 2 H200s at 16 images per micro-batch the first stage measured 3.4-3.7x its peer's ratio
without any fault (host-bound kernels, experiments/results/h200x2), so the default (4.0)
flags a rank only beyond that, and ``trainer=demo`` lowers it to 2.5.

A rank with no peers (K = 1) can only be judged against the plan itself, so that check is
``alone_threshold`` times the plan, and only where the plan is known to be close: on an H200 a
K = 1 stage measured 1.00-1.10x its graphed profile without a fault, and 1.98x with its
device made 2x slower from step 5 (which the peer check cannot see, and which would otherwise
become the device's normal and the block profiles' calibration), while on CPU the demo's K = 1
stage measured 1.58x its profile without a fault. ``trainer=gpu`` sets it (1.35: a device 1.5x
slow is found with the plan 10% off); off elsewhere.

Compute that moved between ranks' clocks is not a slower device: on GPUs a rank's
measured compute can include time its kernels sat queued behind a receive, and the two
ranks of the h200x2 no-load run swapped ~0.09 s of "compute" back and forth with the step
time unchanged (flagged at step 62, ratio 1.71, before). `net_compute_ratios` therefore
counts a rank's excess only beyond what its peers' compute fell below their baselines.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from statistics import median
from typing import cast

import numpy as np

from synapse.detection.rolling import SortedWindow, sorted_robust_sd
from synapse.detection.window import VECTOR_FROM_RANKS, projection_sd_factor

_TINY_S = 1e-9
# The sd of a median of n samples is ~1.2533 * sd / sqrt(n).
MEDIAN_SD_FACTOR = 1.2533


def robust_sd(values: Collection[float]) -> float:
    """1.4826 x the median absolute deviation of ``values`` (a `SortedWindow` reads its sorted copy)."""
    if isinstance(values, SortedWindow):
        return values.robust_sd()
    return sorted_robust_sd(sorted(values))[0]


def medians_without_each(values: Sequence[float]) -> list[float | None]:
    """For each index i, ``statistics.median`` of ``values`` without ``values[i]`` (None: nothing
    left), from one sort instead of one per index (a rank's peers' median, for every rank)."""
    n = len(values)
    if n < 2:
        return [None] * n
    if n >= VECTOR_FROM_RANKS:
        return _medians_without_each_at_once(values)
    order = sorted(range(n), key=values.__getitem__)
    ranked = [values[i] for i in order]
    position = [0] * n
    for k, i in enumerate(order):
        position[i] = k
    left, half = n - 1, (n - 1) // 2
    out: list[float | None] = []
    for i in range(n):
        p = position[i]

        def kept(j: int, p: int = p) -> float:  # the j-th smallest once values[i] is removed
            return ranked[j] if j < p else ranked[j + 1]

        out.append(kept(half) if left % 2 else (kept(half - 1) + kept(half)) / 2)
    return out


def _medians_without_each_at_once(values: Sequence[float]) -> list[float | None]:
    """`medians_without_each` of two or more values in one numpy pass (`medians_without_each_rows`)."""
    row = np.asarray(values, dtype=np.float64)[None, :]
    return cast(list[float | None], medians_without_each_rows(row)[0].tolist())


def medians_without_each_rows(values: np.ndarray) -> np.ndarray:
    """`medians_without_each` of every row of ``values`` (rows of two or more values) in one numpy
    pass: per row the same stable sort, the same values picked and the same (a + b) / 2."""
    order = np.argsort(values, axis=1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=1)
    rows, n = values.shape
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(n), (rows, n)), axis=1)
    half = (n - 1) // 2

    def kept(j: int) -> np.ndarray:  # per entry: its row's j-th smallest once its own value is removed
        return np.where(j < position, ranked[:, j:j + 1], ranked[:, j + 1:j + 2])

    middle: np.ndarray = kept(half) if (n - 1) % 2 else (kept(half - 1) + kept(half)) / 2
    return middle


def peer_ratio_rows(ratios: np.ndarray) -> np.ndarray:
    """`synapse.detection.waiting.peer_ratios` of every row of ``ratios`` (one row per step, one column
    per rank) at once: each ratio over the median of its row's others (floored at 1e-9), the same
    division; without others (one rank), over itself."""
    width = ratios.shape[1]
    if width < 2:
        others = ratios
    elif width % 2 == 0:
        # An odd count of others: the median without a value is the row's (half)-th smallest where the
        # value ranks above it, else the (half + 1)-th, so two order statistics (a partition, not a
        # stable sort) give it. A value equal to the (half)-th may rank above it, where the (half + 1)-th
        # is equal to it too: the same number, the sign of a zero aside, which the floor below erases.
        half = (width - 1) // 2
        ranked = np.partition(ratios, [half, half + 1], axis=1)
        lower, upper = ranked[:, half:half + 1], ranked[:, half + 1:half + 2]
        others = np.where(ratios > lower, lower, upper)
    else:
        others = medians_without_each_rows(ratios)
    peers: np.ndarray = ratios / np.maximum(others, _TINY_S)
    return peers


def net_compute_ratio_rows(ratios: np.ndarray, baseline_s: Sequence[float], margin: float,
                           pipelines: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """`net_compute_ratios` of every row of ``ratios`` (one row per step) at once, with the same
    answers bit for bit: the same products and quotients elementwise, each pipeline's shortfall summed
    in its rank order from 0.0 as ``sum`` does (``np.cumsum`` adds one term after another, it does
    not pair them), and ``max(0.0, x)`` as ``x if x > 0.0 else 0.0``."""
    baseline = np.asarray(baseline_s, dtype=np.float64)
    shortfall = np.where(ratios < 1.0 - margin, (ratios - 1.0) * baseline, 0.0)
    groups = [list(range(ratios.shape[1]))] if pipelines is None else [list(p) for p in pipelines]
    net = np.zeros_like(ratios)
    for width in sorted({len(g) for g in groups}):  # pipelines of one length at once (all of them in a mesh)
        ranks = np.array([g for g in groups if len(g) == width], dtype=np.intp)  # (pipelines, width)
        terms = shortfall[:, ranks]  # (rows, pipelines, width)
        running = np.cumsum(np.concatenate([np.zeros(terms.shape[:2] + (1,)), terms], axis=2), axis=2)
        total = running[:, :, -1:]
        value = ratios[:, ranks] + (total - terms) / np.maximum(baseline[ranks], _TINY_S)
        net[:, ranks] = np.where(value > 0.0, value, 0.0)
    return net


def peer_scale(measured_s: Sequence[float], expected_s: Sequence[float], rank: int) -> float | None:
    """Median measured/expected ratio of the ranks other than ``rank`` (None: no peers)."""
    ratios = [m / max(e, _TINY_S) for r, (m, e) in enumerate(zip(measured_s, expected_s)) if r != rank]
    return median(ratios) if ratios else None


def prior_checked(learned_s: Sequence[float], expected_s: Sequence[float] | None,
                  prior_threshold: float | None, alone_threshold: float | None = None) -> tuple[list[float], list[int]]:
    """The learned baselines, with each rank slow against its peers replaced by the peers' view,
    and a rank without peers ``alone_threshold`` times slower than the plan by the plan.

    Returns (baselines, ranks replaced). No expected times or no threshold: unchanged."""
    baselines = list(learned_s)
    if expected_s is None:
        return baselines, []
    if len(baselines) == 1:
        if alone_threshold is not None and expected_s[0] > 0 and learned_s[0] >= alone_threshold * expected_s[0]:
            return [float(expected_s[0])], [0]
        return baselines, []
    if prior_threshold is None:
        return baselines, []
    replaced = []
    for rank, (learned, expected) in enumerate(zip(learned_s, expected_s)):
        scale = peer_scale(learned_s, expected_s, rank)
        if scale is not None and expected > 0 and learned >= prior_threshold * scale * expected:
            baselines[rank] = scale * expected
            replaced.append(rank)
    return baselines, replaced


def net_compute_ratios(ratios: Sequence[float], baseline_s: Sequence[float], margin: float,
                       pipelines: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Each rank's compute ratio less what its peers' compute fell below their baselines.

    ``ratios`` are window medians of compute over baseline. Only a peer more than ``margin``
    below its baseline counts (its full shortfall, in seconds): the noise of healthy peers,
    a few percent of a window median each, must not hide a slowdown in a large pipeline.

    Peers are the ranks of the rank's own pipeline (``pipelines``: the ranks of each replica;
    None: all ranks are one pipeline): time moves between the clocks of ranks that wait on each
    other's sends, never between replicas. Summed over every replica, the dips of 255 healthy
    replicas of a 256 x 1 layout (each its own pipeline) outweighed a 2x slowdown, and every
    ratio read 0: no policy acted at 256 GPUs (docs/simulate.md)."""
    shortfall = [(r - 1.0) * b if r < 1.0 - margin else 0.0 for r, b in zip(ratios, baseline_s)]
    net = [0.0] * len(shortfall)
    for pipeline in (range(len(shortfall)),) if pipelines is None else pipelines:
        total = sum(shortfall[rank] for rank in pipeline)
        for rank in pipeline:
            net[rank] = max(0.0, ratios[rank] + (total - shortfall[rank]) / max(baseline_s[rank], _TINY_S))
    return net


def pipelines_of(same_work: Sequence[Sequence[int]]) -> list[list[int]]:
    """The ranks of each replica's pipeline, from each rank's ranks that run its stage (one per
    replica, in replica order, as `synapse.detection.start` reads them): a rank's replica is its
    place in its stage's list."""
    replica_of = {rank: list(group).index(rank) for rank, group in enumerate(same_work)}
    pipelines: dict[int, list[int]] = {}
    for rank in range(len(same_work)):
        pipelines.setdefault(replica_of[rank], []).append(rank)
    return [pipelines[replica] for replica in sorted(pipelines)]


class ComputeBaseline:
    """Each rank's compute seconds per step at nominal speed: learnt from the first steps,
    checked against the plan and the rank's peers, refined by quiet steps."""

    def __init__(self, refine_window: int) -> None:
        self.refine_window = refine_window
        self.values: list[float] | None = None
        self.samples: list[SortedWindow] = []  # per rank: healthy compute seconds the baseline is the median of
        self.expected: list[float] | None = None  # the plan's per-step compute of each rank (nominal speed)
        self.replaced: tuple[int, ...] = ()  # ranks whose baseline came from their peers (slow from the start)
        # Values learnt before the window closed, because a rank was found slow from the start (the
        # others' go on being learnt until it closes); see `synapse.detection.start`.
        self.provisional = False
        # Ranks learning their baseline afresh after a re-partition (rank -> the steps seen so far);
        # not judged until they have it
        self.pending: dict[int, list[float]] = {}

    @property
    def learning(self) -> bool:
        """Whether the baseline of a launch's first steps is still being learnt."""
        return self.values is None or self.provisional

    def learn(self, compute_steps: Sequence[Sequence[float]], references: Mapping[int, float],
              provisional: bool = False) -> None:
        """The baseline from the learning steps' per-rank medians; a rank slow from the start
        (`synapse.detection.start`) has its ``references`` entry instead, and no samples."""
        per_rank = [list(values) for values in zip(*compute_steps)]
        self.values = [references.get(rank, median(values)) for rank, values in enumerate(per_rank)]
        self.replaced = tuple(sorted(references))
        self.samples = [SortedWindow([] if rank in references else values, maxlen=self.refine_window)
                        for rank, values in enumerate(per_rank)]
        self.provisional = provisional

    def refine(self, compute_s: Sequence[float], quiet_ranks: Sequence[int]) -> bool:
        """A quiet step: each rank in ``quiet_ranks`` adds it to its samples. Whether any did."""
        changed = False
        values = cast(list[float], self.values)  # refined only once learnt
        for rank in quiet_ranks:
            self.samples[rank].append(compute_s[rank])
            values[rank] = self.samples[rank].median()
            changed = True
        return changed

    def noise_floors(self, window: int, noise_z: float) -> tuple[float, list[float]]:
        """The smallest compute ratios beyond noise, ``noise_z`` sd of each reading of a window:
        its median (one floor for all ranks, from the median over ranks of each rank's relative
        robust sd: a rank whose samples hold a step change, e.g. a fault that began inside the
        baseline window, would otherwise hide behind its own inflated sd), and per rank its
        `current_level`, which must clear the noisier of the pipeline's and the rank's own spread
        (a rank whose steps scatter needs a window median to be judged; h200x2: one rank's
        "compute" swung 0.8-1.7x with no fault)."""
        values = cast(list[float], self.values)  # judged only once learnt
        own = [robust_sd(s) / max(b, _TINY_S) if len(s) >= 4 else None for s, b in zip(self.samples, values)]
        known = [x for x in own if x is not None]
        if not known:
            return 0.0, [1.0] * len(own)
        typical = median(known)
        level_floor = 1.0 + noise_z * MEDIAN_SD_FACTOR * typical / math.sqrt(window)
        per_step = noise_z * projection_sd_factor(window) if window >= 2 else math.inf
        return level_floor, [1.0 + per_step * max(typical, x if x is not None else typical) for x in own]

    def carried(self, mapping: Sequence[int], scale: Sequence[float], relearn: Sequence[int] = ()) -> None:
        """New rank i's baseline is old rank mapping[i]'s times scale[i]; a rank in ``relearn``
        learns its own again from the next steps (`learn_pending`), the scaled one a placeholder."""
        values = cast(list[float], self.values)  # carried only once learnt
        self.values = [values[old] * s for old, s in zip(mapping, scale)]
        if self.samples:
            self.samples = [SortedWindow(() if new in relearn else (x * s for x in self.samples[old]),
                                         maxlen=self.refine_window) for new, (old, s) in enumerate(zip(mapping, scale))]
        self.pending = {rank: [] for rank in relearn}

    def learn_pending(self, compute_s: Sequence[float], window: int) -> bool:
        """A step of every rank re-learning its baseline; one with ``window`` steps now has it
        (their median). Whether any rank got its baseline."""
        learnt = []
        for rank, seen in self.pending.items():
            seen.append(compute_s[rank])
            if len(seen) >= window:
                learnt.append(rank)
        if not learnt:
            return False
        values = cast(list[float], self.values)  # pending ranks exist only after a carry-over
        for rank in learnt:
            seen = self.pending.pop(rank)
            values[rank] = median(seen)
            if self.samples:
                self.samples[rank] = SortedWindow(seen, maxlen=self.refine_window)
        return True

    def settle(self, rank: int, reference_s: float) -> None:
        """A rank re-learning its baseline found slow from its stage's first steps
        (`synapse.detection.start`): its baseline is ``reference_s``, its own steps say nothing."""
        self.pending.pop(rank, None)
        cast(list[float], self.values)[rank] = reference_s  # pending ranks exist only after a carry-over
        if self.samples:
            self.samples[rank] = SortedWindow(maxlen=self.refine_window)
        self.replaced = (*self.replaced, rank)
