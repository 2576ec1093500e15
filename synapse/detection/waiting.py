"""The waiting rule: whose communication got slower, from per-rank comm totals alone.

Pure, a part of the slowdown detector (`synapse.detection.detector`), for records without
``send_s`` (older runs, other runtimes); records with it are judged on own send time
(`synapse.detection.link`). Apart from the detector because it is one rule with its own
baseline, its own noise floor and its own reasoning, which the detector only calls.

``comm_s`` includes time blocked waiting for a peer, and every rank's step lasts
the same: when one stage slows down, all others wait longer. Waiting is the
pipeline's, not the waiting rank's. Per step, with D = excess over the baseline::

    beyond_peer_comm[r] = D comm[r] - median_{s != r} D comm[s]
    beyond_peer_step[r] = D comm[r] + min(0, D compute[r]) - median_{s != r} (D comm[s] + D compute[s])

The first removes the waiting all ranks share; the second keeps only comm growth
beyond how much the other ranks' whole step grew (a rank whose own compute got
shorter waits that much longer). A rank's own comm excess is the smaller of their
window medians, less ``wait_explain_factor`` times the largest compute excess (s)
of a rank with compute ratio >= ``threshold``: a stage computing d s more makes
the step up to (M + K - 1)/M * d longer (<= 2 d when M >= K - 1), which covers
runtimes in which a slow stage's neighbours wait more than distant ranks. Comm
is in excess when own excess >= ``min_comm_s`` and >= `NOISE_Z` sd of its window
median (sd from the baseline), and ``(baseline + own) / max(baseline,
min_comm_s)`` passes the ratio checks.

If the runtime counts *all* idle time as comm (``comm = step - compute``) and
K >= 2, beyond_peer_step is <= 0 exactly: a waiting rank is never blamed, and
neither is a slow link, since per-rank totals cannot say whose link it is (the
estimator's betas still rise). Comm is attributed when comm_s carries a rank's own
transfer time on top of shared waiting. Comm ratios are relative to the whole comm
time, waiting included, so a 2x slower transfer reads as less than 2x.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

import numpy as np

from synapse.detection.baseline import MEDIAN_SD_FACTOR, medians_without_each, medians_without_each_rows, robust_sd

_TINY_S = 1e-9  # a zero baseline must not divide by zero
COMM_BASELINE_FIELDS = ("comm_s", "compute_s", "spread_s")


@dataclass
class CommBaseline:
    comm_s: list[float]  # median comm per rank
    compute_s: list[float]  # median compute over the same steps (the waiting rule's reference)
    spread_s: list[float]  # robust per-step sd of beyond_peer_comm

    @classmethod
    def learned(cls, compute_steps: Sequence[Sequence[float]], comm_steps: Sequence[Sequence[float]],
                compute_median: list[float]) -> tuple[CommBaseline, list[list[float]]]:
        """The baseline of the learning steps, and each step's beyond_peer_comm per rank."""
        comm_median = [median(per_rank) for per_rank in zip(*comm_steps)]
        own = [own_comm_per_step(_excess(c, compute_median), _excess(m, comm_median))[0]
               for c, m in zip(compute_steps, comm_steps)]
        return cls(comm_median, compute_median, [robust_sd(s) for s in zip(*own)]), own

    def beyond_peers(self, compute_s: Sequence[float], comm_s: Sequence[float]) -> tuple[list[float], list[float]]:
        """(beyond_peer_comm, beyond_peer_step) of one step against this baseline."""
        return own_comm_per_step(_excess(compute_s, self.compute_s), _excess(comm_s, self.comm_s))

    def beyond_peer_rows(self, compute_s: np.ndarray, comm_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`beyond_peers` of every row (one step per row, two or more ranks) at once (`own_comm_rows`)."""
        return own_comm_rows(compute_s - np.asarray(self.compute_s, dtype=np.float64),
                             comm_s - np.asarray(self.comm_s, dtype=np.float64))

    def carried(self, mapping: Sequence[int], comm_scale: Sequence[float],
                compute_scale: Sequence[float]) -> CommBaseline:
        return CommBaseline([self.comm_s[old] * s for old, s in zip(mapping, comm_scale)],
                            [self.compute_s[old] * s for old, s in zip(mapping, compute_scale)],
                            [self.spread_s[old] * s for old, s in zip(mapping, comm_scale)])

    def own_ratios(self, beyond_comm: Sequence[float], beyond_step: Sequence[float], explained_s: float,
                   window: int, min_comm_s: float, noise_z: float) -> tuple[list[float], list[bool]]:
        """Per rank, from window medians of both readings: the ratio of its own comm, less the waiting
        ``explained_s`` a slow stage explains, and whether that excess clears the noise floor."""
        own = [max(0.0, min(a, b) - explained_s) for a, b in zip(beyond_comm, beyond_step)]
        ratios = [1.0 + x / max(self.comm_s[r], min_comm_s, _TINY_S) for r, x in enumerate(own)]
        return ratios, [x >= self.floor(r, window, min_comm_s, noise_z) for r, x in enumerate(own)]

    def floor(self, rank: int, window: int, min_comm_s: float, noise_z: float) -> float:
        """Smallest own comm excess (s) that is neither below min_comm_s nor noise."""
        noise = noise_z * MEDIAN_SD_FACTOR * self.spread_s[rank] / math.sqrt(window)
        return max(min_comm_s, noise, _TINY_S)


def others_median(values: Sequence[float], rank: int, default: float) -> float:
    others = list(values[:rank]) + list(values[rank + 1:])
    return median(others) if others else default


def others_medians(values: Sequence[float], default: float | None) -> list[float]:
    """``others_median`` of every rank, from one sort (``default`` None: the rank's own value)."""
    medians = medians_without_each(values)
    return [m if m is not None else (v if default is None else default) for m, v in zip(medians, values)]


def peer_ratios(ratios: Sequence[float]) -> list[float]:
    """Each rank's ratio over the median ratio of the other ranks (1.0 without others)."""
    return [ratio / max(others, _TINY_S) for ratio, others in zip(ratios, others_medians(ratios, None))]


def own_comm_per_step(compute_excess: Sequence[float],
                      comm_excess: Sequence[float]) -> tuple[list[float], list[float]]:
    """(beyond_peer_comm, beyond_peer_step) of one step, per rank (the waiting rule)."""
    occupancy = [c + m for c, m in zip(compute_excess, comm_excess)]
    ranks = range(len(comm_excess))
    comm_others, occupancy_others = others_medians(comm_excess, 0.0), others_medians(occupancy, 0.0)
    beyond_comm = [comm_excess[r] - comm_others[r] for r in ranks]
    beyond_step = [comm_excess[r] + min(0.0, compute_excess[r]) - occupancy_others[r] for r in ranks]
    return beyond_comm, beyond_step


def own_comm_rows(compute_excess: np.ndarray, comm_excess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`own_comm_per_step` of every row (one step per row, two or more ranks) at once, bit for bit: the
    same sums and differences elementwise in the same order, each rank's others' median as
    `medians_without_each` gives it, and ``min(0.0, x)`` as ``x if x < 0.0 else 0.0``."""
    occupancy = compute_excess + comm_excess
    beyond_comm = comm_excess - medians_without_each_rows(comm_excess)
    shortened = np.where(compute_excess < 0.0, compute_excess, 0.0)
    beyond_step = comm_excess + shortened - medians_without_each_rows(occupancy)
    return beyond_comm, beyond_step


def _excess(values: Sequence[float], baseline: Sequence[float]) -> list[float]:
    return [v - b for v, b in zip(values, baseline)]
