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
from statistics import median

import numpy as np

from synapse.detection.baseline import MEDIAN_SD_FACTOR, medians_without_each, robust_sd
from synapse.detection.rolling import median_along, robust_sd_rows

MIN_BLOCKS = 4  # blocks of window steps before their spread is trusted over the prior
PRIOR_FACTOR = 2.0  # until then: this times the independent-steps sd of a window median
FLOOR_CAP = 1.6  # a rank this far above its peers is reported on any host (a 2x fault must show)
DELAY_WINDOWS = 2  # windows of calm steps that must follow a step before it counts
_TINY = 1e-9


class PeerWander:
    """Per rank: its per-step compute ratio to its calm peers over its last ``keep`` calm steps.

    ``history`` (per rank, a deque of those ratios) is the state; beside it, for every rank at once,
    numpy rings of the same ratios by the count at which each was counted and of the median of every
    ``window`` consecutive ones by the count at which they start (a block's steps never change, while
    the history's first step moves on), so that the spreads of all ranks are read in a few numpy passes
    instead of a walk per rank (a tenth of a simulated 64-rank step)."""

    def __init__(self, window: int, keep: int, z: float) -> None:
        self.window, self.keep, self.z = window, keep, z
        self._history: list[deque[float]] = []
        self._fresh(0)

    @property
    def history(self) -> list[deque[float]]:
        return self._history

    @history.setter
    def history(self, history: list[deque[float]]) -> None:
        self._history = history
        self._rings_built = False

    def reset(self, num_ranks: int) -> None:
        self.history = [deque(maxlen=self.keep) for _ in range(num_ranks)]
        self._fresh(num_ranks)

    def observe(self, ratios: Sequence[float], calm: Sequence[int]) -> None:
        """One step's per-rank compute ratios (to each rank's baseline). A rank in ``calm`` (not in
        excess, not slow) waits to count its ratio over the median of its calm peers'; any other
        rank drops its waiting steps (they may have been its slowdown's start)."""
        calm_ranks = list(calm)
        calm_values = [ratios[p] for p in calm_ranks]
        # a calm rank beyond the ranks tracked is a peer of the others, with no steps of its own
        rows = np.array(calm_ranks, dtype=np.intp)
        tracked = rows < len(self.history)
        others = np.ones(len(self.history), dtype=bool)
        others[rows[tracked]] = False
        self._waiting_len[others] = 0
        if len(calm_ranks) < 2:  # a calm rank without calm peers neither waits nor drops its waiting steps
            return
        # the median of a calm rank's calm peers: the calm ranks' values without its own, sorted once
        peer_medians = np.array(medians_without_each(calm_values), dtype=np.float64)
        ratios_to_peers = (np.array(calm_values, dtype=np.float64) / np.maximum(peer_medians, _TINY))[tracked]
        rows = rows[tracked]
        size = self._waiting.shape[1]  # DELAY_WINDOWS * window + 1: the waiting steps and the one that counts
        self._waiting[rows, self._waiting_appended[rows] % size] = ratios_to_peers
        self._waiting_appended[rows] += 1
        self._waiting_len[rows] += 1
        counting = rows[self._waiting_len[rows] == size]  # waited DELAY_WINDOWS windows: the oldest counts
        if not len(counting):
            return
        self._waiting_len[counting] = size - 1
        values = self._waiting[counting, self._waiting_appended[counting] % size].tolist()
        ranks = counting.tolist()
        for rank, value in zip(ranks, values):
            self.history[rank].append(value)
            self._counted[rank] += 1
        self._ring_counted(ranks, values)

    def _fresh(self, num_ranks: int) -> None:
        """Per rank: steps ever counted into its history (the count of its first step is this less its
        length); the rings are built from the histories when next read."""
        self._counted = [0] * num_ranks
        self._rings_built = False
        # A rank's steps wait DELAY_WINDOWS windows before they count: the first steps of a slowdown
        # come before it is in excess, and must not teach the rank that it wanders so far. Per rank, a
        # ring of its latest ratios to its peers, how many of them wait (its calm steps in a row, at
        # most the delay) and how many it ever took (where the next goes)
        self._waiting = np.zeros((num_ranks, DELAY_WINDOWS * self.window + 1))
        self._waiting_len = np.zeros(num_ranks, dtype=np.intp)
        self._waiting_appended = np.zeros(num_ranks, dtype=np.intp)

    def _build_rings(self) -> None:
        """The rings from the histories as they stand: ``_values[r, c % size]`` is the step rank r counted
        c-th, ``_block_medians[r, s % size]`` the median of its ``window`` steps from the s-th on (the
        blocks of the history's steps; `observe` adds each one its last step completes)."""
        # a history spans at most its length of counts, so no two of its steps share a slot
        size = max(self.keep, 1, *(len(h) for h in self.history))
        self._values = np.zeros((len(self.history), size))
        self._block_medians = np.zeros((len(self.history), size))
        for rank, history in enumerate(self.history):
            first = self._counted[rank] - len(history)
            for offset, value in enumerate(history):
                self._values[rank, (first + offset) % size] = value
            steps = list(history)
            for offset in range(len(steps) - self.window + 1):
                self._block_medians[rank, (first + offset) % size] = median(steps[offset:offset + self.window])
        self._rings_built = True

    def _ring_counted(self, ranks: list[int], values: list[float]) -> None:
        """The steps ``ranks`` just counted, into the rings, and the median of each one's block that ends
        with it (all ranks in one pass: `median_along`, numpy's median, picks the same middle value or
        averages the same two by (a + b) / 2 as ``statistics.median``)."""
        if not self._rings_built:
            self._build_rings()  # from the histories, which hold these steps already
            return
        size = self._values.shape[1]
        rows = np.array(ranks, dtype=np.intp)
        counts = np.array([self._counted[r] for r in ranks], dtype=np.intp) - 1  # the count of each new step
        lengths = np.array([len(self.history[r]) for r in ranks], dtype=np.intp)
        if lengths.max() > size:  # a history without a maxlen outgrew its ring
            self._build_rings()
            return
        self._values[rows, counts % size] = values
        complete = lengths >= self.window  # the block that ends with the new step lies in the history
        if not complete.any():
            return
        rows, starts = rows[complete], counts[complete] - self.window + 1
        steps = self._values[rows[:, None], (starts[:, None] + np.arange(self.window)) % size]
        self._block_medians[rows, starts % size] = median_along(steps, axis=1)

    def spread(self, rank: int) -> float | None:
        """The sd of a window median of this rank's peer ratio when nothing is wrong (None: < 4 steps yet)."""
        return self._spreads()[rank]

    def _prior(self, rank: int) -> float:
        """Too few blocks yet: the spread independent steps would give a window median, times PRIOR_FACTOR."""
        return PRIOR_FACTOR * MEDIAN_SD_FACTOR * robust_sd(self.history[rank]) / math.sqrt(self.window)

    def floors(self, least: float) -> list[float]:
        """Per rank, the smallest window median over its peers that is beyond its wander (>= ``least``)."""
        return [least if sd is None else max(least, min(FLOOR_CAP, 1.0 + self.z * sd)) for sd in self._spreads()]

    def _spreads(self) -> list[float | None]:
        """`spread` of every rank: the robust sd of the medians of its history's consecutive ``window``-step
        blocks (from its first step), MIN_BLOCKS of them or more; fewer, `_prior`; under 4 steps, None.
        The ranks with as many blocks as each other (every rank, once their histories are full) in one
        numpy pass (`robust_sd_rows`: the same answers bit for bit as `robust_sd` of each row)."""
        if not self._rings_built:
            self._build_rings()
        spreads: list[float | None] = [None] * len(self.history)
        by_count: dict[int, list[int]] = {}
        for rank, history in enumerate(self.history):
            length = len(history)
            if length < 4:
                continue
            blocks = (length - self.window) // self.window + 1 if length >= self.window else 0
            if blocks < MIN_BLOCKS:
                spreads[rank] = self._prior(rank)
            else:
                by_count.setdefault(blocks, []).append(rank)
        size = self._values.shape[1]
        for blocks, ranks in by_count.items():
            rows = np.array(ranks, dtype=np.intp)
            firsts = np.array([self._counted[r] - len(self.history[r]) for r in ranks], dtype=np.intp)
            starts = (firsts[:, None] + self.window * np.arange(blocks)) % size
            sds = robust_sd_rows(self._block_medians[rows[:, None], starts]).tolist()
            for rank, sd in zip(ranks, sds):
                spreads[rank] = sd
        return spreads

    def carried(self, mapping: Sequence[int], fresh: Sequence[int]) -> None:
        """Over a re-partition: new rank i keeps old rank ``mapping[i]``'s steps, unless it is ``fresh``."""
        self.history = [deque(() if new in fresh else self.history[old], maxlen=self.keep)
                        for new, old in enumerate(mapping)] if self.history else []
        self._fresh(len(self.history))

    def state_dict(self) -> list[list[float]]:
        return [list(h) for h in self.history]

    def load_state_dict(self, state: Sequence[Sequence[float]]) -> None:
        self.history = [deque(map(float, h), maxlen=self.keep) for h in state]
        self._fresh(len(self.history))
