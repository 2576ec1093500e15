"""The one answer to "which blocks of which model on which device".

A ``Placement`` is the same value from the first plan to the last re-plan: the partitioner
returns one, the supervisor launches one, the controller prices and decides between them, a
live re-partition moves the blocks from one to another. Stage s runs teacher blocks
[a_s, a_{s+1}) and student blocks [b_s, b_{s+1}), where a and b are the running sums of
``teacher_counts`` and ``student_counts`` (TSPipe's model_split: the two models are cut
independently).

A placement is a layout of R replicas x K stages (a 2-D device mesh, dp x pp): replica r's stage s
runs on ``devices[r * K + s]`` as global rank ``r * K + s``. Every replica cuts the models the same
way and trains on its own share of each step's global batch (``shares``: images per replica; empty
means equal shares); student gradients are averaged across replicas. R = 1 is one pipeline, K = 1
pure data parallelism. Pure: plain integers, no torch.
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
    devices: tuple[int, ...]  # one per rank, replica-major
    teacher_counts: tuple[int, ...]  # blocks per stage
    student_counts: tuple[int, ...]
    replicas: int = 1
    shares: tuple[int, ...] = ()  # images of each step's global batch per replica; () = equal shares

    def __post_init__(self) -> None:
        for name in ("devices", "teacher_counts", "student_counts", "shares"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        object.__setattr__(self, "replicas", int(self.replicas))
        if len(self.teacher_counts) != len(self.student_counts):
            raise PartitionError(f"teacher partition has {len(self.teacher_counts)} stages but student has "
                                 f"{len(self.student_counts)}; give one count per device for both")
        for name, counts in (("teacher", self.teacher_counts), ("student", self.student_counts)):
            if not counts or min(counts) < 1:
                raise PartitionError(f"partition.{name}={list(counts)}: every stage needs at least one block; "
                                     f"make every count >= 1 (or use fewer devices)")
        if self.replicas < 1:
            raise PartitionError(f"trainer.replicas={self.replicas}: a run needs at least one replica")
        if len(self.devices) != self.replicas * len(self.teacher_counts):
            if self.replicas == 1:
                raise PartitionError(f"the partition has {len(self.teacher_counts)} stages for {len(self.devices)} "
                                     f"devices {list(self.devices)}; give one block count per device")
            raise PartitionError(f"{self.replicas} replicas x {len(self.teacher_counts)} stages need "
                                 f"{self.replicas * len(self.teacher_counts)} devices, got {len(self.devices)} "
                                 f"{list(self.devices)}; give trainer.devices R x K entries or change "
                                 f"trainer.replicas / the partition's stage count")
        if self.shares and (len(self.shares) != self.replicas or min(self.shares) < 1):
            raise PartitionError(f"shares {list(self.shares)}: give one positive image count per replica "
                                 f"({self.replicas})")

    @property
    def num_stages(self) -> int:
        return len(self.teacher_counts)

    @property
    def world_size(self) -> int:
        """Ranks in a launch of this placement: R x K."""
        return len(self.devices)

    def stage_of(self, rank: int) -> int:
        return rank % self.num_stages

    def replica_of(self, rank: int) -> int:
        return rank // self.num_stages

    def replica_devices(self, replica: int) -> tuple[int, ...]:
        """The K devices of one replica's pipeline, stage by stage."""
        k = self.num_stages
        return self.devices[replica * k:(replica + 1) * k]

    def pipeline(self, replica: int = 0) -> Placement:
        """One replica's pipeline as a placement of its own (R = 1)."""
        return Placement(self.replica_devices(replica), self.teacher_counts, self.student_counts)

    def share_sizes(self, batch: int, microbatches: int) -> tuple[int, ...]:
        """Images of each replica per step; raises when ``batch`` cannot be shared out so that every
        replica's share splits into ``microbatches`` equal micro-batches."""
        sizes = self.shares or equal_shares(batch, self.replicas, microbatches)
        if sum(sizes) != batch:
            raise PartitionError(f"replica shares {list(sizes)} sum to {sum(sizes)} images, the global batch "
                                 f"(data.batch_size) is {batch}; the shares must cover it exactly")
        uneven = [n for n in sizes if n % microbatches]
        if uneven:
            raise PartitionError(f"replica shares {list(sizes)}: {uneven[0]} images do not split into "
                                 f"{microbatches} equal micro-batches; give every share a multiple of "
                                 f"{microbatches} images")
        return sizes

    def share_range(self, replica: int, batch: int, microbatches: int) -> range:
        """Which images of each step's global batch ``replica`` trains on."""
        bounds = [0, *accumulate(self.share_sizes(batch, microbatches))]
        return range(bounds[replica], bounds[replica + 1])

    def shared_by_speed(self, replica_step_s: Sequence[float], batch: int, microbatches: int) -> Placement:
        """The same layout with shares in proportion to each replica's speed (its share over its step
        time, ``replica_step_s``), so that the replicas finish a step together."""
        speeds = [share / step for share, step in zip(self.share_sizes(batch, microbatches), replica_step_s)]
        return Placement(self.devices, self.teacher_counts, self.student_counts, self.replicas,
                         shares_for_speeds(speeds, batch, microbatches))

    def stage_peers(self) -> list[list[int]] | None:
        """Per rank, the ranks that run its stage (one per replica, itself included); None for one pipeline."""
        if self.replicas == 1:
            return None
        k = self.num_stages
        return [[r * k + self.stage_of(rank) for r in range(self.replicas)] for rank in range(self.world_size)]

    def without_replica(self, replica: int, batch: int, microbatches: int) -> Placement:
        """The layout after dropping one replica: the others share its images (global batch unchanged)."""
        if self.replicas == 1:
            raise PartitionError("a single pipeline has no replica to drop")
        keep = [r for r in range(self.replicas) if r != replica]
        devices = tuple(d for r in keep for d in self.replica_devices(r))
        left = self.replicas - 1
        return Placement(devices, self.teacher_counts, self.student_counts, left,
                         equal_shares(batch, left, microbatches) if left > 1 else ())

    def teacher_range(self, stage: int) -> range:
        return _range(self.teacher_counts, stage)

    def student_range(self, stage: int) -> range:
        return _range(self.student_counts, stage)

    def same_split(self, other: Placement) -> bool:
        """Whether both cut the models the same way (devices aside)."""
        return (self.teacher_counts, self.student_counts) == (other.teacher_counts, other.student_counts)

    def on(self, devices: Sequence[int]) -> Placement:
        """The same layout and split on other devices (one per rank)."""
        return Placement(tuple(devices), self.teacher_counts, self.student_counts, self.replicas, self.shares)

    def check_block_counts(self, teacher_blocks: int, student_blocks: int) -> None:
        for name, counts, total in (("teacher", self.teacher_counts, teacher_blocks),
                                    ("student", self.student_counts, student_blocks)):
            if sum(counts) != total:
                raise PartitionError(f"partition.{name}={list(counts)} covers {sum(counts)} blocks but the {name} "
                                     f"model has {total}; make the counts sum to {total}")

    def to_dict(self) -> dict[str, Any]:
        """Records keep today's three keys for one pipeline; a layout adds its replicas (and shares)."""
        data: dict[str, Any] = {"devices": list(self.devices), "teacher": list(self.teacher_counts),
                                "student": list(self.student_counts)}
        if self.replicas > 1:
            data["replicas"] = self.replicas
        if self.shares:
            data["shares"] = list(self.shares)
        return data

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
        return cls(tuple(devices), tuple(teacher), tuple(student), int(data.get("replicas", 1)),
                   tuple(data.get("shares", ())))


def _range(counts: tuple[int, ...], stage: int) -> range:
    bounds = [0, *accumulate(counts)]
    return range(bounds[stage], bounds[stage + 1])


def even_counts(num_blocks: int, num_stages: int) -> tuple[int, ...]:
    """Equal block counts per stage; the first ``num_blocks % num_stages`` stages get one more."""
    try:
        return planner_even(num_blocks, num_stages)
    except PlanError as exc:
        raise PartitionError(str(exc)) from None


def equal_shares(batch: int, replicas: int, microbatches: int) -> tuple[int, ...]:
    """``batch`` images over ``replicas`` as evenly as whole micro-batches allow (the first replicas get
    one micro-batch more); raises when some replica would get none."""
    if batch % microbatches:
        raise PartitionError(f"data.batch_size={batch} does not split into {microbatches} equal micro-batches; "
                             f"make the batch a multiple of pipeline.microbatches")
    units, extra = divmod(batch // microbatches, replicas)
    if units == 0:
        raise PartitionError(f"data.batch_size={batch} gives {replicas} replicas less than one micro-batch of "
                             f"{microbatches} each; use a batch of at least {replicas * microbatches} or fewer "
                             f"replicas")
    return tuple((units + (r < extra)) * microbatches for r in range(replicas))


def shares_for_speeds(speeds: Sequence[float], batch: int, microbatches: int) -> tuple[int, ...]:
    """``batch`` images over replicas in proportion to their ``speeds`` (images per second), in whole
    units of ``microbatches`` images (each replica's share splits into its micro-batches), at least one
    unit each, rounded by largest remainder: replicas of different speeds then finish a step together."""
    units = batch // microbatches
    if batch % microbatches or units < len(speeds):
        raise PartitionError(f"data.batch_size={batch} cannot give {len(speeds)} replicas a multiple of "
                             f"{microbatches} images each")
    if min(speeds) <= 0:
        raise PartitionError(f"replica speeds {list(speeds)} must be > 0")
    ideal = [units * v / sum(speeds) for v in speeds]
    counts = [max(1, int(x)) for x in ideal]
    while sum(counts) > units:  # raising a share to one unit may have overshot: take from the largest
        counts[counts.index(max(counts))] -= 1
    for r in sorted(range(len(ideal)), key=lambda r: counts[r] - ideal[r])[:units - sum(counts)]:
        counts[r] += 1
    return tuple(c * microbatches for c in counts)
