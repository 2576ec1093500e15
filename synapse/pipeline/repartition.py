"""Live REPLAN: move student blocks between running ranks instead of restarting them.

Every rank already holds the *whole* student and teacher as modules (it builds them from the
seed and the teacher file at start, and trains only its own blocks), so a new partition
needs no new modules: only the trained state of the student blocks that change owner, that
is their parameters, buffers and optimizer state. Those travel point to point from the old
owner to the new one over the existing process group. The teacher is frozen, so its blocks
are already right everywhere.

Transfers go in one global order of (source, destination) pairs that every rank walks, each
rank doing only its own sends and receives: matched, so no deadlock, and no rank waits on a
pair it is not part of for longer than the pairs before it. Per pair, a small pickled message
describes the payload (names, shapes, dtypes, plain values), then every tensor travels as a
tensor (``dist.send``/``recv``): over NCCL that is device to device, with no host copy and no
pickling of parameter data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from synapse.partitioning import Placement


@dataclass(frozen=True)
class BlockMove:
    block: int
    source: int  # old owner rank
    destination: int  # new owner rank


def owners(counts: tuple[int, ...]) -> list[int]:
    """The stage of each block, from blocks-per-stage counts."""
    return [rank for rank, n in enumerate(counts) for _ in range(n)]


def student_moves(old: Placement, new: Placement) -> list[BlockMove]:
    """Student blocks whose owner changes, replica by replica: every replica holds the whole student (the
    replicas end each step with the same weights), so a block moves between two ranks of one replica."""
    if not old.same_ranks(new):
        raise ValueError(f"a live re-partition keeps every rank on its device, in its replica: {old.to_dict()} "
                         f"cannot become {new.to_dict()} in place; use failover.replan_mode=restart for that")
    moves = []
    for replica in range(old.replicas):
        (old_teacher, before_counts), (new_teacher, after_counts) = old.replica_cut(replica), new.replica_cut(replica)
        if sum(old_teacher) != sum(new_teacher) or sum(before_counts) != sum(after_counts):
            raise ValueError(f"partitions {old.to_dict()} and {new.to_dict()} place different numbers of blocks")
        first = old.first_rank(replica)
        before, after = owners(before_counts), owners(after_counts)
        moves += [BlockMove(b, first + s, first + d) for b, (s, d) in enumerate(zip(before, after)) if s != d]
    return moves


def exchange_blocks(moves: list[BlockMove], rank: int, payload_of, device: torch.device | None = None
                    ) -> dict[int, dict[str, Any]]:
    """Send the payload of each block this rank gives away; return the payloads it receives.

    ``payload_of(block)`` is the block's state on its old owner (a nested dict of tensors and plain
    values: parameters, buffers, optimizer state). ``device`` is where the process group moves
    tensors (the rank's GPU for NCCL; default: the CPU, for gloo). A received tensor lands on
    ``device``, or on the CPU if it lived on the CPU at its sender (an optimizer's step count).
    """
    device = device or torch.device("cpu")
    pairs = sorted({(m.source, m.destination) for m in moves})
    received: dict[int, dict[str, Any]] = {}
    for source, destination in pairs:
        blocks = [m.block for m in moves if (m.source, m.destination) == (source, destination)]
        if rank == source:
            layout, tensors = _split({b: payload_of(b) for b in blocks})
            dist.send_object_list([layout], dst=destination)
            for tensor in tensors:
                dist.send(tensor.detach().to(device).contiguous(), dst=destination)
        elif rank == destination:
            message: list[Any] = [None]
            dist.recv_object_list(message, src=source)
            received.update(_join(message[0], source, device))
    return received


_TENSOR = "__synapse_tensor__"


def _split(payload: Any) -> tuple[Any, list[torch.Tensor]]:
    """The payload with each tensor replaced by its description, and the tensors in order."""
    tensors: list[torch.Tensor] = []

    def walk(value: Any) -> Any:
        if torch.is_tensor(value):
            tensors.append(value)
            return {_TENSOR: (tuple(value.shape), value.dtype, value.device.type == "cpu")}
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(item) for item in value)
        return value

    return walk(payload), tensors


def _join(layout: Any, source: int, device: torch.device) -> Any:
    """Receive the tensors a layout describes, in order, and rebuild the payload."""
    def walk(value: Any) -> Any:
        if isinstance(value, dict) and _TENSOR in value:
            shape, dtype, on_cpu = value[_TENSOR]
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, src=source)
            return tensor.cpu() if on_cpu else tensor
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(item) for item in value)
        return value

    return walk(layout)


def payload_size_bytes(payload: dict[str, Any]) -> int:
    """Bytes of the tensors in one block's payload (for the records)."""
    total = 0
    for value in payload.values():
        items = value.values() if isinstance(value, dict) else [value]
        for item in items:
            if isinstance(item, dict):
                total += sum(t.numel() * t.element_size() for t in item.values() if torch.is_tensor(t))
            elif torch.is_tensor(item):
                total += item.numel() * item.element_size()
    return total
