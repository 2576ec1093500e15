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
(`PartitionDP.min_sum`, `synapse.planner.partition_dp`). An interval (lo, hi) is dropped when
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from synapse.planner.cost_model import CostModel
from synapse.planner.cost_specs import DeviceSpec, Schedule, StepSpec
from synapse.planner.partition_dp import PartitionDP, Solution
from synapse.planner.profile import ModelProfile

_REL_TOL = 1e-12
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
        best = min(at_b0, cheapest, key=lambda s: s.objective_s)
        stack = [(b0, at_b0.sum_s, cheapest.max_s, False, cheapest.sum_s)]
        while stack:
            best = self._explore(stack, *stack.pop(), best)
        return best

    def _explore(self, stack: list, lo: float, sum_at_lo: float, hi: float, closed: bool, sum_floor: float,
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
