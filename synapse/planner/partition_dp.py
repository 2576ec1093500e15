"""The dynamic programs of the exact partitioner: one stage after another over teacher and
student prefixes, on the cost model's canonical stage times and memory.

Pure numpy, a part of `synapse.planner.partitioner`, which searches over the bottleneck and
calls these DPs (min-max and min-sum under a bound) as its oracle. Apart from it because the
DPs are vectorised array work (index grids per stage, windows found by binary search, a sparse
table for window minima) with no knowledge of the search that uses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from synapse.planner.cost_model import CostModel


@dataclass(frozen=True)
class Solution:
    teacher_counts: tuple[int, ...]
    student_counts: tuple[int, ...]
    sum_s: float  # sum of stage times
    max_s: float  # bottleneck stage time
    objective_s: float  # predicted step time


def _cut_range(stage: int, num_stages: int, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Possible start and end cuts of `stage` when every stage holds >= 1 block."""
    start = np.arange(stage, num_blocks - (num_stages - stage) + 1) if stage > 0 else np.array([0])
    last = stage == num_stages - 1
    end = np.array([num_blocks]) if last else np.arange(stage + 1, num_blocks - (num_stages - stage - 1) + 1)
    return start, end


class _StageGrid:
    """Broadcastable index arrays of one stage.

    Teacher cut pairs (i0, i1) with i0 < i1 run along axis 0 (shape (P, 1)),
    sorted by i1 so that a minimum over i0 is one `np.minimum.reduceat`;
    student end cuts j1 run along axis 1 (shape (1, J)); j0 holds the start cuts.
    """

    def __init__(self, stage: int, num_stages: int, num_teacher: int, num_student: int):
        t_starts, t_ends = _cut_range(stage, num_stages, num_teacher)
        s_starts, s_ends = _cut_range(stage, num_stages, num_student)
        i1, i0 = np.meshgrid(t_ends, t_starts, indexing="ij")
        keep = i0 < i1
        self.i0, self.i1 = i0[keep][:, None], i1[keep][:, None]
        self.ends, self.group_starts = np.unique(self.i1[:, 0], return_index=True)
        self.i0_starts, self.j0, self.j1 = t_starts, s_starts, s_ends[None, :]


class PartitionDP:
    """DPs over (stage, teacher prefix i, student prefix j) on a `CostModel`.

    `min_bottleneck`: min over plans of max_r t_r. `min_sum(B)`: g(B), the min
    sum of stage times over plans with every t_r <= B (or < B). Both respect
    memory. For fixed (i0, i1, j1), stage time and memory are non-increasing in
    j0, so the admissible j0 form a window [lo, j1 - 1] (binary search), and
    min_j0 V(i0, j0) + t is a window minimum of V - s * student prefix (s = alpha * contention).
    Min-max uses the same windows: with t falling and the window minimum of V
    over [q, j1 - 1] rising in q, min_q max of the two sits at their crossing.
    """

    def __init__(self, model: CostModel):
        self.model, self.solves = model, 0
        k, nt, ns = model.num_stages, model.num_teacher_blocks, model.num_student_blocks
        self.grids = [_StageGrid(r, k, nt, ns) for r in range(k)]
        for stage, grid in enumerate(self.grids):  # parts of the stage time that do not depend on j0
            grid.teacher_work = model.teacher_work_s(grid.i0, grid.i1)
            grid.comm = model.comm_time_s(stage, grid.i1, grid.j1)
        self._memory_lo = [self._memory_window_start(r) for r in range(k)]

    def _memory_window_start(self, stage: int) -> np.ndarray:
        """First j0 per (pair, j1) whose stage fits memory; j1 (empty window) if none."""
        grid, capacity = self.grids[stage], self.model.devices[stage].memory_bytes
        hi = np.broadcast_to(grid.j1, (grid.i0.shape[0], grid.j1.shape[1]))
        lo = np.full(hi.shape, grid.j0[0])
        if math.isinf(capacity):
            return lo
        teacher = self.model.teacher_memory_bytes(stage, grid.i0, grid.i1)
        prefix = self.model.student_memory_prefix_bytes(stage)
        guess = np.searchsorted(prefix, (prefix[grid.j1] - (capacity - teacher)).ravel()).reshape(lo.shape)
        fits = lambda j0: teacher + self.model.student_memory_bytes(stage, j0, grid.j1) <= capacity
        return _first_true_near(fits, guess, lo, hi)

    def _stage_time(self, stage: int, j0: np.ndarray) -> np.ndarray:
        """Canonical stage time for every (pair, j1) of the grid, student start cut j0."""
        grid = self.grids[stage]
        student_work = self.model.student_work_s(j0, grid.j1)
        return self.model.combine_stage_time(stage, grid.teacher_work, student_work, grid.comm)

    def _window_minima(self, stage: int, rows: np.ndarray) -> "_WindowMin":
        """Window minima over rows[i0, lo..hi] for the grid's teacher start cuts i0."""
        first, last = int(self.grids[stage].i0.min()), int(self.grids[stage].i0.max())
        return _WindowMin(rows[first : last + 1], self.grids[stage].i0 - first)

    def _initial_values(self) -> np.ndarray:
        values = np.full((self.model.num_teacher_blocks + 1, self.model.num_student_blocks + 1), np.inf)
        values[0, 0] = 0.0
        return values

    def _scatter(self, stage: int, per_end: np.ndarray, like: np.ndarray) -> np.ndarray:
        grid = self.grids[stage]
        out = np.full_like(like, np.inf)
        out[grid.ends[:, None], grid.j1] = per_end
        return out

    def min_bottleneck(self) -> float:
        """min over plans of max_r t_r (inf if no plan fits memory); exact: only max/min of stage times."""
        self.solves += 1
        values = self._initial_values()
        for stage in range(self.model.num_stages):
            values = self._advance_max(stage, values)
        return float(values[-1, -1])

    def _advance_max(self, stage: int, values: np.ndarray) -> np.ndarray:
        # For a window [lo, j1 - 1], min_j0 max(V(i0, j0), t(j0)) = min_q max(t(q), h(q)) with
        # h(q) = min V(i0, q..j1-1): t falls and h rises in q, so the optimum sits at their crossing.
        grid = self.grids[stage]
        lo, hi = self._memory_lo[stage], np.broadcast_to(grid.j1, self._memory_lo[stage].shape)
        window_min = self._window_minima(stage, values)
        h = lambda q: window_min.query(q, grid.j1 - 1)
        cross = _first_true(lambda q: h(q) >= self._stage_time(stage, q), lo, hi)
        at_cross = np.where(cross < hi, np.maximum(h(cross), self._stage_time(stage, cross)), np.inf)
        before = np.maximum(cross - 1, 0)
        at_before = np.where(cross > lo, np.maximum(h(before), self._stage_time(stage, before)), np.inf)
        per_end = np.minimum.reduceat(np.minimum(at_cross, at_before), grid.group_starts, axis=0)
        return self._scatter(stage, per_end, values)

    def min_sum(self, bound: float, strict: bool) -> Solution | None:
        self.solves += 1
        history = [self._initial_values()]
        for stage in range(self.model.num_stages):
            history.append(self._advance_sum(stage, history[-1], bound, strict))
        if not math.isfinite(history[-1][-1, -1]):
            return None
        return self._backtrack(history, bound, strict)

    def _advance_sum(self, stage: int, values: np.ndarray, bound: float, strict: bool) -> np.ndarray:
        model, grid = self.model, self.grids[stage]
        scale, fixed = model.compute_scale(stage), model.stage_fixed_s(stage)
        lo = self._memory_lo[stage]
        sw = model.student_work_prefix_s
        if math.isfinite(bound):
            # Guess the first fast-enough j0 from the prefix sums, then let the canonical time decide.
            budget = (bound - grid.comm - fixed) / scale - grid.teacher_work
            guess = np.searchsorted(sw, (sw[grid.j1] - budget).ravel()).reshape(lo.shape)
            fast_enough = lambda j0: _within(self._stage_time(stage, j0), bound, strict)
            lo = _first_true_near(fast_enough, guess, lo, np.broadcast_to(grid.j1, lo.shape))
        # V(i0, j0) + t = [V(i0, j0) - s * SW[j0]] + s * (TF[i1] - TF[i0]) + s * SW[j1] + fixed + comm,
        # s = compute scale (alpha * contention)
        best_j0 = self._window_minima(stage, values - scale * sw[None, :]).query(lo, grid.j1 - 1)
        per_end = np.minimum.reduceat(best_j0 + scale * grid.teacher_work, grid.group_starts, axis=0)
        end_cost = scale * sw[grid.j1] + fixed + model.comm_time_s(stage, grid.ends[:, None], grid.j1)
        return self._scatter(stage, per_end + end_cost, values)

    def _backtrack(self, history: list[np.ndarray], bound: float, strict: bool) -> Solution:
        model = self.model
        i1, j1 = model.num_teacher_blocks, model.num_student_blocks
        t_cuts, s_cuts = [i1], [j1]
        for stage in reversed(range(model.num_stages)):
            t_starts = self.grids[stage].i0_starts
            i0 = t_starts[t_starts < i1][:, None]
            j0 = self.grids[stage].j0[self.grids[stage].j0 < j1][None, :]
            times = model.stage_time_s(stage, i0, i1, j0, j1)
            ok = _within(times, bound, strict)
            ok &= model.stage_memory_bytes(stage, i0, i1, j0, j1) <= model.devices[stage].memory_bytes
            total = np.where(ok, history[stage][i0, j0] + times, np.inf)
            a, b = np.unravel_index(np.argmin(total), total.shape)
            if not math.isfinite(total[a, b]):
                raise RuntimeError(f"partitioner bug: no predecessor for stage {stage} ending at ({i1}, {j1})")
            i1, j1 = int(i0[a, 0]), int(j0[0, b])
            t_cuts.append(i1)
            s_cuts.append(j1)
        t_counts = tuple(np.diff(t_cuts[::-1]).tolist())
        s_counts = tuple(np.diff(s_cuts[::-1]).tolist())
        times = model.evaluate(t_counts, s_counts).stage_times_s
        return Solution(t_counts, s_counts, math.fsum(times), max(times), model.step_time_s(times))


def _within(times: np.ndarray, bound: float, strict: bool) -> np.ndarray:
    return times < bound if strict else times <= bound


def _first_true(predicate, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Elementwise smallest j in [lo, hi) with predicate(j), or hi; predicate is monotone False..True."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        ok = predicate(mid)
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)


def _first_true_near(predicate, guess: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """`_first_true` starting from a guess that is right or off by a few steps (rounding)."""
    j = np.clip(guess, lo, hi)
    while True:
        step_up = (j < hi) & ~predicate(j)
        step_down = (j > lo) & predicate(np.maximum(j - 1, 0))
        if not (step_up.any() or step_down.any()):
            return j
        j = j + step_up - step_down


class _WindowMin:
    """min(rows[row, lo..hi]) elementwise (inclusive; inf where lo > hi) via a sparse table.

    Table level k holds minima of 2**k consecutive entries, so any window is
    covered by two overlapping entries of one level.
    """

    def __init__(self, rows: np.ndarray, row: np.ndarray):
        levels, width, n = [rows], 1, rows.shape[1]
        while 2 * width <= n:
            prev = levels[-1]
            nxt = prev.copy()
            nxt[:, : n - width] = np.minimum(prev[:, :-width], prev[:, width:])
            levels.append(nxt)
            width *= 2
        self.table = np.stack(levels).reshape(-1)
        self.row_offset = row * n  # flat offset of each query's row within a level
        self.level_size, self.n = rows.size, n
        self.log2 = np.zeros(n + 1, dtype=np.intp)
        self.log2[2:] = np.floor(np.log2(np.arange(2, n + 1))).astype(np.intp)

    def query(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Needs 0 <= lo <= n and 0 <= hi < n (true for DP windows [lo, j1 - 1])."""
        level = self.log2[np.maximum(hi - lo + 1, 1)]
        base = level * self.level_size + self.row_offset
        left = np.take(self.table, base + np.minimum(lo, self.n - 1))
        right = np.take(self.table, base + (hi + 1 - (1 << level)))
        return np.where(hi >= lo, np.minimum(left, right), np.inf)
