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

import functools
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

from synapse.partitioning.partitioner import PlanError
from synapse.partitioning.partitioner import even_partition as planner_even


class PartitionError(ValueError):
    """A placement that cannot be run; the message gives the numbers and a fix."""


@dataclass(frozen=True)
class Placement:
    devices: tuple[int, ...]  # one per rank, replica-major
    # Blocks per stage: one replica's K stages when every replica is cut alike; every replica's stages,
    # replica after replica, when ``replica_stages`` says how many each has (replicas cut differently).
    teacher_counts: tuple[int, ...]
    student_counts: tuple[int, ...]
    replicas: int = 1
    shares: tuple[int, ...] = ()  # images of each step's global batch per replica; () = equal shares
    replica_stages: tuple[int, ...] = ()  # K_r per replica when the replicas' cuts differ; () = all alike

    def __post_init__(self) -> None:
        for name in ("devices", "teacher_counts", "student_counts", "shares", "replica_stages"):
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
        if self.replica_stages:
            self._check_replica_stages()
        elif len(self.devices) != self.replicas * len(self.teacher_counts):
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

    def _check_replica_stages(self) -> None:
        """Cuts per replica: one stage count per replica, every stage a device and a count; the same cut
        on every replica is written the one way (``replica_stages`` empty), so equal layouts compare equal."""
        stages = self.replica_stages
        if len(stages) != self.replicas or min(stages) < 1:
            raise PartitionError(f"partition.replica_stages={list(stages)}: give one stage count (>= 1) per replica "
                                 f"({self.replicas})")
        if len(self.teacher_counts) != sum(stages) or len(self.devices) != sum(stages):
            raise PartitionError(f"replicas of {list(stages)} stages need {sum(stages)} devices and {sum(stages)} "
                                 f"block counts for each model (replica after replica), got {len(self.devices)} "
                                 f"devices and {len(self.teacher_counts)} counts")
        cuts = {self.replica_cut(r) for r in range(self.replicas)}
        if len(cuts) == 1:
            teacher, student = cuts.pop()
            object.__setattr__(self, "teacher_counts", teacher)
            object.__setattr__(self, "student_counts", student)
            object.__setattr__(self, "replica_stages", ())

    @classmethod
    def of_pipelines(cls, pipelines: Sequence[Placement], shares: Sequence[int] = ()) -> Placement:
        """Replicas, each one pipeline (its devices and cut) in order: a layout whose replicas may be cut
        differently."""
        if len(pipelines) == 1:
            return pipelines[0]
        return cls(tuple(d for p in pipelines for d in p.devices),
                   tuple(c for p in pipelines for c in p.teacher_counts),
                   tuple(c for p in pipelines for c in p.student_counts), len(pipelines), tuple(shares),
                   tuple(len(p.devices) for p in pipelines))

    @property
    def cut_alike(self) -> bool:
        """Whether every replica is cut the same way (a R x K mesh)."""
        return not self.replica_stages

    @property
    def num_stages(self) -> int:
        """K of an R x K mesh; replicas cut differently have no one K (ask ``stages_in`` or by rank)."""
        if self.replica_stages:
            raise PartitionError(f"replicas of {list(self.replica_stages)} stages have no one stage count; "
                                 f"ask stages_in(replica) or by rank")
        return len(self.teacher_counts)

    @property
    def world_size(self) -> int:
        """Ranks in a launch of this placement: the sum of every replica's stages."""
        return len(self.devices)

    def stages_in(self, replica: int) -> int:
        """K_r: the stages of ``replica``'s pipeline."""
        return self.replica_stages[replica] if self.replica_stages else len(self.teacher_counts)

    def first_rank(self, replica: int) -> int:
        """The global rank of ``replica``'s first stage."""
        if not self.replica_stages:
            return replica * len(self.teacher_counts)
        return self._first_ranks[replica]

    @functools.cached_property
    def _first_ranks(self) -> tuple[int, ...]:  # replicas cut differently: each one's first rank
        return (0, *accumulate(self.replica_stages))[:-1]

    def replica_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise PartitionError(f"rank {rank} is not one of this layout's {self.world_size} ranks")
        if not self.replica_stages:
            return rank // len(self.teacher_counts)
        return bisect_right(self._first_ranks, rank) - 1

    def stage_of(self, rank: int) -> int:
        return rank - self.first_rank(self.replica_of(rank))

    def stages_of_rank(self, rank: int) -> int:
        """K of the pipeline ``rank`` belongs to."""
        return self.stages_in(self.replica_of(rank))

    def replica_ranks(self, replica: int) -> range:
        first = self.first_rank(replica)
        return range(first, first + self.stages_in(replica))

    def pipeline_ranks(self) -> list[list[int]]:
        """The ranks of each replica's pipeline, in replica order."""
        return [list(self.replica_ranks(replica)) for replica in range(self.replicas)]

    def replica_devices(self, replica: int) -> tuple[int, ...]:
        """The devices of one replica's pipeline, stage by stage."""
        ranks = self.replica_ranks(replica)
        return self.devices[ranks.start:ranks.stop]

    def replica_cut(self, replica: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(teacher, student) block counts per stage of ``replica``'s pipeline."""
        if not self.replica_stages:
            return self.teacher_counts, self.student_counts
        ranks = self.replica_ranks(replica)
        return self.teacher_counts[ranks.start:ranks.stop], self.student_counts[ranks.start:ranks.stop]

    def pipeline(self, replica: int = 0) -> Placement:
        """One replica's pipeline as a placement of its own (R = 1)."""
        return Placement(self.replica_devices(replica), *self.replica_cut(replica))

    def pipelines(self) -> list[Placement]:
        return [self.pipeline(r) for r in range(self.replicas)]

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

    def evaluation_batch(self, batch: int, microbatches: int) -> int:
        """Images each replica forwards per validation batch: the largest equal share. The replicas split
        the validation set as they split a step (every R-th batch each), in their training micro-batch's
        shape rather than the global batch's (which would be R times a replica's micro-batch on its GPU,
        with R - 1 replicas idle on a small split). Equal shares whatever a REBALANCE gave, so that the
        size is one per launch: a pipelining stage keeps its first shapes."""
        return max(equal_shares(batch, self.replicas, microbatches))

    def with_shares(self, shares: Sequence[int]) -> Placement:
        return replace(self, shares=tuple(shares))

    def shared_by_speed(self, replica_step_s: Sequence[float], batch: int, microbatches: int) -> Placement:
        """The same layout with shares in proportion to each replica's speed (its share over its step
        time, ``replica_step_s``), so that the replicas finish a step together."""
        speeds = [share / step for share, step in zip(self.share_sizes(batch, microbatches), replica_step_s)]
        return self.with_shares(shares_for_speeds(speeds, batch, microbatches))

    def stage_peers(self) -> list[list[int]] | None:
        """Per rank, the ranks that run the same blocks (itself included: one per replica cut alike, fewer
        where a replica is cut differently); None for one pipeline."""
        if self.replicas == 1:
            return None
        by_work: dict[tuple[range, range], list[int]] = {}
        for rank in range(self.world_size):  # ranks in order: each list in replica order
            by_work.setdefault((self.teacher_range(rank), self.student_range(rank)), []).append(rank)
        return [by_work[(self.teacher_range(rank), self.student_range(rank))] for rank in range(self.world_size)]

    def student_groups(self) -> list[tuple[tuple[int, ...], range]]:
        """The student's blocks by the ranks that own them: (owners, blocks) for each run of blocks that
        the same ranks (one per replica) hold, in block order. Every rank meets its groups in this order,
        so collectives over them never wait on each other crosswise."""
        blocks = sum(self.replica_cut(0)[1])
        owners = [tuple(self.first_rank(r) + _stage_holding(self.replica_cut(r)[1], b) for r in range(self.replicas))
                  for b in range(blocks)]
        groups: list[tuple[tuple[int, ...], range]] = []
        for block, ranks in enumerate(owners):
            if groups and groups[-1][0] == ranks:
                groups[-1] = (ranks, range(groups[-1][1].start, block + 1))
            else:
                groups.append((ranks, range(block, block + 1)))
        return groups

    def without_replica(self, replica: int, batch: int, microbatches: int) -> Placement:
        """The layout after dropping one replica: the others share its images (global batch unchanged)."""
        if self.replicas == 1:
            raise PartitionError("a single pipeline has no replica to drop")
        kept = [p for r, p in enumerate(self.pipelines()) if r != replica]
        left = self.replicas - 1
        return Placement.of_pipelines(kept, equal_shares(batch, left, microbatches) if left > 1 else ())

    def with_replica(self, replica: int, pipeline: Placement) -> Placement:
        """The layout with ``replica``'s pipeline replaced (its devices and cut; e.g. re-cut on fewer devices)."""
        pipelines = self.pipelines()
        pipelines[replica] = pipeline
        return Placement.of_pipelines(pipelines, self.shares)

    def teacher_range(self, rank: int) -> range:
        """The teacher blocks global rank ``rank`` runs (for one pipeline, rank = stage)."""
        return _range(self.replica_cut(self.replica_of(rank))[0], self.stage_of(rank))

    def student_range(self, rank: int) -> range:
        return _range(self.replica_cut(self.replica_of(rank))[1], self.stage_of(rank))

    def only_shares_differ(self, other: Placement) -> bool:
        """Whether ``other`` is this layout of replicas with other shares of the global batch and nothing else
        (the same devices, cuts and so process groups): a REBALANCE the running ranks can take in place."""
        return other.replicas > 1 and replace(other, shares=self.shares) == self

    def same_ranks(self, other: Placement) -> bool:
        """Whether ``other`` keeps every rank where it is: the same devices, replicas and stages per replica
        (cuts and shares may differ). The running ranks can move to it in place: blocks travel between the
        ranks of each replica, and the groups over them are made anew (a live REPLAN, with or without replicas)."""
        return (self.devices == other.devices and self.replicas == other.replicas
                and all(self.stages_in(r) == other.stages_in(r) for r in range(self.replicas)))

    def same_split(self, other: Placement) -> bool:
        """Whether both cut the models the same way (devices aside)."""
        return (self.teacher_counts, self.student_counts, self.replica_stages) == (
            other.teacher_counts, other.student_counts, other.replica_stages)

    def on(self, devices: Sequence[int]) -> Placement:
        """The same layout and split on other devices (one per rank)."""
        return replace(self, devices=tuple(devices))

    def check_block_counts(self, teacher_blocks: int, student_blocks: int) -> None:
        for replica in range(self.replicas):
            for name, counts, total in zip(("teacher", "student"), self.replica_cut(replica),
                                           (teacher_blocks, student_blocks)):
                if sum(counts) != total:
                    which = f" (replica {replica})" if self.replica_stages else ""
                    raise PartitionError(f"partition.{name}={list(counts)}{which} covers {sum(counts)} blocks but "
                                         f"the {name} model has {total}; make the counts sum to {total}")

    def to_dict(self) -> dict[str, Any]:
        """Records keep today's three keys for one pipeline; a layout adds its replicas (and shares, and
        the stages of each replica when their cuts differ)."""
        data: dict[str, Any] = {"devices": list(self.devices), "teacher": list(self.teacher_counts),
                                "student": list(self.student_counts)}
        if self.replicas > 1:
            data["replicas"] = self.replicas
        if self.shares:
            data["shares"] = list(self.shares)
        if self.replica_stages:
            data["replica_stages"] = list(self.replica_stages)
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
                   tuple(data.get("shares", ())), tuple(data.get("replica_stages") or ()))


def _stage_holding(counts: Sequence[int], block: int) -> int:
    """Which stage of a cut holds ``block``."""
    return next(stage for stage, end in enumerate(accumulate(counts)) if block < end)


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
