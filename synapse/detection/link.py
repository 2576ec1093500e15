"""Own-link baselines: which rank's link got slower, from each rank's own send time.

Pure, a part of the slowdown detector (`synapse.detection.detector`). Records that carry
``send_s`` (`synapse.detection.timing`) give each rank's own transfer work per step, measured
on that rank, with no waiting for peers in it. A link slowed on rank r raises ``send_s[r]``
alone, so, unlike ``comm_s = step - compute``, it says whose link it is.

* Baseline: the median of each rank's first ``baseline_window`` measured steps (the same
  steps as the compute baseline, so a link slowed from step ~25 on is seen), refined by
  quiet steps afterwards.
* Slow from the start: healthy ranks hand over similar amounts of work per step, so a rank
  whose learned baseline is ``prior_threshold`` times the median of its peers' and above
  ``min_comm_s`` is slow from the start; its baseline becomes that median.
* Signal per step and rank: ``excess = send_s - baseline`` (seconds), and its ratio
  ``1 + excess / max(baseline, min_comm_s)``. Noise floor: `NOISE_Z` sd of a window median,
  sd from the rank's baseline samples, and never below ``min_comm_s``.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from statistics import median
from typing import Any, cast

import numpy as np

from synapse.detection.baseline import MEDIAN_SD_FACTOR, robust_sd
from synapse.detection.rolling import SortedWindow

_TINY_S = 1e-9


def _robust_sd(values: Collection[float]) -> float:
    return robust_sd(values) if len(values) >= 2 else 0.0


def peer_checked_send(learned_s: Sequence[float], prior_threshold: float | None,
                      min_comm_s: float) -> tuple[list[float], list[int]]:
    """Baselines with each rank far slower than its peers at handing sends over replaced by the
    peers' median (a link slow from the start). Returns (baselines, ranks replaced)."""
    baselines = list(learned_s)
    if prior_threshold is None or len(baselines) < 2:
        return baselines, []
    replaced = []
    for rank, learned in enumerate(learned_s):
        peers = median(list(learned_s[:rank]) + list(learned_s[rank + 1:]))
        if learned >= max(prior_threshold * peers, min_comm_s):
            baselines[rank] = peers
            replaced.append(rank)
    return baselines, replaced


class LinkBaseline:
    """Each rank's own send seconds per step at normal speed, and how noisy they are."""

    def __init__(self, baseline_window: int, refine_window: int, min_comm_s: float,
                 prior_threshold: float | None) -> None:
        self.baseline_window, self.refine_window = baseline_window, refine_window
        self.min_comm_s, self.prior_threshold = min_comm_s, prior_threshold
        self.baseline: list[float] | None = None
        self.replaced: tuple[int, ...] = ()
        self._learning: list[tuple[float, ...]] = []
        self._samples: list[SortedWindow] = []

    @property
    def ready(self) -> bool:
        return self.baseline is not None

    def learn(self, send_s: Sequence[float]) -> None:
        """One step of the baseline phase (nothing once the baseline is known)."""
        if self.baseline is not None:
            return
        self._learning.append(tuple(send_s))
        if len(self._learning) < self.baseline_window:
            return
        per_rank = list(zip(*self._learning))
        self.baseline, replaced = peer_checked_send([median(v) for v in per_rank], self.prior_threshold,
                                                    self.min_comm_s)
        self.replaced = tuple(replaced)
        self._samples = [SortedWindow([] if r in replaced else v, maxlen=max(self.refine_window, 1))
                         for r, v in enumerate(per_rank)]
        self._learning = []

    def refine(self, send_s: Sequence[float], quiet_ranks: Sequence[int]) -> None:
        """A quiet step: each rank in ``quiet_ranks`` adds it to its baseline samples."""
        if not self.refine_window or self.baseline is None:
            return
        for rank in quiet_ranks:
            self._samples[rank].append(send_s[rank])
            self.baseline[rank] = self._samples[rank].median()

    def denominator(self, rank: int) -> float:
        return max(cast(list[float], self.baseline)[rank], self.min_comm_s, _TINY_S)  # asked only when ready

    def excess(self, send_s: Sequence[float]) -> list[float]:
        return [s - b for s, b in zip(send_s, cast(list[float], self.baseline))]  # asked only when ready

    def ratios(self, excess: Sequence[float]) -> list[float]:
        least = max(self.min_comm_s, _TINY_S)  # max(b, m, t) == max(b, max(m, t)): `denominator` per rank
        return [1.0 + max(0.0, x) / max(b, least) for b, x in zip(cast(list[float], self.baseline), excess)]

    def excess_and_ratio_rows(self, send_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`excess` and `ratios` of every row of ``send_s`` (one step per row) at once, bit for bit: the
        same subtraction and quotient elementwise, ``max(0.0, x)`` as ``x if x > 0.0 else 0.0`` and
        ``max(b, least)`` as the larger (least > 0, so a tie is one value)."""
        baseline = np.asarray(cast(list[float], self.baseline), dtype=np.float64)  # asked only when ready
        excess = send_s - baseline
        ratios = 1.0 + np.where(excess > 0.0, excess, 0.0) / np.maximum(baseline, max(self.min_comm_s, _TINY_S))
        return excess, ratios

    def denominators(self) -> np.ndarray:
        """`denominator` of every rank (the larger of three, all but the baseline > 0: a tie is one value)."""
        baseline = np.asarray(cast(list[float], self.baseline), dtype=np.float64)  # asked only when ready
        return np.maximum(baseline, max(self.min_comm_s, _TINY_S))

    def floor(self, rank: int, window: int, noise_z: float) -> float:
        """Smallest window-median own excess (s) that is neither below min_comm_s nor noise."""
        noise = noise_z * MEDIAN_SD_FACTOR * _robust_sd(self._samples[rank]) / math.sqrt(window)
        return max(self.min_comm_s, noise, _TINY_S)

    def carried(self, mapping: Sequence[int]) -> None:
        """New rank i has old rank mapping[i]'s link (a re-partition keeps each device's link)."""
        if self.baseline is None:
            self._learning = []
            return
        self.baseline = [self.baseline[old] for old in mapping]
        self._samples = [SortedWindow(self._samples[old], maxlen=max(self.refine_window, 1)) for old in mapping]

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "learning": [list(s) for s in self._learning],
                "samples": [list(s) for s in self._samples]}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        state = state or {}
        baseline = state.get("baseline")
        self.baseline = None if baseline is None else [float(v) for v in baseline]
        self._learning = [tuple(float(v) for v in s) for s in state.get("learning", [])]
        self._samples = [SortedWindow(map(float, s), maxlen=max(self.refine_window, 1))
                         for s in state.get("samples", [])]
