"""Replicas of the pipeline: a launch's ranks as R pipelines, replica after replica, each replica cut its
own way or all alike (``Placement``: replica r's ranks follow replica r - 1's).

Each replica's pipeline runs on a process group of its ranks (point-to-point, the schedule). The student's
gradients are summed, after the step's last backward, over the ranks that own the same blocks: one
process group per set of owners (``Placement.student_groups``: with every replica cut alike, a stage's
ranks across replicas; with replica 1 of 2 x 2 shrunk to one stage, blocks of stage 0 between ranks
{0, 2} and those of stage 1 between {1, 2}). Each rank all-reduces its blocks' gradients flattened per
group, in block order, which is the same on every rank, so no two ranks wait on two groups in opposite
orders. Each replica's gradient is weighted by its share of the global batch (share / batch) before the
sum, so the step sees the global batch's mean gradient whatever the shares.

Why not DDP on the stage module: DDP averages over a group whose members all hold the same parameters;
once a replica is cut differently no such group of whole stage modules exists. One run path serves
both (docs/layouts.md measures it against DDP on R = 2 x K = 2).

After every step the replicas merge the student's BatchNorm running statistics, through the same
groups, into those one device would hold after running all the step's micro-batches replica after
replica (``merge_statistics``): every replica then holds the same model (one checkpoint, one
evaluation, any layout resumes it). The loss and the evaluation counts add up over the replicas' last
ranks.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from synapse.partitioning import Placement


@dataclass(frozen=True)
class GradientGroup:
    """Student blocks this rank shares with the same ranks of the other replicas, and their group."""

    group: dist.ProcessGroup
    blocks: range  # local indices into the stage's student blocks


@dataclass
class ReplicaMesh:
    """Where this rank sits among the run's replicas, and the groups it reduces and talks over."""

    replica: int
    size: int  # R: the replicas of the run
    share: range  # which images of each step's global batch this replica trains on
    batch: int  # the global batch (data.batch_size)
    evaluation_batch: int  # images per validation batch (Placement.evaluation_batch): one size per launch
    pipeline_group: dist.ProcessGroup  # this replica's pipeline
    last_ranks_group: dist.ProcessGroup | None  # every replica's last rank (None: this rank is not a last one)
    gradient_groups: tuple[GradientGroup, ...]  # this rank's student blocks by owners, in block order
    # every group made so far, by its ranks (a live re-cut reuses them): the same on every rank of the launch
    groups: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    _before: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # buffers at the step's start

    @property
    def weight(self) -> float:
        """share / batch: this replica's part of the global batch's mean."""
        return len(self.share) / self.batch

    @classmethod
    def build(cls, placement: Placement, rank: int, batch: int, microbatches: int,
              groups: dict[tuple[Any, ...], Any] | None = None) -> ReplicaMesh:
        """Every rank of the launch calls this, and makes every group in the same order (``new_group`` is
        collective over the whole launch, member or not). ``groups``: those made before (a live re-cut), by
        use and ranks: reused, and the new ones added to it."""
        groups = {} if groups is None else groups

        def group_of(purpose: str, ranks: Sequence[int]) -> Any:
            key = (purpose, *ranks)  # one group per use, as before any reuse: none serves two
            if key not in groups:
                groups[key] = dist.new_group(list(ranks))
            return groups[key]

        replica = placement.replica_of(rank)
        pipelines = [group_of("pipeline", placement.replica_ranks(r)) for r in range(placement.replicas)]
        last_ranks = [placement.replica_ranks(r)[-1] for r in range(placement.replicas)]
        last_group = group_of("last ranks", last_ranks)
        first_block = placement.student_range(rank).start
        mine = []
        for owners, blocks in placement.student_groups():
            group = group_of("gradients", owners)
            if rank in owners:
                mine.append(GradientGroup(group, range(blocks.start - first_block, blocks.stop - first_block)))
        return cls(replica, placement.replicas, placement.share_range(replica, batch, microbatches), batch,
                   placement.evaluation_batch(batch, microbatches),
                   pipelines[replica], last_group if rank in last_ranks else None, tuple(mine), groups)

    def reshared(self, placement: Placement, microbatches: int) -> ReplicaMesh:
        """This rank's place under ``placement``'s shares (a live REBALANCE): the same replica and groups, another
        cut of each step's batch and so another gradient weight. Raises ``PartitionError`` for shares that do
        not cover the batch in whole micro-batches."""
        return dataclasses.replace(self, share=placement.share_range(self.replica, self.batch, microbatches))

    def reduce_gradients(self, student: torch.nn.ModuleList) -> None:
        """The global batch's gradient on every owner of a block: each replica's gradient (the mean over
        its share) times share / batch, summed over the block's owners, group after group in block order."""
        for part in self.gradient_groups:
            params = [p for i in part.blocks for p in student[i].parameters() if p.requires_grad]
            if not params:
                continue  # parameter-free blocks (an activation, a pooling): every owner sees the same, and skips
            flat = weighted_gradients(params, self.weight)
            dist.all_reduce(flat, group=part.group)
            set_gradients(params, flat)

    def remember_statistics(self, student: torch.nn.Module) -> None:
        """The student's BatchNorm running statistics before a step (``merge_statistics`` needs them)."""
        self._before = {name: b.detach().clone() for name, b in student.named_buffers()}

    def merge_statistics(self, student: torch.nn.ModuleList, microbatches: int) -> None:
        """Every replica's running statistics -> those of one device that ran all the step's micro-batches,
        replica after replica (the grouping of the single-device reference); one all-reduce per group.

        A BatchNorm running mean or variance is an exponential average: after n micro-batches,
        m = a^n m0 + (what those n added), with a = 1 - momentum. Replica r's addition is m_r - a^n m0;
        run in replica order, replica r's comes a^(n (R - 1 - r)) before the end. So
        m = a^(n R) m0 + sum_r a^(n (R - 1 - r)) (m_r - a^n m0): one all-reduce of the weighted
        additions, exact up to rounding. ``num_batches_tracked`` adds up the same way; other
        floating-point buffers are averaged. Every group holds one rank per replica, in replica order.
        """
        for part in self.gradient_groups:
            self._merge(student, part, microbatches)

    def _merge(self, student: torch.nn.ModuleList, part: GradientGroup, microbatches: int) -> None:
        parts, offsets = statistics_additions(student, part.blocks, self._before, microbatches, self.replica,
                                              self.size)
        if not parts:
            return
        flat = torch.cat([t.reshape(-1) for t in parts])
        dist.all_reduce(flat, group=part.group)
        apply_statistics(flat, parts, offsets)

    def reduce_step(self, student: torch.nn.ModuleList, loss: torch.Tensor | None,
                    microbatches: int) -> torch.Tensor | None:
        """After the step's last backward: the global batch's gradient, and on the last ranks its loss."""
        self.reduce_gradients(student)
        return None if loss is None else self.global_loss(loss)

    def after_update(self, student: torch.nn.ModuleList, microbatches: int) -> None:
        """After the optimizer step: the replicas' BatchNorm statistics merged."""
        self.merge_statistics(student, microbatches)

    @property
    def evaluation_shard(self) -> tuple[int, int]:
        """Each replica evaluates every R-th validation batch of ``evaluation_batch`` images (``add_up`` adds
        the counts)."""
        return self.replica, self.size

    def global_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A replica's loss (the mean over its share) -> the mean over the global batch, on every
        replica's last rank."""
        total = loss.detach().float() * self.weight
        dist.all_reduce(total, group=self.last_ranks_group)
        return total

    def add_up(self, counts: Sequence[float], device: torch.device) -> list[float]:
        """Counts of every replica's last rank, added up (evaluation)."""
        total = torch.tensor(list(counts), dtype=torch.float64, device=device)
        dist.all_reduce(total, group=self.last_ranks_group)
        return total.tolist()


class ReplicaReduction(Protocol):
    """What the runtime asks of a rank's place among the replicas: ``ReplicaMesh`` (the run's groups, one
    launch) or ``synapse.pipeline.quorum.QuorumReplicas`` (torchft, a launch per replica)."""

    @property
    def replica(self) -> int:
        """This rank's replica within its launch."""

    @property
    def share(self) -> range | None:
        """The images of each step's batch loaded here (None: the whole batch, cut per step)."""

    @property
    def pipeline_group(self) -> Any:
        """The replica's pipeline (None: the launch's default group)."""

    @property
    def evaluation_shard(self) -> tuple[int, int]: ...

    @property
    def evaluation_batch(self) -> int: ...

    def remember_statistics(self, student: torch.nn.Module) -> None: ...

    def reduce_step(self, student: torch.nn.ModuleList, loss: torch.Tensor | None,
                    microbatches: int) -> torch.Tensor | None: ...

    def after_update(self, student: torch.nn.ModuleList, microbatches: int) -> None: ...

    def add_up(self, counts: Sequence[float], device: torch.device) -> list[float]: ...


def weighted_gradients(params: Sequence[torch.nn.Parameter], weight: float) -> torch.Tensor:
    """The gradients of ``params`` flattened into one tensor, times ``weight`` (a replica's share of the
    batch), to be summed over the replicas; a parameter this step did not reach gets a gradient of 0 (on
    every replica alike)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return torch.cat([p.grad.reshape(-1) for p in params]) * weight


def set_gradients(params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """The summed ``flat`` (``weighted_gradients``' order) back into each parameter's gradient."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def statistics_additions(student: torch.nn.ModuleList, blocks: range, before: dict[str, torch.Tensor],
                         microbatches: int, replica: int, replicas: int
                         ) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor | None]]]:
    """What replica ``replica`` of ``replicas`` adds to the sum that merges the running statistics of
    ``blocks`` (``ReplicaMesh.merge_statistics`` says how), buffer by buffer, and what is added back to
    each buffer after the sum (None: nothing)."""
    parts: list[torch.Tensor] = []
    offsets: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for index in blocks:
        for prefix, module in student[index].named_modules(prefix=str(index)):
            for name, buffer in module.named_buffers(recurse=False):
                previous = before[f"{prefix}.{name}"].double()
                momentum = getattr(module, "momentum", None)
                if name == "num_batches_tracked":
                    parts.append(buffer.detach().double() - previous)
                    offsets.append((buffer, previous))
                elif isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and momentum is not None:
                    keep = (1.0 - momentum) ** microbatches
                    parts.append((buffer.detach().double() - keep * previous) * keep ** (replicas - 1 - replica))
                    offsets.append((buffer, keep ** replicas * previous))
                elif buffer.is_floating_point():
                    parts.append(buffer.detach().double() / replicas)
                    offsets.append((buffer, None))
    return parts, offsets


def apply_statistics(flat: torch.Tensor, parts: list[torch.Tensor],
                     offsets: list[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    """The summed additions (``flat``, in the order of ``parts``) into the buffers."""
    offset = 0
    with torch.no_grad():
        for (buffer, base), value in zip(offsets, parts):
            total = flat[offset:offset + value.numel()].view_as(value)
            buffer.copy_((total if base is None else total + base).to(buffer.dtype))
            offset += value.numel()
