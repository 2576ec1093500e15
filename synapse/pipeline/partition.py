"""Which blocks each stage holds: teacher and student cut independently (TSPipe's model_split).

A partition is two lists of block counts, one entry per device: stage r runs teacher blocks
[a_r, a_{r+1}) and student blocks [b_r, b_{r+1}). Counts are checked against the models'
block counts before any worker starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate


class PartitionError(ValueError):
    """A partition that cannot be run; the message gives the numbers and a fix."""


@dataclass(frozen=True)
class StagePartition:
    teacher: tuple[int, ...]  # blocks per stage
    student: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.teacher) != len(self.student):
            raise PartitionError(f"teacher partition has {len(self.teacher)} stages but student has "
                                 f"{len(self.student)}; give one count per device for both")
        for name, counts in (("teacher", self.teacher), ("student", self.student)):
            if not counts or min(counts) < 1:
                raise PartitionError(f"partition.{name}={list(counts)}: every stage needs at least one block; "
                                     f"make every count >= 1 (or use fewer devices)")

    @property
    def num_stages(self) -> int:
        return len(self.teacher)

    def teacher_range(self, stage: int) -> range:
        return _range(self.teacher, stage)

    def student_range(self, stage: int) -> range:
        return _range(self.student, stage)

    def check_block_counts(self, teacher_blocks: int, student_blocks: int) -> None:
        for name, counts, total in (("teacher", self.teacher, teacher_blocks), ("student", self.student, student_blocks)):
            if sum(counts) != total:
                raise PartitionError(f"partition.{name}={list(counts)} covers {sum(counts)} blocks but the {name} "
                                     f"model has {total}; make the counts sum to {total}")

    def to_dict(self) -> dict[str, list[int]]:
        return {"teacher": list(self.teacher), "student": list(self.student)}


def _range(counts: tuple[int, ...], stage: int) -> range:
    bounds = [0, *accumulate(counts)]
    return range(bounds[stage], bounds[stage + 1])


def even_counts(num_blocks: int, num_stages: int) -> tuple[int, ...]:
    """Equal block counts per stage; the first ``num_blocks % num_stages`` stages get one more."""
    from ..planner.partitioner import PlanError, even_partition as planner_even

    try:
        return planner_even(num_blocks, num_stages)
    except PlanError as exc:
        raise PartitionError(str(exc)) from None


def even_partition(teacher_blocks: int, student_blocks: int, num_stages: int) -> StagePartition:
    return StagePartition(even_counts(teacher_blocks, num_stages), even_counts(student_blocks, num_stages))


def count_blocks(model_name: str, num_classes: int, in_chans: int, image_size: int) -> int:
    """Block count of a model, built on the meta device (no memory, no time even for ViT-L)."""
    import torch

    from ..models import build_model, num_blocks

    with torch.device("meta"):
        return num_blocks(build_model(model_name, num_classes, in_chans, image_size))


def partition_for_config(cfg, num_stages: int, info) -> StagePartition:
    """The partition the config asks for (even or manual), checked against the block counts."""
    teacher_blocks = count_blocks(cfg.teacher.name, info.num_classes, info.in_chans, info.image_size)
    student_blocks = count_blocks(cfg.student.name, info.num_classes, info.in_chans, info.image_size)
    if cfg.partition.mode == "manual":
        partition = StagePartition(tuple(cfg.partition.teacher), tuple(cfg.partition.student))
    elif cfg.partition.mode == "even":
        for name, blocks in (("teacher", teacher_blocks), ("student", student_blocks)):
            if num_stages > blocks:
                raise PartitionError(f"{num_stages} stages but the {name} {cfg[name].name} has only {blocks} blocks; "
                                     f"use at most {blocks} devices or a deeper model")
        partition = even_partition(teacher_blocks, student_blocks, num_stages)
    else:
        raise PartitionError(f"partition.mode={cfg.partition.mode!r} is planned by synapse.launch.planning; "
                             f"use even, manual or auto")
    if partition.num_stages != num_stages:
        raise PartitionError(f"the partition has {partition.num_stages} stages for {num_stages} devices; "
                             f"give one block count per device")
    partition.check_block_counts(teacher_blocks, student_blocks)
    return partition
