"""A sliding window that keeps its values sorted too: medians and robust sds without re-sorting (pure).

Why: the detector reads, every step and for every rank, the median and the robust sd (1.4826 x
the median absolute deviation) of windows of up to ``refine_window`` (200) values that change by
one value a step. Sorting each afresh made those reads 95% of a simulated 64-GPU step
(docs/simulate.md). Here the sorted copy is kept up to date by bisection (one insertion, one
removal per step), the median is read from its middle, and the median absolute deviation is
the k-th smallest of two sorted runs (the distances below the median and those above it), found
by a binary search instead of a sort.

The answers are *exactly* those of ``statistics.median`` and of sorting the deviations: the same
floating-point values are compared and picked (``c - v`` for v < c is bit for bit ``abs(v - c)``:
IEEE rounding is symmetric in sign), and the two middle values of an even count are averaged by
the same ``(a + b) / 2``. tests/unit/test_rolling.py checks this on random streams.
"""
from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Iterator
from statistics import median

MAD_TO_SD = 1.4826  # robust sd = 1.4826 * MAD (the sd of normal data)


def sorted_median(ordered: list[float]) -> float:
    """``statistics.median`` of values already sorted (the middle one, or the two middle ones' sum over 2)."""
    n = len(ordered)
    if not n:
        return median(ordered)  # statistics' own error for no data
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _kth_deviation(ordered: list[float], center: float, split: int, k: int) -> float:
    """The k-th smallest (from 0) of the distances of ``ordered`` from ``center``, in O(log n): the
    distances of the ``split`` values below it ascend leftwards from ``split - 1``, the others'
    rightwards from ``split``; binary search for how many of the k + 1 smallest lie below."""
    n_above = len(ordered) - split
    lo, hi = max(0, k + 1 - n_above), min(k + 1, split)
    while lo < hi:
        taken = (lo + hi) // 2
        if center - ordered[split - 1 - taken] < ordered[split + k - taken] - center:
            lo = taken + 1
        else:
            hi = taken
    rest = k + 1 - lo
    last_below = center - ordered[split - lo] if lo > 0 else -math.inf
    return max(last_below, ordered[split + rest - 1] - center if rest > 0 else -math.inf)


def sorted_robust_sd(ordered: list[float]) -> float:
    """1.4826 x the median absolute deviation of values already sorted, as sorting the deviations gives."""
    n = len(ordered)
    center = sorted_median(ordered)
    split, half = bisect_left(ordered, center), n // 2
    middle = _kth_deviation(ordered, center, split, half)
    if n % 2 == 0:
        middle = (_kth_deviation(ordered, center, split, half - 1) + middle) / 2
    # abs: a -0.0 distance (a -0.0 value at a 0.0 median) reads 0.0, as abs(v - center) gives
    return MAD_TO_SD * abs(middle)


class SortedWindow:
    """The last ``maxlen`` values appended (all, with None), in arrival order and sorted.

    Iterates, measures and appends as a ``deque(maxlen=...)`` does (oldest first; a full window
    drops its oldest), so it stands where one stood; `median` and `robust_sd` read the sorted copy."""

    __slots__ = ("_arrived", "_ordered", "_sd")

    def __init__(self, values: Iterable[float] = (), maxlen: int | None = None) -> None:
        self._arrived: deque[float] = deque(values, maxlen=maxlen)
        self._ordered = sorted(self._arrived)  # stable: equal values in arrival order, as insort keeps them
        self._sd: float | None = None  # robust_sd, until the next append

    @property
    def maxlen(self) -> int | None:
        return self._arrived.maxlen

    def append(self, value: float) -> None:
        arrived, ordered = self._arrived, self._ordered
        if arrived.maxlen == 0:
            return
        if arrived.maxlen is not None and len(arrived) == arrived.maxlen:
            # the oldest of equal values is the leftmost of them (insort puts a value after its equals)
            del ordered[bisect_left(ordered, arrived[0])]
        arrived.append(value)
        insort(ordered, value)
        self._sd = None

    def median(self) -> float:
        """``statistics.median`` of the window (StatisticsError when empty)."""
        return sorted_median(self._ordered)

    def robust_sd(self) -> float:
        """1.4826 x the window's median absolute deviation (StatisticsError when empty)."""
        if self._sd is None:
            self._sd = sorted_robust_sd(self._ordered)
        return self._sd

    def __len__(self) -> int:
        return len(self._arrived)

    def __iter__(self) -> Iterator[float]:
        return iter(self._arrived)

    def __contains__(self, value: object) -> bool:
        return value in self._arrived

    def __getitem__(self, index: int) -> float:
        return self._arrived[index]

    def __repr__(self) -> str:
        return f"SortedWindow({list(self._arrived)!r}, maxlen={self.maxlen})"
