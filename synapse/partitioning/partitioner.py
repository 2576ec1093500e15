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

Kept across searches (a controller searches a slowdown step after step, on cost models that differ
in a device or two): each DP's values after each stage, by its question and the first stages'
devices (`KeptStageValues`: a DP starts after the longest run of first stages answered before,
from the very arrays computed then); the index grids by shape; what depends on the profiles alone
(teacher work per pair, each stage's memory window starts per capacity, the prefix sums' indexes).
A window start is read from a coarse index of the prefix sums (`_clear_sum_index`) wherever no
prefix sum lies near its threshold, and by np.searchsorted and the canonical time elsewhere. None of
these changes a number: the same expressions on the same inputs, or a lookup of their result
(tests/unit/test_partitioner_kept.py against the plain path).
"""
from __future__ import annotations

import functools
import itertools
import math
import threading
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
    threshold_index_base: np.ndarray  # threshold_base in buckets of `_clear_sum_index`, + 2 (its first index)
    scaled_teacher_work: np.ndarray  # compute scale * teacher work, shape (P, 1)
    end_cost: np.ndarray  # what the min-sum DP adds per (end pair, j1): scale * SW[j1] + fixed + comm
    window_ends: np.ndarray  # (i0 - first i0) * (S + 1) + j1: a min-sum window's end in a `_WindowMin` of the rows
    scale: float  # the cost model's compute_scale(stage)
    fixed: float  # the cost model's stage_fixed_s(stage)
    rows_first: int  # the first teacher start cut (the first row of the DP's values a window table reads)

    def __init__(self, stage: int, num_stages: int, num_teacher: int, num_student: int):
        shape = _grid_shape(stage, num_stages, num_teacher, num_student)  # shared, read-only
        self.i0, self.i1, self.ends, self.group_starts, self.i0_starts, self.j0, self.j1, self.pair_row = shape


@functools.lru_cache(maxsize=256)
def _grid_shape(stage: int, num_stages: int, num_teacher: int, num_student: int) -> tuple[np.ndarray, ...]:
    """A `_StageGrid`'s index arrays (i0, i1, ends, group_starts, i0_starts, j0, j1, pair_row), read-only:
    they depend on the stage, the stage count and the block counts alone, and every DP on such a model reads
    them. pair_row[i0, i1] is the row of the pair (i0, i1), -1 for none."""
    t_starts, t_ends = _cut_range(stage, num_stages, num_teacher)
    s_starts, s_ends = _cut_range(stage, num_stages, num_student)
    i1, i0 = np.meshgrid(t_ends, t_starts, indexing="ij")
    keep = i0 < i1
    pair_i0, pair_i1 = i0[keep][:, None], i1[keep][:, None]
    ends, group_starts = np.unique(pair_i1[:, 0], return_index=True)
    pair_row = np.full((num_teacher + 1, num_teacher + 1), -1, dtype=np.intp)  # (i0, i1) -> its row
    pair_row[pair_i0[:, 0], pair_i1[:, 0]] = np.arange(len(pair_i0))
    arrays = (pair_i0, pair_i1, ends, group_starts, t_starts, s_starts, s_ends[None, :], pair_row)
    for array in arrays:
        array.setflags(write=False)
    return arrays


class _KeptByProfiles:
    """Arrays a DP derives from its cost model's profiles, step and stage count (and a few numbers more, in
    the key) alone, kept for the next DP on them: a controller searching a slowdown builds a DP per search
    on the same profiles. Keyed by the profiles' identity; each entry holds them, so an id is not reused
    while it is kept. Read-only arrays; at most `most` entries (all dropped when full)."""

    def __init__(self, most: int):
        self._most = most
        self._kept: dict[tuple[object, ...], tuple[object, object, np.ndarray]] = {}

    def get(self, model: CostModel, key: tuple[object, ...], compute: Callable[[], np.ndarray]) -> np.ndarray:
        full_key = (id(model.teacher), id(model.student), model.step, model.num_stages, *key)
        entry = self._kept.get(full_key)
        if entry is None or entry[0] is not model.teacher or entry[1] is not model.student:
            if len(self._kept) >= self._most:
                self._kept.clear()
            value = compute()
            value.setflags(write=False)
            entry = self._kept[full_key] = (model.teacher, model.student, value)
        return entry[2]


_KEPT_BY_PROFILES = _KeptByProfiles(most=256)


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

    def __init__(self, model: CostModel, kept: KeptStageValues | None = None):
        self.model, self.solves = model, 0
        # the values after each stage kept across DPs and searches (None: every DP from its first stage)
        self._kept = kept
        self._prefix_ids = kept.prefix_ids(model) if kept is not None else []
        k, nt, ns = model.num_stages, model.num_teacher_blocks, model.num_student_blocks
        self.grids = [_StageGrid(r, k, nt, ns) for r in range(k)]
        sw = model.student_work_prefix_s
        self._clear_buckets_per_s = _clear_buckets_per_s(sw)
        for stage, grid in enumerate(self.grids):  # parts of the stage time that do not depend on j0
            grid.teacher_work = _KEPT_BY_PROFILES.get(model, ("teacher work", stage),
                                                      functools.partial(model.teacher_work_s, grid.i0, grid.i1))
            grid.comm = model.comm_time_s(stage, grid.i1, grid.j1)
            grid.student_end_work = sw[grid.j1]
            grid.j1_cells = _KEPT_BY_PROFILES.get(model, ("j1 cells", stage), functools.partial(
                lambda grid: np.ascontiguousarray(np.broadcast_to(grid.j1, (len(grid.i0), grid.j1.shape[1]))), grid))
            # each cell's flat offset of its window's end in a `_WindowMin` of the DP's rows, less its width
            grid.window_ends = _KEPT_BY_PROFILES.get(model, ("window ends", stage), functools.partial(
                lambda grid: (grid.i0 - grid.i0.min()) * (ns + 1) + grid.j1, grid))
            grid.work_scale_s = float(sw[-1] + np.max(grid.teacher_work))
            grid.comm_max_s = float(np.max(grid.comm))
            scale, fixed = model.compute_scale(stage), model.stage_fixed_s(stage)
            grid.scale, grid.fixed = scale, fixed
            grid.rows_first = int(grid.i0_starts[0])  # the DP's rows a window table needs: i0_starts, in order
            grid.threshold_base = grid.student_end_work + grid.teacher_work + (grid.comm + fixed) / scale
            grid.threshold_index_base = grid.threshold_base * self._clear_buckets_per_s + 2.0
            grid.scaled_teacher_work = scale * grid.teacher_work
            grid.end_cost = scale * sw[grid.j1] + fixed + model.comm_time_s(stage, grid.ends[:, None], grid.j1)
        self._padded_student_work = _KEPT_BY_PROFILES.get(
            model, ("padded sums",), lambda: np.concatenate(([-np.inf], sw, [np.inf])))
        self._clear_count = _KEPT_BY_PROFILES.get(model, ("clear count",), lambda: _clear_sum_index(sw)[0])
        self._murky = _KEPT_BY_PROFILES.get(model, ("in doubt",), lambda: _clear_sum_index(sw)[1])
        self._memory_lo = [
            _KEPT_BY_PROFILES.get(model, ("memory", r, model.devices[r].memory_bytes),
                                  functools.partial(self._memory_window_start, r)) for r in range(k)]

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
        student_work = grid.student_end_work - self.model.student_work_prefix_s.take(j0)  # student_work_s(j0, j1)
        return self.model.combine_stage_time(stage, grid.teacher_work, student_work, grid.comm)

    def _window_minima(self, stage: int, rows: np.ndarray) -> _WindowMin:
        """Window minima over rows[i0, lo..hi] for the grid's teacher start cuts i0."""
        grid = self.grids[stage]
        return _WindowMin(rows[grid.rows_first : grid.rows_first + len(grid.i0_starts)], grid.i0 - grid.rows_first)

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
        history = self._run_stages(("max",), lambda stage, values: self._advance_max(stage, values))
        return float(history[-1][-1, -1])

    def _run_stages(self, question: tuple[object, ...], advance: Callable[[int, np.ndarray], np.ndarray]
                    ) -> list[np.ndarray]:
        """The values before the first stage and after each: those of the longest run of first stages this
        DP's question (its kind and bound) was answered on before (`KeptStageValues`), the rest advanced."""
        history = [self._initial_values()]
        if self._kept is not None:
            history += self._kept.longest_prefix(self._prefix_ids, question)
        for stage in range(len(history) - 1, self.model.num_stages):
            history.append(advance(stage, history[-1]))
            if self._kept is not None:
                self._kept.keep(self._prefix_ids[stage], question, history[1:])
        return history

    def _advance_max(self, stage: int, values: np.ndarray) -> np.ndarray:
        # For a window [lo, j1 - 1], min_j0 max(V(i0, j0), t(j0)) = min_q max(t(q), h(q)) with
        # h(q) = min V(i0, q..j1-1): t falls and h rises in q, so the optimum sits at their crossing.
        grid = self.grids[stage]
        lo, hi = self._memory_lo[stage], np.broadcast_to(grid.j1, self._memory_lo[stage].shape)
        window_min = self._window_minima(stage, values)

        def h(q: np.ndarray) -> np.ndarray:
            return window_min.query_to_ends(q, grid.j1_cells, grid.window_ends)

        cross = _first_true(lambda q: h(q) >= self._stage_time(stage, q), lo, hi)
        # max(h, t) is h at the crossing (h >= t there) and t just before it (h < t there)
        at_cross = np.where(cross < hi, h(cross), np.inf)
        at_before = np.where(cross > lo, self._stage_time(stage, np.maximum(cross - 1, 0)), np.inf)
        per_end = np.minimum.reduceat(np.minimum(at_cross, at_before), grid.group_starts, axis=0)
        return self._scatter(stage, per_end, values)

    def min_sum(self, bound: float, strict: bool) -> Solution | None:
        self.solves += 1
        history = self._run_stages(("sum", bound, strict),
                                   lambda stage, values: self._advance_sum(stage, values, bound, strict))
        if not math.isfinite(history[-1][-1, -1]):
            return None
        return self._backtrack(history, bound, strict)

    def _advance_sum(self, stage: int, values: np.ndarray, bound: float, strict: bool) -> np.ndarray:
        model, grid = self.model, self.grids[stage]
        scale, lo, sw = grid.scale, self._memory_lo[stage], model.student_work_prefix_s
        if math.isfinite(bound):
            lo = self._first_fast_enough(stage, lo, bound, strict)
        # V(i0, j0) + t = [V(i0, j0) - s * SW[j0]] + s * (TF[i1] - TF[i0]) + s * SW[j1] + fixed + comm,
        # s = compute scale (alpha * contention)
        best_j0 = self._window_minima(stage, values - scale * sw[None, :]).query_to_ends(lo, grid.j1_cells,
                                                                                         grid.window_ends)
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
        scale, fixed = grid.scale, grid.fixed  # the cost model's compute_scale and stage_fixed_s
        hi = grid.j1_cells
        # |every rounding| <= a few ulps of this scale (the terms' sizes, in profile seconds)
        margin = 1e-9 * (grid.work_scale_s + (abs(bound) + grid.comm_max_s + abs(fixed)) / scale)
        guess, doubtful = self._sums_below_clearly(grid, bound / scale, margin)
        first: np.ndarray = np.minimum(np.maximum(guess, lo), hi)
        if doubtful is None:  # the margin does not fit the index's buckets: every cell checked as below
            doubtful = np.arange(first.size)
        if doubtful.size:  # the cells near a prefix sum: sure where both sums beside the threshold are clear of it
            # SW[j1] - ((bound - comm - fixed) / scale - teacher work), the bound's part apart (within the margin)
            near = grid.threshold_base.take(doubtful) - bound / scale
            guess = np.searchsorted(model.student_work_prefix_s, near)  # how many sums lie below
            lo_near, hi_near = lo.take(doubtful), hi.take(doubtful)
            np.put(first, doubtful, np.minimum(np.maximum(guess, lo_near), hi_near))
            padded = self._padded_student_work  # padded[g + 1] = SW[g]: -inf before the first cut, inf after the last
            fast = (guess >= hi_near) | (padded[1:].take(guess) - near > margin)
            slow_before = (guess <= lo_near) | (near - padded.take(guess) > margin)
            unsure = doubtful[~(fast & slow_before)]
        else:
            unsure = doubtful
        if unsure.size:
            rows, cols = np.divmod(unsure, first.shape[1])
            teacher_work, comm, j1 = grid.teacher_work[rows, 0], grid.comm[rows, cols], grid.j1[0, cols]

            def fast_enough(j0: np.ndarray) -> np.ndarray:
                times = model.combine_stage_time(stage, teacher_work, model.student_work_s(j0, j1), comm)
                return _within(times, bound, strict)

            np.put(first, unsure, _first_true_near(fast_enough, first.take(unsure), lo.take(unsure), j1))
        return first

    def _sums_below_clearly(self, grid: _StageGrid, bound_work_s: float, margin: float
                            ) -> tuple[np.ndarray, np.ndarray | None]:
        """How many student prefix sums lie below each threshold (`grid.threshold_base` - bound_work_s), read
        from a coarse index (`_clear_sum_index`) and right where no prefix sum lies within `margin` of the
        threshold; and the cells where one might (None: all of them, the margin too wide for the index)."""
        buckets_per_s = self._clear_buckets_per_s
        if not margin * buckets_per_s < _CLEAR_MARGIN_BUCKETS:  # also an infinite margin or no index
            return self._clear_count[:1].repeat(grid.threshold_base.size).reshape(grid.threshold_base.shape), None
        # index k: thresholds in bucket k - 2, the first and last indices open-ended; the threshold in buckets
        # rounds apart from the threshold by far less than the half bucket the index allows for
        scaled = grid.threshold_index_base - bound_work_s * buckets_per_s
        index = np.clip(scaled, 0.0, len(self._clear_count) - 1.0, out=scaled).astype(np.intp)
        return self._clear_count.take(index), np.flatnonzero(self._murky.take(index))

    def _backtrack(self, history: list[np.ndarray], bound: float, strict: bool) -> Solution:
        model = self.model
        i1, j1 = model.num_teacher_blocks, model.num_student_blocks
        t_cuts, s_cuts = [i1], [j1]
        sw = model.student_work_prefix_s
        for stage in reversed(range(model.num_stages)):
            # the start cuts before the end cuts (runs of consecutive cuts), so slices of the grid's tables
            grid = self.grids[stage]
            i0_first, j0_first = int(grid.i0_starts[0]), int(grid.j0[0])
            i0_stop, j0_stop = min(int(grid.i0_starts[-1]) + 1, i1), min(int(grid.j0[-1]) + 1, j1)
            rows = grid.pair_row[i0_first:i0_stop, i1]  # the pairs (i0, i1)
            teacher_work = grid.teacher_work[rows]  # shape (i0s, 1)
            student_work = sw[j1] - sw[j0_first:j0_stop]  # the cost model's student_work_s, shape (j0s,)
            times = model.combine_stage_time(stage, teacher_work, student_work, model.comm_time_s(stage, i1, j1))
            ok = _within(times, bound, strict)
            # fits memory: j0 from the memory window's start (the same test, `_memory_window_start`)
            ok &= np.arange(j0_first, j0_stop) >= self._memory_lo[stage][rows, j1 - grid.j1[0, 0]][:, None]
            total = np.where(ok, history[stage][i0_first:i0_stop, j0_first:j0_stop] + times, np.inf)
            a, b = np.unravel_index(np.argmin(total), total.shape)
            if not math.isfinite(total[a, b]):
                raise RuntimeError(f"partitioner bug: no predecessor for stage {stage} ending at ({i1}, {j1})")
            i1, j1 = i0_first + int(a), j0_first + int(b)
            t_cuts.append(i1)
            s_cuts.append(j1)
        t_counts = tuple(np.diff(t_cuts[::-1]).tolist())
        s_counts = tuple(np.diff(s_cuts[::-1]).tolist())
        stage_times = model.evaluate(t_counts, s_counts).stage_times_s
        return Solution(t_counts, s_counts, math.fsum(stage_times), max(stage_times), model.step_time_s(stage_times))


class KeptStageValues:
    """The DPs' values after each stage, kept across DPs and searches, by what they depend on.

    A DP's values after stage r are a function of its question (min-max, or min-sum under a bound,
    strict or not) and of stages 0..r alone: the profiles, the step, the number of stages and the
    first r + 1 devices (`DeviceSpec`s: speed, link, memory, contention). A controller searching a
    slowdown step after step asks about cost models that differ in a stage or two, so a DP whose first
    stages and question were seen before starts after them, from the very arrays computed then: the
    same answers by construction. A prefix of stages is named by a number (interned: profiles, step
    and stage count, then one device at a time), so a question's key is cheap to hash. Read-only
    arrays; at most `budget_bytes` of them kept (least recently used dropped first); thread-safe.
    """

    def __init__(self, budget_bytes: int = 32 << 20):
        self.budget_bytes, self.kept_bytes = budget_bytes, 0
        self._lock = threading.Lock()
        # (the previous prefix's id, or the profiles' ids, step and stage count; the next device) -> id;
        # the first stage's entry holds the profiles, so their ids are not reused while it is kept
        self._prefix_ids: dict[tuple[object, ...], tuple[int, object]] = {}
        self._numbers = itertools.count()
        self._values: dict[tuple[object, ...], tuple[np.ndarray, ...]] = {}

    def prefix_ids(self, model: CostModel) -> list[int]:
        """The id of each run of first stages 0..r of `model`."""
        ids: list[int] = []
        head: object = (id(model.teacher), id(model.student), model.step, model.num_stages)
        with self._lock:
            if len(self._prefix_ids) > _MOST_PREFIX_IDS:  # forgotten ids only cost their values' reuse
                self._prefix_ids.clear()
            for device in model.devices:
                key = (head, device)
                entry = self._prefix_ids.get(key)
                if entry is None:
                    entry = self._prefix_ids[key] = (next(self._numbers), (model.teacher, model.student))
                ids.append(entry[0])
                head = entry[0]
        return ids

    def longest_prefix(self, prefix_ids: Sequence[int], question: tuple[object, ...]) -> list[np.ndarray]:
        """The values after stages 0..r for the longest such run answered before (empty if none)."""
        with self._lock:
            for prefix_id in reversed(prefix_ids):
                key = (prefix_id, *question)
                values = self._values.pop(key, None)
                if values is not None:
                    self._values[key] = values  # the most recently used last
                    return list(values)
        return []

    def keep(self, prefix_id: int, question: tuple[object, ...], values: Sequence[np.ndarray]) -> None:
        """Keep the values after stages 0..r (r + 1 = len(values)); the last array is new."""
        values[-1].setflags(write=False)
        key = (prefix_id, *question)
        with self._lock:
            replaced = self._values.pop(key, None)  # kept meanwhile by another thread's DP (the same values)
            self.kept_bytes -= 0 if replaced is None else replaced[-1].nbytes
            self._values[key] = tuple(values)
            self.kept_bytes += values[-1].nbytes
            while self.kept_bytes > self.budget_bytes and self._values:
                oldest = next(iter(self._values))
                self.kept_bytes -= self._values.pop(oldest)[-1].nbytes


_MOST_PREFIX_IDS = 1 << 16
_KEPT_STAGE_VALUES = KeptStageValues()


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


@functools.cache
def _window_offsets_by_width(n: int, level_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`_window_offsets` read from a window's end: for a window [end - w, end - 1] of row `row`, its two
    covering entries sit at left[w] + row * n + end and right[w] + row * n + end (read-only, shared)."""
    left, right, _ = _window_offsets(n, level_size)
    from_end = (left - np.arange(n + 1), right - 1)
    for offsets in from_end:
        offsets.setflags(write=False)
    return from_end


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
        self.row_length, self.level_size = n, rows.size

    def query_to_ends(self, lo: np.ndarray, ends: np.ndarray, window_ends: np.ndarray) -> np.ndarray:
        """`query(lo, ends - 1)`, with `window_ends` = row * n + ends given: the two reads' offsets less that
        part depend on the width alone (fewer index sums on the min-sum DP's every cell)."""
        width = ends - lo
        left, right = _window_offsets_by_width(self.row_length, self.level_size)
        first = left.take(width)
        first += window_ends
        second = right.take(width)
        second += window_ends
        minima: np.ndarray = self.table.take(first)
        np.minimum(minima, self.table.take(second), out=minima)
        return minima

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


def _clear_sum_index(prefix_sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An index over the (non-decreasing, from 0) prefix sums by an even grid of buckets
    (`_CLEAR_BUCKETS_PER_BLOCK` a block): a threshold x falls in bucket floor(x * buckets_per_s), read at
    index k = bucket + 2 (clipped: index 0 holds every x below bucket -1, the last every x above the last
    sum by more than a bucket). Per index: how many sums lie below its thresholds, and whether that is in
    doubt: a sum within half a bucket of its thresholds' range (their neighbourhood within any margin
    under `_CLEAR_MARGIN_BUCKETS` buckets, with the rounding of x * buckets_per_s, a bucket's edge either
    way). Returns (sums below, in doubt) per index; one index, in doubt, if every sum is 0."""
    buckets_per_s = _clear_buckets_per_s(prefix_sums)
    if buckets_per_s == 0.0:
        return np.zeros(1, dtype=np.intp), np.ones(1, dtype=bool)
    buckets = _CLEAR_BUCKETS_PER_BLOCK * (len(prefix_sums) - 1)
    index = np.arange(buckets + 5, dtype=float)  # index k: thresholds in [(k - 2) / buckets_per_s, (k - 1) / ...)
    low_edge, high_edge = (index - 2.5) / buckets_per_s, (index - 0.5) / buckets_per_s
    low_edge[0], high_edge[-1] = -np.inf, np.inf
    below = np.searchsorted(prefix_sums, low_edge, side="left")  # sums < the range's low edge
    in_doubt = np.searchsorted(prefix_sums, high_edge, side="right") > below  # a sum within the range
    return below, in_doubt


def _clear_buckets_per_s(prefix_sums: np.ndarray) -> float:
    """The buckets a profile second of `_clear_sum_index` (0.0 if every sum is 0: no index)."""
    total = float(prefix_sums[-1])
    buckets_per_s = _CLEAR_BUCKETS_PER_BLOCK * (len(prefix_sums) - 1) / total if total > 0 else 0.0
    return buckets_per_s if math.isfinite(buckets_per_s) else 0.0  # sums too small for buckets: no index


_REL_TOL = 1e-12
_CLEAR_BUCKETS_PER_BLOCK = 256  # a sum marks ~3 of them: ~1% of thresholds checked further
_CLEAR_MARGIN_BUCKETS = 0.25  # a margin wider than this many buckets: no cell is read from the index
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
    dp = PartitionDP(model, _KEPT_STAGE_VALUES)
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
