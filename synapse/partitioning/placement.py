"""The one answer to "which blocks of which model on which device".

A ``Placement`` is the same value from the first plan to the last re-plan: the partitioner
returns one, the supervisor launches one, the controller prices and decides between them, a
live re-partition moves the blocks from one to another. Stage r runs on ``devices[r]`` with
teacher blocks [a_r, a_{r+1}) and student blocks [b_r, b_{r+1}), where a and b are the running
sums of ``teacher_counts`` and ``student_counts`` (TSPipe's model_split: the two models are cut
independently). Pure: plain integers, no torch.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from synapse.partitioning.partitioner import PlanError
from synapse.partitioning.partitioner import even_partition as planner_even


class PartitionError(ValueError):
    """A placement that cannot be run; the message gives the numbers and a fix."""


@dataclass(frozen=True)
class Placement:
    devices: tuple[int, ...]
    teacher_counts: tuple[int, ...]  # blocks per stage
    student_counts: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("devices", "teacher_counts", "student_counts"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        if len(self.teacher_counts) != len(self.student_counts):
            raise PartitionError(f"teacher partition has {len(self.teacher_counts)} stages but student has "
                                 f"{len(self.student_counts)}; give one count per device for both")
        for name, counts in (("teacher", self.teacher_counts), ("student", self.student_counts)):
            if not counts or min(counts) < 1:
                raise PartitionError(f"partition.{name}={list(counts)}: every stage needs at least one block; "
                                     f"make every count >= 1 (or use fewer devices)")
        if len(self.devices) != len(self.teacher_counts):
            raise PartitionError(f"the partition has {len(self.teacher_counts)} stages for {len(self.devices)} "
                                 f"devices {list(self.devices)}; give one block count per device")

    @property
    def num_stages(self) -> int:
        return len(self.teacher_counts)

    def teacher_range(self, stage: int) -> range:
        return _range(self.teacher_counts, stage)

    def student_range(self, stage: int) -> range:
        return _range(self.student_counts, stage)

    def same_split(self, other: Placement) -> bool:
        """Whether both cut the models the same way (devices aside)."""
        return (self.teacher_counts, self.student_counts) == (other.teacher_counts, other.student_counts)

    def on(self, devices: Sequence[int]) -> Placement:
        """The same split on other devices (one per stage)."""
        return Placement(tuple(devices), self.teacher_counts, self.student_counts)

    def check_block_counts(self, teacher_blocks: int, student_blocks: int) -> None:
        for name, counts, total in (("teacher", self.teacher_counts, teacher_blocks),
                                    ("student", self.student_counts, student_blocks)):
            if sum(counts) != total:
                raise PartitionError(f"partition.{name}={list(counts)} covers {sum(counts)} blocks but the {name} "
                                     f"model has {total}; make the counts sum to {total}")

    def to_dict(self) -> dict[str, list[int]]:
        return {"devices": list(self.devices), "teacher": list(self.teacher_counts),
                "student": list(self.student_counts)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        """Reads ``to_dict``'s form (and the older ``teacher_counts``/``student_counts`` keys)."""
        try:
            teacher = data["teacher"] if "teacher" in data else data["teacher_counts"]
            student = data["student"] if "student" in data else data["student_counts"]
            devices = data.get("devices", range(len(teacher)))
        except KeyError as exc:
            raise PartitionError(f"a placement record lacks {exc}; it needs devices, teacher and student "
                                 f"block counts, got {dict(data)!r}") from None
        return cls(tuple(devices), tuple(teacher), tuple(student))


def _range(counts: tuple[int, ...], stage: int) -> range:
    bounds = [0, *accumulate(counts)]
    return range(bounds[stage], bounds[stage + 1])


def even_counts(num_blocks: int, num_stages: int) -> tuple[int, ...]:
    """Equal block counts per stage; the first ``num_blocks % num_stages`` stages get one more."""
    try:
        return planner_even(num_blocks, num_stages)
    except PlanError as exc:
        raise PartitionError(str(exc)) from None
