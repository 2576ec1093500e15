"""How far each rank's compute wanders against its peers' while nothing is wrong.

Pure, a part of the slowdown detector (`synapse.detection.detector`). The detector asks a slow
rank to be ``peer_threshold`` (1.15) times its peers, as a window median. On GPUs a rank's
window medians barely move; CPU ranks drift. On the H200 host's 16 idle cores (KVM vCPUs), a
lone process repeating fixed work on a pinned core ran 0.65-1.07x its median over 10-iteration
windows (experiments/cpu_noise_probe.py), and in 6 fault-free runs of 3 one-thread ranks (500
steps each) a rank's 10-step median against its peers' spread with sd 0.06-0.18 and reached
1.6x: the peer threshold alone reported 25 slowdowns in those 3,000 steps
(experiments/results/h200/cpu_wander). A slower device is a change beyond what the rank has
been seen to do, so the peer check asks for more than the rank's own wander:

    floor = 1 + z * sd,  sd = robust sd of the medians of consecutive ``window``-step blocks
                              of the rank's per-step ratio to its calm peers, over its calm steps,

z = ``peer_wander_z`` (5, as the detector's other noise floors). Until ``MIN_BLOCKS`` blocks are
seen, sd is ``PRIOR_FACTOR`` times what independent steps would give a window median (the
recorded blocks spread 1.3-2.6x that). The floor is at least ``peer_threshold`` and at most
``FLOOR_CAP``: a 2x slowdown is found on the most wandering host too. The price: on a host
whose ranks wander like that one's, a slowdown below ~1.6x is reported late or not at all (a
real 1.3x shift: 25 steps after it, against 8), as it cannot be told from the host's own drift.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import islice
from statistics import median
from typing import cast

import numpy as np

from synapse.detection.baseline import MEDIAN_SD_FACTOR, medians_without_each, robust_sd
from synapse.detection.rolling import robust_sd_rows
from synapse.detection.window import VECTOR_FROM_RANKS

MIN_BLOCKS = 4  # blocks of window steps before their spread is trusted over the prior
PRIOR_FACTOR = 2.0  # until then: this times the independent-steps sd of a window median
FLOOR_CAP = 1.6  # a rank this far above its peers is reported on any host (a 2x fault must show)
DELAY_WINDOWS = 2  # windows of calm steps that must follow a step before it counts
_TINY = 1e-9


class PeerWander:
    """Per rank: its per-step compute ratio to its calm peers over its last ``keep`` calm steps."""

    def __init__(self, window: int, keep: int, z: float) -> None:
        self.window, self.keep, self.z = window, keep, z
        self.history: list[deque[float]] = []
        # A rank's steps wait here DELAY_WINDOWS windows before they count: the first steps of a
        # slowdown come before it is in excess, and must not teach the rank that it wanders so far.
        self.waiting: list[deque[float]] = []
        self._fresh(0)

    def reset(self, num_ranks: int) -> None:
        self.history = [deque(maxlen=self.keep) for _ in range(num_ranks)]
        self._fresh(num_ranks)
        self.waiting = [deque() for _ in range(num_ranks)]

    def observe(self, ratios: Sequence[float], calm: Sequence[int]) -> None:
        """One step's per-rank compute ratios (to each rank's baseline). A rank in ``calm`` (not in
        excess, not slow) waits to count its ratio over the median of its calm peers'; any other
        rank drops its waiting steps (they may have been its slowdown's start)."""
        calm_ranks = list(calm)
        calm_values = [ratios[p] for p in calm_ranks]
        # the median of a calm rank's calm peers: the calm ranks' values without its own, sorted once
        peer_medians = dict(zip(calm_ranks, medians_without_each(calm_values)))
        for rank in range(len(self.history)):
            if rank not in peer_medians:
                self.waiting[rank].clear()
                continue
            peer_median = peer_medians[rank]
            if peer_median is not None:
                self.waiting[rank].append(ratios[rank] / max(peer_median, _TINY))
                if len(self.waiting[rank]) > DELAY_WINDOWS * self.window:
                    self.history[rank].append(self.waiting[rank].popleft())
                    self._counted[rank] += 1

    def _fresh(self, num_ranks: int) -> None:
        """Per rank: steps ever counted into its history, and its blocks' medians by the count at which
        each block starts (a block's steps never change, while the history's first step moves on)."""
        self._counted = [0] * num_ranks
        self._block_medians: list[dict[int, float]] = [{} for _ in range(num_ranks)]

    def spread(self, rank: int) -> float | None:
        """The sd of a window median of this rank's peer ratio when nothing is wrong (None: no steps yet)."""
        blocks = self._blocks(rank)
        if blocks is None:
            return None
        if len(blocks) >= MIN_BLOCKS:
            return robust_sd(blocks)
        return self._prior(rank)

    def _blocks(self, rank: int) -> list[float] | None:
        """The medians of the rank's consecutive ``window``-step blocks of its history (None: < 4 steps)."""
        history = self.history[rank]
        if len(history) < 4:
            return None
        first = self._counted[rank] - len(history)
        cached = self._block_medians[rank]
        if len(cached) > 2 * len(history):  # blocks that began before the history's first step are gone
            cached = self._block_medians[rank] = {start: m for start, m in cached.items() if start >= first}
        starts = range(first, first + len(history) - self.window + 1, self.window)
        blocks = list(map(cached.get, starts))
        if None in blocks:  # mostly the newest block alone: read from the end of the deque, not walked to
            missing = range(len(blocks)) if None in blocks[:-1] else (len(blocks) - 1,)
            for index in missing:
                if blocks[index] is None:
                    start = starts[index]
                    i = start - first
                    from_end = len(history) - i - self.window
                    steps = (islice(history, i, i + self.window) if i <= from_end
                             else islice(reversed(history), from_end, from_end + self.window))
                    blocks[index] = cached[start] = median(steps)
        return cast(list[float], blocks)

    def _prior(self, rank: int) -> float:
        """Too few blocks yet: the spread independent steps would give a window median, times PRIOR_FACTOR."""
        return PRIOR_FACTOR * MEDIAN_SD_FACTOR * robust_sd(self.history[rank]) / math.sqrt(self.window)

    def floors(self, least: float) -> list[float]:
        """Per rank, the smallest window median over its peers that is beyond its wander (>= ``least``)."""
        return [least if sd is None else max(least, min(FLOOR_CAP, 1.0 + self.z * sd)) for sd in self._spreads()]

    def _spreads(self) -> list[float | None]:
        """`spread` of every rank; the ranks with as many blocks as each other (every rank, once their
        histories are full) in one numpy pass (`robust_sd_rows`: the same answers bit for bit)."""
        spreads: list[float | None] = [None] * len(self.history)
        by_count: dict[int, list[tuple[int, list[float]]]] = {}
        for rank in range(len(self.history)):
            blocks = self._blocks(rank)
            if blocks is None:
                continue
            if len(blocks) < MIN_BLOCKS:
                spreads[rank] = self._prior(rank)
            else:
                by_count.setdefault(len(blocks), []).append((rank, blocks))
        for group in by_count.values():
            if len(group) < VECTOR_FROM_RANKS:
                sds = [robust_sd(blocks) for _, blocks in group]
            else:
                sds = robust_sd_rows(np.array([blocks for _, blocks in group], dtype=np.float64)).tolist()
            for (rank, _), sd in zip(group, sds):
                spreads[rank] = sd
        return spreads

    def carried(self, mapping: Sequence[int], fresh: Sequence[int]) -> None:
        """Over a re-partition: new rank i keeps old rank ``mapping[i]``'s steps, unless it is ``fresh``."""
        self.history = [deque(() if new in fresh else self.history[old], maxlen=self.keep)
                        for new, old in enumerate(mapping)] if self.history else []
        self.waiting = [deque() for _ in self.history]
        self._fresh(len(self.history))

    def state_dict(self) -> list[list[float]]:
        return [list(h) for h in self.history]

    def load_state_dict(self, state: Sequence[Sequence[float]]) -> None:
        self.history = [deque(map(float, h), maxlen=self.keep) for h in state]
        self.waiting = [deque() for _ in self.history]
        self._fresh(len(self.history))
