"""Replicas of the pipeline: a launch's R x K ranks as a 2-D ``DeviceMesh`` (dp x pp).

Global rank ``r * K + s`` runs stage s of replica r. The pp dimension is one replica's pipeline
(point-to-point, the schedule); the dp dimension holds the R copies of one stage, whose student
gradients DDP averages (``torch.nn.parallel.DistributedDataParallel`` on the stage module, which
``torch.distributed.pipelining`` drives itself: no gradient sync until a step's last backward).

Each replica trains on its own share of every step's global batch (``Placement.share_range``).
DDP averages over replicas with equal weight; when shares differ (a replica dropped and its images
shared out unevenly), each replica's loss is scaled by share x R / batch so that the average is
still the mean over the global batch. After every step the replicas merge the student's BatchNorm
running statistics into those one device would hold after running all the step's micro-batches
replica after replica (``merge_statistics``): every replica then holds the same model (one
checkpoint, one evaluation, any layout resumes it), for one small all-reduce per step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from synapse.partitioning import Placement


@dataclass
class ReplicaMesh:
    """Where this rank sits in the run's R x K mesh, and the groups of its two dimensions."""

    mesh: DeviceMesh
    replica: int
    share: range  # which images of each step's global batch this replica trains on
    batch: int  # the global batch (data.batch_size)
    _before: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # buffers at the step's start

    @property
    def size(self) -> int:
        """R: the replicas of the run."""
        return self.mesh.size(0)

    @property
    def loss_weight(self) -> float:
        """share x R / batch: what DDP's equal-weight average needs to make the global batch's mean
        (1.0 with equal shares)."""
        return len(self.share) * self.size / self.batch

    @classmethod
    def build(cls, placement: Placement, rank: int, device_type: str, batch: int, microbatches: int) -> ReplicaMesh:
        """Every rank of the launch calls this (the groups are made collectively)."""
        mesh = init_device_mesh(device_type, (placement.replicas, placement.num_stages), mesh_dim_names=("dp", "pp"))
        replica = placement.replica_of(rank)
        share = placement.share_range(replica, batch, microbatches)
        return cls(mesh, replica, share, batch)

    @property
    def pipeline_group(self) -> dist.ProcessGroup:
        return self.mesh.get_group("pp")

    @property
    def replica_group(self) -> dist.ProcessGroup:
        return self.mesh.get_group("dp")

    def wrap(self, stage: torch.nn.Module, device: torch.device,
             on_bucket_ready: Callable[[], None] | None = None) -> DistributedDataParallel:
        """The stage as DDP over its replicas. Every replica builds the same weights (from the seed or
        the same checkpoint), so no initial broadcast; buffers are merged after each step instead of
        broadcast at every micro-batch's forward (``merge_statistics``). ``find_unused_parameters``
        keeps DDP from re-bucketing its gradients after the first step: that bookkeeping counts the
        gradients of every backward it sees, and a pipeline runs several per step (torch 2.14 fails
        an internal assert at M = 2: "rebuilt parameter indices size is not same as original model
        parameters size"). Its cost is one walk of the stage's graph per step. ``on_bucket_ready``: told
        as each gradient bucket is complete, before DDP's own all-reduce of it starts (the stage's
        clock: time spent waiting for the other replicas is then not this rank's compute)."""
        ddp = DistributedDataParallel(stage, device_ids=[device] if device.type == "cuda" else None,
                                      process_group=self.replica_group, broadcast_buffers=False, init_sync=False,
                                      find_unused_parameters=True)
        if on_bucket_ready is not None:
            ddp.register_comm_hook(self.replica_group, _told(on_bucket_ready))
        return ddp

    def remember_statistics(self, student: torch.nn.Module) -> None:
        """The student's BatchNorm running statistics before a step (``merge_statistics`` needs them)."""
        self._before = {name: b.detach().clone() for name, b in student.named_buffers()}

    def merge_statistics(self, student: torch.nn.Module, microbatches: int) -> None:
        """Every replica's running statistics -> those of one device that ran all the step's micro-batches,
        replica after replica (the grouping of the single-device reference).

        A BatchNorm running mean or variance is an exponential average: after n micro-batches,
        m = a^n m0 + (what those n added), with a = 1 - momentum. Replica r's addition is m_r - a^n m0;
        run in replica order, replica r's comes a^(n (R - 1 - r)) before the end. So
        m = a^(n R) m0 + sum_r a^(n (R - 1 - r)) (m_r - a^n m0): one all-reduce of the weighted
        additions, exact up to rounding. ``num_batches_tracked`` adds up the same way; other
        floating-point buffers are averaged.
        """
        replicas = self.size
        parts: list[torch.Tensor] = []  # what this replica adds to the all-reduce, buffer by buffer
        offsets: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # buffer, what is added back after it
        for prefix, module in student.named_modules():
            for name, buffer in module.named_buffers(recurse=False):
                before = self._before[f"{prefix}.{name}" if prefix else name].double()
                momentum = getattr(module, "momentum", None)
                if name == "num_batches_tracked":
                    parts.append(buffer.detach().double() - before)
                    offsets.append((buffer, before))
                elif isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and momentum is not None:
                    keep = (1.0 - momentum) ** microbatches
                    parts.append((buffer.detach().double() - keep * before) * keep ** (replicas - 1 - self.replica))
                    offsets.append((buffer, keep ** replicas * before))
                elif buffer.is_floating_point():
                    parts.append(buffer.detach().double() / replicas)
                    offsets.append((buffer, None))
        if not parts:
            return
        flat = torch.cat([t.reshape(-1) for t in parts])
        dist.all_reduce(flat, group=self.replica_group)
        offset = 0
        with torch.no_grad():
            for (buffer, base), part in zip(offsets, parts):
                total = flat[offset:offset + part.numel()].view_as(part)
                buffer.copy_((total if base is None else total + base).to(buffer.dtype))
                offset += part.numel()

    def global_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A replica's (weighted) loss -> the mean over the global batch, on every replica's last stage:
        the weighted losses' mean, as DDP averages their gradients."""
        total = loss.detach().float()
        dist.all_reduce(total, group=self.replica_group)
        return total / self.size


def _told(on_bucket_ready: Callable[[], None]):
    """DDP's default all-reduce hook, telling ``on_bucket_ready`` first."""
    def hook(group, bucket):  # no annotations: DDP checks them as objects, and this module's are strings
        on_bucket_ready()
        return allreduce_hook(group, bucket)
    return hook
