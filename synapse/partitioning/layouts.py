"""Which layout a run takes on N devices (``trainer.replicas=auto`` with ``partition=auto``): R replicas
of a K-stage pipeline (R x K = N), the cuts and the micro-batch count, chosen together.

A pipeline pays for its bubble and its links; replicas pay for the all-reduce of the student's
gradients and run each model whole on smaller batches. Which wins depends on the models, the
batch, each device's memory and speed, and the links, so the choice is a search over every
(R, M) the devices and the batch allow: price each with block profiles measured at its own
micro-batch (the global batch over R x M) through the same cost model every re-plan uses
(``StagePlanner.layout_cost``: the slowest replica's pipeline plus the gradient all-reduce), and
keep the fastest step. Replicas on devices of different speed get shares of the batch in
proportion to their speed when that is faster than equal shares. Pure: the caller measures (or reads
cached) profiles per micro-batch size.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from synapse.partitioning.cost_model import CostModelError
from synapse.partitioning.microbatches import candidate_counts
from synapse.partitioning.partitioner import PlanError
from synapse.partitioning.placement import PartitionError, Placement, equal_shares
from synapse.partitioning.planner import StagePlanner


class LayoutChoiceError(ValueError):
    """No layout can run on these devices (the message says why for each candidate)."""


@dataclass(frozen=True)
class LayoutCandidate:
    replicas: int
    stages: int
    microbatches: int
    step_time_s: float  # predicted; inf: cannot run (``reason``)
    allreduce_s: float = 0.0
    placement: Placement | None = None
    reason: str | None = None

    def images_per_s(self, batch: int) -> float:
        return batch / self.step_time_s if math.isfinite(self.step_time_s) else 0.0

    def to_dict(self, batch: int) -> dict[str, object]:
        return {"replicas": self.replicas, "stages": self.stages, "microbatches": self.microbatches,
                "shares": list(self.placement.shares) if self.placement else None,
                "step_time_s": self.step_time_s if math.isfinite(self.step_time_s) else None,
                "images_per_s": self.images_per_s(batch), "allreduce_s": self.allreduce_s,
                "teacher": list(self.placement.teacher_counts) if self.placement else None,
                "student": list(self.placement.student_counts) if self.placement else None,
                "reason": self.reason}


@dataclass(frozen=True)
class LayoutChoice:
    chosen: LayoutCandidate
    candidates: tuple[LayoutCandidate, ...]  # every layout priced, the impossible ones with their reason


def layout_shapes(num_devices: int, batch: int, max_stages: int, replicas: int | None = None,
                  microbatches: int | None = None) -> list[tuple[int, int, int]]:
    """Every (R, K, M) worth pricing: R divides the devices (or is the given count), K = N / R stages of
    at most ``max_stages`` (the shallower model's block count), and M micro-batches (given, or the
    candidates for one replica's share of the batch) that share the batch out equally."""
    shapes = []
    for r in [replicas] if replicas else [r for r in range(1, num_devices + 1) if num_devices % r == 0]:
        k = num_devices // r
        if k > max_stages or batch % r:
            continue
        counts = [microbatches] if microbatches else candidate_counts(batch // r, k)
        shapes += [(r, k, m) for m in counts if batch % (r * m) == 0]
    return shapes


def choose_layout(planner_for: Callable[[int, int], StagePlanner], devices: Sequence[int], batch: int,
                  shapes: Sequence[tuple[int, int, int]], alphas: Mapping[int, float] | None = None) -> LayoutChoice:
    """The layout with the shortest predicted step among ``shapes`` (``layout_shapes``).

    ``planner_for(r, m)``: the run's planner for r replicas, its profiles measured at the micro-batch
    of batch / (r x m), its step m micro-batches. ``alphas``: each device's slowdown (default 1.0).
    Ties go to fewer replicas (less memory for the same speed, and live re-partitions stay possible).
    """
    priced = []
    for r, k, m in shapes:
        priced.append(_price(planner_for, tuple(devices), batch, r, k, m, alphas or {}))
    possible = [c for c in priced if math.isfinite(c.step_time_s)]
    if not possible:
        raise LayoutChoiceError("no layout can run on devices " + str(list(devices)) + ": " + "; ".join(
            f"{c.replicas}x{c.stages} M={c.microbatches}: {c.reason}" for c in priced) if priced else
            f"no layout of {len(devices)} devices shares a batch of {batch} out equally")
    best = min(possible, key=lambda c: (round(c.step_time_s, 12), c.replicas, c.microbatches))
    return LayoutChoice(best, tuple(priced))


def _price(planner_for: Callable[[int, int], StagePlanner], devices: tuple[int, ...], batch: int, r: int, k: int,
           m: int, alphas: Mapping[int, float]) -> LayoutCandidate:
    try:
        planner = planner_for(r, m)
        # Every replica gets the same cuts, planned for the slowest device of each stage across replicas.
        stage_alphas = [max(float(alphas.get(devices[q * k + s], 1.0)) for q in range(r)) for s in range(k)]
        plan = planner.full_plan(devices[:k], stage_alphas)
        placement = Placement(devices, plan.teacher_counts, plan.student_counts, r, equal_shares(batch, r, m)
                              if r > 1 else ())
        by_device = {d: float(alphas.get(d, 1.0)) for d in devices}
        cost = planner.layout_cost(placement, by_device)
        if r > 1 and len(set(cost.replica_step_s)) > 1:  # replicas of unequal speed: shares by speed
            shared = placement.shared_by_speed(cost.replica_step_s, batch, m)
            shared_cost = planner.layout_cost(shared, by_device)
            if shared_cost.step_time_s < cost.step_time_s:
                placement, cost = shared, shared_cost
    except (PlanError, CostModelError, PartitionError) as exc:  # e.g. the models do not fit one device
        return LayoutCandidate(r, k, m, math.inf, reason=str(exc))
    return LayoutCandidate(r, k, m, cost.step_time_s, cost.allreduce_s, placement)
