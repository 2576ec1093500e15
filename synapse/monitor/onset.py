"""When a detected change began: the onset step reported with each detector event (pure).

A window median fires several steps after the change it sees; the onset is read back from the
recent history instead: the start of the run of steps past the midpoint between the level
before and the level now, the one in which steps past it most outnumber those that are not
(so one noisy step inside the run does not move the onset, nor one early spike before it).
"""
from __future__ import annotations

import math
from collections.abc import Sequence


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
