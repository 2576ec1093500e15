"""ReplicaMesh's gradient sum over a group of owners whose blocks hold no parameter.

Replicas cut at different boundaries can make one parameter-free block (an activation, a pooling, a
ViT's token pool) a group of its own; SHRINK's planner picks such cuts freely, since those blocks cost
almost nothing. Every owner of such a group must pass it by (they all see the same blocks), not fail on
an empty concatenation at the first step. One real gloo process group of one rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from synapse.pipeline.replicas import GradientGroup, ReplicaMesh


def test_a_group_of_parameter_free_blocks_is_passed_by_and_the_others_are_summed(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        world = dist.group.WORLD
        student = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2)])
        for p in student.parameters():
            p.grad = torch.ones_like(p)
        groups = tuple(GradientGroup(world, range(i, i + 1)) for i in range(3))  # block 1 (ReLU) alone
        mesh = ReplicaMesh(replica=0, size=2, share=range(0, 6), batch=8, evaluation_batch=4, pipeline_group=world,
                           last_ranks_group=None, gradient_groups=groups)
        mesh.reduce_gradients(student)
        for p in student.parameters():  # one owner: its gradient times its share of the batch
            assert torch.equal(p.grad, torch.full_like(p, 6 / 8))
    finally:
        dist.destroy_process_group()
