"""Exact joint teacher/student partitioning over K heterogeneous devices.

Stage r (device r, order fixed = pipeline order) gets teacher blocks
[a_r, a_{r+1}) and student blocks [b_r, b_{r+1}), at least one of each. The
objective is the cost model's step time

    F = sum_r t_r + (M - 1) * max_r t_r  (+ a constant optimizer step)

subject to every stage fitting its device's memory.

F mixes a sum and a max, so no single DP over (stage, teacher prefix, student
prefix) minimises it. We use the bottleneck decomposition

    min F = min_B [ (M - 1) * B + g(B) ],  g(B) = min { sum_r t_r : every t_r <= B, memory fits }

g is a non-increasing step function whose steps sit at stage times. The search
(`_BottleneckSearch`): one min-max DP gives the smallest feasible bottleneck
B0, one unconstrained min-sum DP gives g's floor; then branch and bound over
intervals of B in (B0, ...), each evaluation of g being one DP
(`PartitionDP.min_sum`, below). An interval (lo, hi) is dropped when
(M - 1) * lo + g(hi) cannot beat the best plan, or when g(lo) == g(hi); its
ends snap to the exact bottlenecks of the plans found, so the search ends.

What is exact: the returned plan minimises F over all partitions (every stage
>= 1 block of each model, memory respected) up to floating-point rounding; the
only tolerance is a relative 1e-12 in the pruning tests. Stage times and
memory use the cost model's canonical expressions, so the constraints t_r <= B
and memory <= capacity are evaluated exactly as `CostModel.evaluate` does.
The unit tests check this against brute-force enumeration.

Cost: each DP is O(K * T^2 * S) numpy work (T, S = block counts, plus a log
factor). The number of DPs is usually 4-20 but grows with the number of
Pareto-optimal (bottleneck, sum) trade-offs whose F is near the optimum: a
nearly flat F (very unequal alphas with few micro-batches) can need 100+.

The dynamic programs (`PartitionDP`): one stage after another over teacher and student
prefixes, on the cost model's canonical stage times and memory, vectorised (index grids per
stage, windows whose start is read from the prefix sums and checked by the canonical stage time
where it is in doubt, a sparse table for window minima); the search calls
them (min-max, and min-sum under a bound) as its oracle. Pure numpy.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from synapse.partitioning.cost_model import CostModel, DeviceSpec, Schedule, StepSpec
from synapse.partitioning.profile import ModelProfile


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

    # The parts of the stage time that do not depend on j0, set by PartitionDP for its cost model.
    teacher_work: np.ndarray
    comm: np.ndarray
    student_end_work: np.ndarray  # SW[j1], shape (1, J)
    j1_cells: np.ndarray  # j1 for every cell, shape (P, J)
    work_scale_s: float  # the largest block work a stage time adds (profile seconds)
    comm_max_s: float
    threshold_base: np.ndarray  # SW[j1] + teacher work + (comm + fixed) / compute scale, shape (P, J)
    scaled_teacher_work: np.ndarray  # compute scale * teacher work, shape (P, 1)
    end_cost: np.ndarray  # what the min-sum DP adds per (end pair, j1): scale * SW[j1] + fixed + comm

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
        sw = model.student_work_prefix_s
        for stage, grid in enumerate(self.grids):  # parts of the stage time that do not depend on j0
            grid.teacher_work = model.teacher_work_s(grid.i0, grid.i1)
            grid.comm = model.comm_time_s(stage, grid.i1, grid.j1)
            grid.student_end_work = sw[grid.j1]
            grid.j1_cells = np.ascontiguousarray(np.broadcast_to(grid.j1, grid.comm.shape))
            grid.work_scale_s = float(sw[-1] + np.max(grid.teacher_work))
            grid.comm_max_s = float(np.max(grid.comm))
            scale, fixed = model.compute_scale(stage), model.stage_fixed_s(stage)
            grid.threshold_base = grid.student_end_work + grid.teacher_work + (grid.comm + fixed) / scale
            grid.scaled_teacher_work = scale * grid.teacher_work
            grid.end_cost = scale * sw[grid.j1] + fixed + model.comm_time_s(stage, grid.ends[:, None], grid.j1)
        self._padded_student_work = np.concatenate(([-np.inf], sw, [np.inf]))
        # an even grid of _BUCKETS_PER_BLOCK buckets per block over the prefix sums, and the cut each bucket starts at
        edges = np.arange(_BUCKETS_PER_BLOCK * len(sw) + 1)
        self._buckets_per_s = (len(edges) - 1) / sw[-1] if sw[-1] > 0 else 0.0
        self._bucket_first_cut = np.searchsorted(sw, edges / self._buckets_per_s if sw[-1] > 0 else edges * 0.0)
        self._bucket_first_sum = self._padded_student_work[self._bucket_first_cut + 1]
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

        def fits(j0: np.ndarray) -> np.ndarray:
            fitting: np.ndarray = teacher + self.model.student_memory_bytes(stage, j0, grid.j1) <= capacity
            return fitting

        return _first_true_near(fits, guess, lo, hi)

    def _stage_time(self, stage: int, j0: np.ndarray) -> np.ndarray:
        """Canonical stage time for every (pair, j1) of the grid, student start cut j0."""
        grid = self.grids[stage]
        student_work = self.model.student_work_s(j0, grid.j1)
        return self.model.combine_stage_time(stage, grid.teacher_work, student_work, grid.comm)

    def _window_minima(self, stage: int, rows: np.ndarray) -> _WindowMin:
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

        def h(q: np.ndarray) -> np.ndarray:
            return window_min.query(q, grid.j1 - 1)

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
        scale, lo, sw = model.compute_scale(stage), self._memory_lo[stage], model.student_work_prefix_s
        if math.isfinite(bound):
            lo = self._first_fast_enough(stage, lo, bound, strict)
        # V(i0, j0) + t = [V(i0, j0) - s * SW[j0]] + s * (TF[i1] - TF[i0]) + s * SW[j1] + fixed + comm,
        # s = compute scale (alpha * contention)
        best_j0 = self._window_minima(stage, values - scale * sw[None, :]).query(lo, grid.j1 - 1)
        best_j0 += grid.scaled_teacher_work
        per_end = np.minimum.reduceat(best_j0, grid.group_starts, axis=0)
        per_end += grid.end_cost
        return self._scatter(stage, per_end, values)

    def _first_fast_enough(self, stage: int, lo: np.ndarray, bound: float, strict: bool) -> np.ndarray:
        """Per (pair, j1): the first j0 in [lo, j1 - 1] whose canonical stage time is within `bound`, or j1.

        In exact arithmetic the stage time is within the bound iff SW[j0] >= threshold (the prefix sums
        solved for the bound), so the first such j0 is where the threshold falls among the prefix sums.
        The canonical time rounds, so that answer is taken only where the prefix sums on either side lie
        clearly (a margin 1e6 times any rounding of these few operations) on their side of the threshold;
        in the few cells where one does not (a bound equal to one of its stage times: the search asks
        those), the canonical time decides. The stage time is non-increasing in j0 (the cost model's
        promise), so the answer is the one a search of the canonical times from any start finds.
        """
        model, grid = self.model, self.grids[stage]
        scale, fixed = model.compute_scale(stage), model.stage_fixed_s(stage)
        # SW[j1] - ((bound - comm - fixed) / scale - teacher work), the bound's part apart (within the margin)
        threshold = grid.threshold_base - bound / scale
        guess = self._prefix_sums_below(threshold)
        hi = grid.j1_cells
        first: np.ndarray = np.minimum(np.maximum(guess, lo), hi)
        # |every rounding| <= a few ulps of this scale (the terms' sizes, in profile seconds)
        margin = 1e-9 * (grid.work_scale_s + (abs(bound) + grid.comm_max_s + abs(fixed)) / scale)
        if not math.isfinite(margin):
            unsure = np.arange(first.size)
        else:
            padded = self._padded_student_work  # padded[g + 1] = SW[g]: -inf before the first cut, inf after the last
            fast = (guess >= hi) | (padded[1:].take(guess) - threshold > margin)
            slow_before = (guess <= lo) | (threshold - padded.take(guess) > margin)
            unsure = np.flatnonzero(~(fast & slow_before))
        if unsure.size:
            rows, cols = np.divmod(unsure, first.shape[1])
            teacher_work, comm, j1 = grid.teacher_work[rows, 0], grid.comm[rows, cols], grid.j1[0, cols]

            def fast_enough(j0: np.ndarray) -> np.ndarray:
                times = model.combine_stage_time(stage, teacher_work, model.student_work_s(j0, j1), comm)
                return _within(times, bound, strict)

            np.put(first, unsure, _first_true_near(fast_enough, first.take(unsure), lo.take(unsure), j1))
        return first

    def _prefix_sums_below(self, threshold: np.ndarray) -> np.ndarray:
        """How many student prefix sums lie below each threshold, right or off by one where two sums
        share a bucket of a fine even grid (np.searchsorted exactly, but several times slower)."""
        buckets = self._bucket_first_cut
        scaled = threshold * self._buckets_per_s
        bucket = np.clip(scaled, 0.0, len(buckets) - 1.0, out=scaled).astype(np.intp)
        below: np.ndarray = buckets.take(bucket)  # the sums below the bucket's left edge
        below += self._bucket_first_sum.take(bucket) < threshold  # and the first sum in it, if below too
        return below

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
        stage_times = model.evaluate(t_counts, s_counts).stage_times_s
        return Solution(t_counts, s_counts, math.fsum(stage_times), max(stage_times), model.step_time_s(stage_times))


# A monotone test over an array of cuts: elementwise False up to some cut, True from there on.
CutPredicate = Callable[[np.ndarray], np.ndarray]


def _within(times: np.ndarray, bound: float, strict: bool) -> np.ndarray:
    return times < bound if strict else times <= bound


def _first_true(predicate: CutPredicate, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
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


def _first_true_near(predicate: CutPredicate, guess: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """`_first_true` starting from a guess that is right or off by a few steps (rounding)."""
    j: np.ndarray = np.clip(guess, lo, hi)
    while True:
        step_up = (j < hi) & ~predicate(j)
        step_down = (j > lo) & predicate(np.maximum(j - 1, 0))
        if not (step_up.any() or step_down.any()):
            return j
        j = j + step_up - step_down


@functools.cache
def _window_offsets(n: int, level_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Where a window of width w = 0..n reads its two covering entries in a `_WindowMin` table of rows of
    length n (`level_size` entries a level): the left entry at left[w] + row * n + lo, the right one at
    right[w] + row * n + hi, both in the table's all-inf last level for an empty window (w = 0). Read-only:
    shared by every table of that shape. Also the number of levels (one per power of two up to n)."""
    widths = np.arange(n + 1)
    level = np.zeros(n + 1, dtype=np.intp)
    level[2:] = np.floor(np.log2(widths[2:])).astype(np.intp)
    levels = int(level[n]) + 1
    left = level * level_size
    right = left + 1 - (1 << level)
    left[0] = right[0] = levels * level_size  # lo = hi + 1 for an empty window, so right[0] + hi = left[0] + lo - 1
    right[0] += 1
    for offsets in (left, right):
        offsets.setflags(write=False)
    return left, right, levels


class _WindowMin:
    """min(rows[row, lo..hi]) elementwise (inclusive; inf where lo > hi) via a sparse table.

    Table level k holds minima of 2**k consecutive entries, so any window is
    covered by two overlapping entries of one level; a last level of inf answers
    the empty windows, so a query is a few index sums and two reads.
    """

    def __init__(self, rows: np.ndarray, row: np.ndarray):
        n = rows.shape[1]
        self.left_offset, self.right_offset, levels = _window_offsets(n, rows.size)
        flat = np.empty((levels + 1) * rows.size + n)  # the inf level one row longer: lo = n reads it too
        table = flat[: levels * rows.size].reshape(levels, *rows.shape)
        table[0] = rows
        width = 1
        for prev, nxt in zip(table[:-1], table[1:]):  # filled in place: the DPs build thousands of these
            np.minimum(prev[:, :-width], prev[:, width:], out=nxt[:, : n - width])
            nxt[:, n - width :] = prev[:, n - width :]
            width *= 2
        flat[levels * rows.size :] = np.inf
        self.table = flat
        self.row_offset = row * n  # flat offset of each query's row within a level

    def query(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Needs 0 <= lo <= hi + 1 <= n (true for the DP windows [lo, j1 - 1])."""
        width = hi + 1 - lo
        left = self.left_offset.take(width)
        left += self.row_offset
        left += lo
        right = self.right_offset.take(width)
        right += self.row_offset
        right += hi
        minima: np.ndarray = self.table.take(left)
        np.minimum(minima, self.table.take(right), out=minima)
        return minima


_REL_TOL = 1e-12
_BUCKETS_PER_BLOCK = 64  # two prefix sums rarely share a bucket; a shared one costs a canonical check
_GIB = float(1 << 30)


class PlanError(ValueError):
    """No partition satisfies the request; the message gives the numbers and a fix."""


@dataclass(frozen=True)
class PartitionPlan:
    """Blocks per stage for both models plus the cost model's predictions."""

    device_names: tuple[str, ...]
    teacher_counts: tuple[int, ...]
    student_counts: tuple[int, ...]
    stage_compute_s: tuple[float, ...]
    stage_comm_s: tuple[float, ...]
    stage_times_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    step_time_s: float
    microbatches: int
    schedule: str
    dp_solves: int = field(default=0, compare=False)  # search effort, for benchmarks
    stage_overhead_s: tuple[float, ...] = ()  # per micro-batch; stage time = compute + overhead + comm

    @property
    def teacher_cuts(self) -> tuple[int, ...]:
        return tuple(np.cumsum((0, *self.teacher_counts)).tolist())

    @property
    def student_cuts(self) -> tuple[int, ...]:
        return tuple(np.cumsum((0, *self.student_counts)).tolist())

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__} | {
            "teacher_cuts": self.teacher_cuts, "student_cuts": self.student_cuts}


def even_partition(n_blocks: int, num_stages: int) -> tuple[int, ...]:
    """Blocks per stage as equal as possible; earlier stages get the remainder."""
    if num_stages < 1 or n_blocks < num_stages:
        raise PlanError(f"cannot split {n_blocks} blocks into {num_stages} stages of >= 1 block; "
                        f"use between 1 and {n_blocks} stages")
    base, extra = divmod(n_blocks, num_stages)
    return tuple(base + (1 if r < extra else 0) for r in range(num_stages))


def plan_partition(
    teacher: ModelProfile,
    student: ModelProfile,
    devices: Sequence[DeviceSpec],
    microbatches: int,
    schedule: Schedule | str = Schedule.ONE_F_ONE_B,
    *,
    optimizer_state_multiplier: float = 1.0,
    optimizer_step_s: float = 0.0,
    per_microbatch_overhead_s: float = 0.0,
    loss_s: float = 0.0,
) -> PartitionPlan:
    """Exact min-step-time partition of teacher and student over `devices` (in pipeline order)."""
    step = StepSpec(microbatches, Schedule.parse(schedule), optimizer_state_multiplier, optimizer_step_s,
                    per_microbatch_overhead_s=per_microbatch_overhead_s, loss_s=loss_s)
    return plan_with_cost_model(CostModel(teacher, student, devices, step))


def plan_with_cost_model(model: CostModel) -> PartitionPlan:
    """`plan_partition` for an already built cost model."""
    _check_enough_blocks(model)
    dp = PartitionDP(model)
    best = _BottleneckSearch(dp, model).run()
    cost = model.evaluate(best.teacher_counts, best.student_counts)
    return PartitionPlan(
        device_names=tuple(d.name for d in model.devices),
        teacher_counts=best.teacher_counts,
        student_counts=best.student_counts,
        stage_compute_s=cost.stage_compute_s,
        stage_comm_s=cost.stage_comm_s,
        stage_times_s=cost.stage_times_s,
        stage_memory_bytes=cost.stage_memory_bytes,
        step_time_s=cost.step_time_s,
        microbatches=model.step.microbatches,
        schedule=model.step.schedule.value,
        dp_solves=dp.solves,
        stage_overhead_s=cost.stage_overhead_s,
    )


def _check_enough_blocks(model: CostModel) -> None:
    k = model.num_stages
    for which, n in (("teacher", model.num_teacher_blocks), ("student", model.num_student_blocks)):
        if n < k:
            raise PlanError(f"{k} devices but the {which} has only {n} blocks; every stage needs >= 1 block "
                            f"of each model: use at most {n} devices or cut the {which} into finer blocks")


# An interval of bottlenecks still to explore: (lo, sum_at_lo, hi, closed, sum_floor), as _BottleneckSearch says.
_Interval = tuple[float, float, float, bool, float]


class _BottleneckSearch:
    """Branch and bound over the bottleneck B (see module docstring).

    An interval (lo, hi] (or (lo, hi) when hi is open) holds bottleneck values
    not yet explored; g(lo) = sum_at_lo is known exactly (a plan with max <= lo
    was found) and g >= sum_floor on the interval.
    """

    def __init__(self, dp: PartitionDP, model: CostModel):
        self.dp, self.model = dp, model
        self.waiting_factor = model.step.microbatches - 1
        self.fixed_s = model.step.optimizer_step_s

    def run(self) -> Solution:
        cheapest = self.dp.min_sum(math.inf, strict=False)
        if cheapest is None:
            raise _memory_error(self.model)
        if self.waiting_factor == 0:  # M = 1: the step time is the plain sum
            return cheapest
        b0 = self.dp.min_bottleneck()
        at_b0 = self.dp.min_sum(b0, strict=False)  # its max is exactly b0
        if at_b0 is None:
            raise RuntimeError(f"partitioner bug: no plan within the smallest feasible bottleneck {b0}")
        best = min(at_b0, cheapest, key=lambda s: s.objective_s)
        stack = [(b0, at_b0.sum_s, cheapest.max_s, False, cheapest.sum_s)]
        while stack:
            best = self._explore(stack, *stack.pop(), best)
        return best

    def _explore(self, stack: list[_Interval], lo: float, sum_at_lo: float, hi: float, closed: bool, sum_floor: float,
                 best: Solution) -> Solution:
        cutoff = (best.objective_s - self.fixed_s - sum_floor) / self.waiting_factor
        if cutoff < hi:  # a bottleneck above the cutoff cannot beat `best` even at the minimum sum
            hi, closed = cutoff, True
        if self._settled(lo, sum_at_lo, hi, sum_floor, best):
            return best
        top = self.dp.min_sum(hi, strict=not closed)
        if top is None:
            return best
        best = min(best, top, key=lambda s: s.objective_s)
        hi, sum_floor = top.max_s, top.sum_s  # [top.max_s, hi] is covered by `top`
        hi = min(hi, (best.objective_s - self.fixed_s - sum_floor) / self.waiting_factor)
        if self._settled(lo, sum_at_lo, hi, sum_floor, best):
            return best
        mid = 0.5 * (lo + hi)
        at_mid = self.dp.min_sum(mid, strict=False)
        if at_mid is None:
            stack.append((mid, math.inf, hi, False, sum_floor))
            return best
        stack.append((mid, at_mid.sum_s, hi, False, sum_floor))
        stack.append((lo, sum_at_lo, at_mid.max_s, False, at_mid.sum_s))  # explored first
        return min(best, at_mid, key=lambda s: s.objective_s)

    def _settled(self, lo: float, sum_at_lo: float, hi: float, sum_floor: float, best: Solution) -> bool:
        if hi <= lo:
            return True
        # A plan with bottleneck in (lo, hi] has sum >= sum_floor, so F > this bound.
        bound = self.waiting_factor * lo + sum_floor + self.fixed_s
        if bound >= best.objective_s * (1 - _REL_TOL):
            return True
        # g constant on the interval: the plan found at lo is at least as good as any in it.
        return sum_at_lo <= sum_floor * (1 + _REL_TOL)


def _memory_error(model: CostModel) -> PlanError:
    k = model.num_stages
    even_t = even_partition(model.num_teacher_blocks, k)
    even_s = even_partition(model.num_student_blocks, k)
    even_memory = model.evaluate(even_t, even_s).stage_memory_bytes
    need = ", ".join(f"{m / _GIB:.2f}" for m in even_memory)
    have = ", ".join(f"{d.memory_bytes / _GIB:.2f}" for d in model.devices)
    return PlanError(
        f"no partition of {model.num_teacher_blocks} teacher / {model.num_student_blocks} student blocks over "
        f"{k} devices fits in memory: capacities [{have}] GiB, the even partition needs [{need}] GiB per stage. "
        f"Fix: add devices, lower the micro-batch size (activations scale with it), use fewer micro-batches "
        f"in flight (1f1b instead of gpipe), or an optimizer with less state (SGD instead of AdamW)."
    )
