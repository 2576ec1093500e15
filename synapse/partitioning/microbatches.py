"""How many micro-batches a step is cut into, chosen together with the cuts (``pipeline.microbatches=auto``).

More micro-batches shrink the pipeline bubble, (K-1)/(M+K-1) of the step, but each is smaller,
and a small micro-batch runs a device less efficiently (on a GPU, down to launch-bound); more
micro-batches in flight also hold more activations. The cost model prices all three when it is
given the block profiles measured *at that micro-batch size*, so the choice is a plain search:
for every candidate M, plan the best placement with profiles at batch/M and keep the fastest
step. Pure: the caller measures (or reads cached) profiles per candidate.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from synapse.partitioning.cost_model import CostModelError
from synapse.partitioning.partitioner import PartitionPlan, PlanError
from synapse.partitioning.planner import StagePlanner


class MicrobatchChoiceError(ValueError):
    """No candidate micro-batch count can run (the message says why for each)."""


def candidate_counts(batch_size: int, num_stages: int, most: int | None = None) -> tuple[int, ...]:
    """Micro-batch counts worth pricing: the divisors of the batch from the stage count up (fewer
    leave stages idle for most of the step), at most ``most`` (default 4 K: the bubble is then
    under 20% and smaller micro-batches only lose efficiency) and at most half the batch (two
    samples per micro-batch), or the largest divisors below that range when it holds none."""
    if batch_size < 1 or num_stages < 1:
        raise MicrobatchChoiceError(f"batch_size={batch_size} and num_stages={num_stages} must be >= 1")
    most = min(most or 4 * num_stages, max(1, batch_size // 2))  # a micro-batch of one sample cannot train BatchNorm
    divisors = [m for m in range(1, batch_size + 1) if batch_size % m == 0]
    wanted = tuple(m for m in divisors if num_stages <= m <= most)
    return wanted or tuple(m for m in divisors if m <= most)[-2:]


@dataclass(frozen=True)
class MicrobatchChoice:
    microbatches: int
    plan: PartitionPlan
    step_time_by_count: Mapping[int, float]  # every candidate's best predicted step (inf: could not run)
    reasons: Mapping[int, str]  # why a candidate could not run


def choose_microbatches(planner_for: Callable[[int], StagePlanner], candidates: Sequence[int],
                        devices: Sequence[int], alphas: Sequence[float] | None = None) -> MicrobatchChoice:
    """The candidate whose best placement has the shortest predicted step.

    ``planner_for(m)``: the run's planner with block profiles measured at the micro-batch size of
    ``m`` micro-batches and a step of ``m`` micro-batches.
    """
    times: dict[int, float] = {}
    reasons: dict[int, str] = {}
    best: tuple[float, int, PartitionPlan] | None = None
    for m in candidates:
        try:
            plan = planner_for(m).full_plan(devices, alphas)
        except (PlanError, CostModelError) as exc:  # e.g. activations of m micro-batches in flight do not fit
            times[m], reasons[m] = float("inf"), str(exc)
            continue
        times[m] = plan.step_time_s
        if best is None or plan.step_time_s < best[0]:
            best = (plan.step_time_s, m, plan)
    if best is None:
        raise MicrobatchChoiceError("no micro-batch count can run: " + "; ".join(f"M={m}: {why}"
                                                                               for m, why in reasons.items()))
    return MicrobatchChoice(best[1], best[2], times, reasons)
