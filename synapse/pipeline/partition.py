"""The placement a config asks for (even or manual cuts), checked against the models' block counts
before any worker starts. The placement type itself is ``synapse.planner.placement.Placement``.
"""
from __future__ import annotations

from typing import Sequence

from synapse.models import count_blocks
from synapse.planner.placement import PartitionError, Placement, even_counts


def even_placement(teacher_blocks: int, student_blocks: int, devices: Sequence[int]) -> Placement:
    return Placement(tuple(devices), even_counts(teacher_blocks, len(devices)), even_counts(student_blocks, len(devices)))


def placement_for_config(cfg, devices: Sequence[int], info) -> Placement:
    """The placement the config asks for (even or manual) on ``devices``, checked against the block counts."""
    num_stages = len(devices)
    teacher_blocks = count_blocks(cfg.teacher.name, info.num_classes, info.in_chans, info.image_size)
    student_blocks = count_blocks(cfg.student.name, info.num_classes, info.in_chans, info.image_size)
    if cfg.partition.mode == "manual":
        if len(cfg.partition.teacher) != num_stages or len(cfg.partition.student) != num_stages:
            raise PartitionError(f"the partition has {len(cfg.partition.teacher)} stages for {num_stages} devices; "
                                 f"give one block count per device")
        partition = Placement(tuple(devices), tuple(cfg.partition.teacher), tuple(cfg.partition.student))
    elif cfg.partition.mode == "even":
        for name, blocks in (("teacher", teacher_blocks), ("student", student_blocks)):
            if num_stages > blocks:
                raise PartitionError(f"{num_stages} stages but the {name} {cfg[name].name} has only {blocks} blocks; "
                                     f"use at most {blocks} devices or a deeper model")
        partition = even_placement(teacher_blocks, student_blocks, devices)
    else:
        raise PartitionError(f"partition.mode={cfg.partition.mode!r} is planned by synapse.launch.planning; "
                             f"use even, manual or auto")
    partition.check_block_counts(teacher_blocks, student_blocks)
    return partition
