"""Reading a window of per-step ratios: where it stands *now*, and when its change began (pure).

Where it stands (`current_level`), when it is still moving.

A window median describes the middle of the window: it trails a change by half a window,
which is fine for a step change (seen ~6 steps after it) but slow for a device that degrades
gradually. The shipped slow_ramp member (1x -> 4x over 50 steps) passes 1.25x about 4 steps
after it starts, yet a 10-step median reaches 1.25x only ~5 steps later, and the sustain rule
adds its own steps: first detected 10-18 steps after the start on CPU ranks.

The robust answer is a line, not a level: the Theil-Sen slope (the median of the pairwise
slopes, unmoved by a few spikes in the window) projects every step of the window to the
latest one, and the median of those projections is the level now. On a flat window it is an
unbiased level with more noise than the median (its sd is `projection_sd_factor`, used for
its own noise floor); on a ramp it is the ramp's current value, not its value half a window
ago. A line through a step change overshoots it (by ~6% of its height when the step is half-way
through a 10-step window; in a fault-free run of 3 CPU ranks a 0.9x -> 1.22x shift read 1.27x),
so `current_level` never reads above the median of the latest ``RECENT_STEPS`` steps, which must
show the level themselves.

When a detected change began (`onset_index`): the onset step reported with each detector event.

A window median fires several steps after the change it sees; the onset is read back from the
recent history instead: the start of the run of steps past the midpoint between the level
before and the level now, the one in which steps past it most outnumber those that are not
(so one noisy step inside the run does not move the onset, nor one early spike before it).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from statistics import median
from typing import cast

import numpy as np

from synapse.detection.rolling import median_along

# Theil-Sen's projected end point is ~1.1x as noisy as least squares' on Gaussian noise
# (simulated: sd 0.649 against 0.588 for 10 points, 0.866 against 0.775 for 5).
_THEIL_SEN_EFFICIENCY = 1.1
RECENT_STEPS = 3  # one spike among them cannot move their median
# From this many ranks one numpy pass over all of them beats a loop per rank (the same answers either way)
VECTOR_FROM_RANKS = 8


def slope(values: Sequence[float]) -> float:
    """Theil-Sen slope per step of ``values`` (one per step, oldest first)."""
    pairs = [(values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))]
    return median(pairs) if pairs else 0.0


def projected_level(values: Sequence[float]) -> float:
    """The level at the last step of ``values``: each step projected along the robust slope."""
    rate, last = slope(values), len(values) - 1
    return median(value + rate * (last - index) for index, value in enumerate(values))


def current_level(values: Sequence[float]) -> float:
    """Where ``values`` stand at the last step: the projected level, capped by the latest steps' median."""
    return min(projected_level(values), median(values[-RECENT_STEPS:]))


def column_medians(rows: Sequence[Sequence[float]]) -> list[float]:
    """``statistics.median`` of each column of ``rows`` (one row per step, one column per rank).

    numpy's median picks the same middle value, and averages the two middle ones of an even count
    by the same (a + b) / 2, so the answers are bit for bit those of the per-rank loop, in one call
    for all ranks (a simulated 64-GPU step reads a dozen such windows)."""
    if len(rows[0]) < VECTOR_FROM_RANKS:
        return [median(column) for column in zip(*rows)]
    return cast(list[float], median_along(np.asarray(rows, dtype=np.float64), axis=0).tolist())


@cache
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For n steps: the pairs (i < j) in `slope`'s order, their distances j - i, and each step's
    distance to the last, as floats (Python turns the ints into the same floats)."""
    first, second = np.triu_indices(n, k=1)
    gaps, to_last = (second - first).astype(np.float64), (n - 1 - np.arange(n)).astype(np.float64)
    return first, second, gaps[:, None], to_last[:, None]


def current_levels(rows: Sequence[Sequence[float]]) -> list[float]:
    """`current_level` of each column of ``rows`` (one row per step, oldest first), all ranks in one
    pass: the same subtractions, divisions and products elementwise as the scalar reading, and
    medians as `column_medians`, so the same answers bit for bit (tests/unit/test_rolling.py)."""
    if len(rows[0]) < VECTOR_FROM_RANKS:
        return [current_level(column) for column in zip(*rows)]
    values = np.asarray(rows, dtype=np.float64)
    first, second, gaps, to_last = _pairs(len(values))
    if len(first):
        rates = median_along((values[second] - values[first]) / gaps, axis=0)
    else:
        rates = np.zeros(values.shape[1])
    projected = median_along(values + rates * to_last, axis=0)
    recent = median_along(values[-RECENT_STEPS:], axis=0)
    return cast(list[float], np.where(recent < projected, recent, projected).tolist())


def projection_sd_factor(n: int) -> float:
    """Sd of `projected_level` of n flat noisy steps, in units of one step's sd."""
    if n < 2:
        raise ValueError(f"a projection needs at least 2 steps, got {n}")
    centre = (n - 1) / 2.0
    spread = sum((i - centre) ** 2 for i in range(n))
    return _THEIL_SEN_EFFICIENCY * math.sqrt(1.0 / n + centre ** 2 / spread)


def change_index(flags: Sequence[bool]) -> int:
    """Start of the suffix in which True most outnumbers False (the latest on ties)."""
    best_index, best_sum, running = len(flags) - 1, -math.inf, 0
    for index in range(len(flags) - 1, -1, -1):
        running += 1 if flags[index] else -1
        if running > best_sum:
            best_index, best_sum = index, running
    return best_index


def onset_index(series: Sequence[float], cut: float, rising: bool) -> int:
    """Index in ``series`` (per-step excess, oldest first) where the change past ``cut`` began:
    above it for a slowdown (``rising``), below it for a recovery."""
    return change_index([x > cut for x in series] if rising else [x < cut for x in series])
