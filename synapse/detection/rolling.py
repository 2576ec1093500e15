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
from typing import cast

import numpy as np

MAD_TO_SD = 1.4826  # robust sd = 1.4826 * MAD (the sd of normal data)


def sorted_median(ordered: list[float]) -> float:
    """``statistics.median`` of values already sorted (the middle one, or the two middle ones' sum over 2)."""
    n = len(ordered)
    if not n:
        return median(ordered)  # statistics' own error for no data
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _kth_deviation(ordered: list[float], center: float, split: int, k: int, hint: int | None = None
                   ) -> tuple[float, int]:
    """The k-th smallest (from 0) of the distances of ``ordered`` from ``center``, in O(log n): the
    distances of the ``split`` values below it ascend leftwards from ``split - 1``, the others'
    rightwards from ``split``; search for how many of the k + 1 smallest lie below (returned too).

    That count is the first ``taken`` whose test fails (the test holds up to it, then never again),
    so every search finds the same one; ``hint`` (the count of the window one step before) starts a
    galloping search there, which takes a few tests where a window moved little instead of log2 n."""
    n_above = len(ordered) - split
    lo, hi = max(0, k + 1 - n_above), min(k + 1, split)
    # The test of a count ``taken``: the (taken + 1)-th value below is nearer than the rest above,
    # ``center - ordered[top - taken] < ordered[far - taken] - center``, written out where it is asked
    # (a closure's call was a third of a search, and 64 ranks' sds are searched every quiet step)
    top, far = split - 1, split + k
    if hint is not None and lo < hi:
        guess, step = min(max(hint, lo), hi), 1
        if guess < hi and center - ordered[top - guess] < ordered[far - guess] - center:  # above the guess
            lo = guess + 1
            while lo < hi:
                probe = min(lo + step - 1, hi - 1)
                if not center - ordered[top - probe] < ordered[far - probe] - center:
                    hi = probe
                    break
                lo, step = probe + 1, 2 * step
        else:  # the count is at most the guess
            hi = guess
            while lo < hi:
                probe = max(hi - step, lo)
                if center - ordered[top - probe] < ordered[far - probe] - center:
                    lo = probe + 1
                    break
                hi, step = probe, 2 * step
    while lo < hi:
        taken = (lo + hi) // 2
        if center - ordered[top - taken] < ordered[far - taken] - center:
            lo = taken + 1
        else:
            hi = taken
    rest = k + 1 - lo
    last_below = center - ordered[split - lo] if lo > 0 else -math.inf
    return max(last_below, ordered[split + rest - 1] - center if rest > 0 else -math.inf), lo


def sorted_robust_sd(ordered: list[float], hints: tuple[int, int] | None = None) -> tuple[float, tuple[int, int]]:
    """1.4826 x the median absolute deviation of values already sorted, as sorting the deviations gives,
    and the counts below the median of its two searches (``hints`` for the next window's)."""
    n = len(ordered)
    center = sorted_median(ordered)
    split, half = bisect_left(ordered, center), n // 2
    if n % 2:
        middle, upper = _kth_deviation(ordered, center, split, half, hints[1] if hints else None)
        lower = upper
    else:
        below, lower = _kth_deviation(ordered, center, split, half - 1, hints[0] if hints else None)
        # The next distance in order after those ``half`` (``lower`` of them below): the nearer of the
        # next value below and the next above, the same number a second search finds (the sign of a
        # zero aside, which the abs below erases); its count below is the next window's hint.
        next_below = center - ordered[split - 1 - lower] if lower < split else math.inf
        next_above = ordered[split + half - lower] - center if split + half - lower < n else math.inf
        middle, upper = (next_below, lower + 1) if next_below < next_above else (next_above, lower)
        middle = (below + middle) / 2
    # abs: a -0.0 distance (a -0.0 value at a 0.0 median) reads 0.0, as abs(v - center) gives
    return MAD_TO_SD * abs(middle), (lower, upper)


def median_along(values: np.ndarray, axis: int) -> np.ndarray:
    """``np.median(values, axis=axis)`` of a float64 array, bit for bit, without its general machinery
    (a tenth of a millisecond a call; a simulated 64-GPU step reads a dozen window medians): the same
    partition (the same kth, so the same pick among signed zeros), the same mean of the middle one or
    two ((a + b) / 2); where the axis holds a NaN, or for other arrays, ``np.median`` itself."""
    n = values.shape[axis] if values.ndim else 0
    if n == 0 or values.dtype != np.float64:
        return cast(np.ndarray, np.median(values, axis=axis))
    half, odd = n // 2, n % 2
    part = np.partition(values, [half, -1] if odd else [half - 1, half, -1], axis=axis)
    if np.isnan(part.take(-1, axis=axis)).any():
        return cast(np.ndarray, np.median(values, axis=axis))
    middle = [slice(None)] * part.ndim
    middle[axis] = slice(half, half + 1) if odd else slice(half - 1, half + 1)
    # np.mean's own sum and division (the sum starts from +0.0: a -0.0 median reads 0.0, as there)
    mean: np.ndarray = np.add.reduce(part[tuple(middle)], axis=axis)
    mean /= 1 if odd else 2
    return mean


def robust_sd_rows(values: np.ndarray) -> np.ndarray:
    """`sorted_robust_sd` of every row of ``values`` (unsorted) at once. The same answers bit for bit:
    numpy's median picks the same middle value, or averages the same two by (a + b) / 2, and
    ``abs(v - c)`` is the distance `_kth_deviation` compares (``c - v`` below the median)."""
    centers = median_along(values, axis=1)[:, None]
    spread: np.ndarray = MAD_TO_SD * median_along(np.abs(values - centers), axis=1)
    return spread


class SortedWindow:
    """The last ``maxlen`` values appended (all, with None), in arrival order and sorted.

    Iterates, measures and appends as a ``deque(maxlen=...)`` does (oldest first; a full window
    drops its oldest), so it stands where one stood; `median` and `robust_sd` read the sorted copy."""

    __slots__ = ("_arrived", "_hints", "_ordered", "_sd")

    def __init__(self, values: Iterable[float] = (), maxlen: int | None = None) -> None:
        self._arrived: deque[float] = deque(values, maxlen=maxlen)
        self._ordered = sorted(self._arrived)  # stable: equal values in arrival order, as insort keeps them
        self._sd: float | None = None  # robust_sd, until the next append
        self._hints: tuple[int, int] | None = None  # where the last robust_sd's searches ended

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
            self._sd, self._hints = sorted_robust_sd(self._ordered, self._hints)
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
