"""R pipelines of one cut priced at once: the planner's ``layout_cost`` without a cost model per replica.

The controller prices every option of an R x K layout at every step of a slowdown, at factors
(alphas, betas) that move every step, and a REBALANCE tries R - 1 share moves a round: 64 replicas
made that thousands of cost models a step. What a stage costs splits into what the devices' current
factors change (alpha scales its compute, beta its link bytes) and what they do not (its blocks'
profile seconds, the bytes at its cut, its link's bandwidth and latency, its contention and host
overhead). ``PipelineTerms`` keeps the second part of all R x K ranks in arrays, built once per
devices and cut; ``price`` applies factors to all ranks in a few numpy operations.

Exactly the cost model's numbers: every stage time goes through the cost model's own expressions
(``link_time_s``, ``fixed_time_s``, ``stage_time_of``, ``pipeline_step_time_s``) with the same
operands in the same order, and numpy's elementwise float64 operations round as Python's do, so
each rank's time is bit for bit ``CostModel.evaluate``'s (``tests/unit/test_pipelines.py``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from synapse.partitioning.cost_model import (
    CostModel,
    DeviceSpec,
    StepSpec,
    fixed_time_s,
    link_time_s,
    overhead_time_s,
    pipeline_step_time_s,
    stage_time_of,
)
from synapse.partitioning.profile import ModelProfile


@dataclass(frozen=True)
class PipelinePrices:
    """Per micro-batch, every rank's compute and link time ((R, K) arrays), and each pipeline's step."""

    compute_s: np.ndarray
    comm_s: np.ndarray
    step_s: np.ndarray  # (R,)


@dataclass(frozen=True, eq=False)
class PipelineTerms:
    """What R pipelines cut alike (teacher and student counts) on their devices cost at any factors.

    Arrays are (R, K) by replica and stage, or (K,) where every replica's stage is the same."""

    step: StepSpec
    work_s: np.ndarray  # (K,) profile seconds of the stage's blocks: teacher forward + student forward and backward
    cut_bytes: np.ndarray  # (K,) bytes each stage sends per micro-batch
    loss_s: np.ndarray  # (K,) the KD loss on the last stage, 0 elsewhere
    sends: np.ndarray  # (K,) bool: every stage but the last has a link to price
    contention: np.ndarray  # (R, K)
    overhead_s: np.ndarray  # (R, K) host time per micro-batch outside the blocks
    bandwidth_bytes_per_s: np.ndarray  # (R, K) of the link to the next stage
    link_latency_s: np.ndarray  # (R, K) per message

    @classmethod
    def of(cls, teacher: ModelProfile, student: ModelProfile, step: StepSpec,
           specs: Sequence[Sequence[DeviceSpec]], teacher_counts: Sequence[int],
           student_counts: Sequence[int]) -> PipelineTerms:
        """From each replica's DeviceSpecs at nominal factors (validated there); the counts are checked
        as ``CostModel.evaluate`` checks them."""
        model = CostModel(teacher, student, specs[0], step)  # blocks and cuts: the same on every replica
        t_cuts, s_cuts = model.stage_cuts(teacher_counts, student_counts)
        k = model.num_stages
        stages = range(k)
        work = [model.teacher_work_s(t_cuts[r], t_cuts[r + 1]) + model.student_work_s(s_cuts[r], s_cuts[r + 1])
                for r in stages]
        def by_rank(field: str) -> np.ndarray:
            return np.array([[getattr(device, field) for device in replica] for replica in specs]).reshape(-1, k)

        contention = by_rank("contention")
        return cls(step=step, work_s=np.array(work),
                   cut_bytes=np.array([model.cut_bytes(t_cuts[r + 1], s_cuts[r + 1]) for r in stages]),
                   loss_s=np.array([model.stage_loss_s(r) for r in stages]),
                   sends=np.arange(k) < k - 1, contention=contention,
                   overhead_s=overhead_time_s(contention, step.per_microbatch_overhead_s),
                   bandwidth_bytes_per_s=by_rank("link_bandwidth_bytes_per_s"),
                   link_latency_s=by_rank("link_latency_s"))

    def link_s(self, betas: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Every rank's per-micro-batch link time at ``betas`` ((R, K), or the ``rows`` selected);
        0 on the last stage, which sends nothing (the loss is local)."""
        sent = link_time_s(betas, self.cut_bytes, self.bandwidth_bytes_per_s[rows], self.link_latency_s[rows])
        comm: np.ndarray = np.where(self.sends, sent, 0.0)
        return comm

    def price(self, alphas: np.ndarray, betas: np.ndarray, rows: np.ndarray | slice = slice(None)) -> PipelinePrices:
        """Every rank's compute and link time and each pipeline's step at ``alphas`` and ``betas`` (the
        ``rows`` of the replicas selected), as ``CostModel.evaluate`` gives them one pipeline at a time."""
        compute_scale = alphas * self.contention[rows]
        overhead = self.overhead_s[rows]
        comm = self.link_s(betas, rows)
        times = stage_time_of(compute_scale, self.work_s, fixed_time_s(compute_scale, self.loss_s, overhead), comm)
        steps = [pipeline_step_time_s(self.step, row) for row in times.tolist()]
        return PipelinePrices(compute_s=times - comm - overhead, comm_s=comm, step_s=np.array(steps))
