"""Live REPLAN: move student blocks between running ranks instead of restarting them.

Every rank already holds the *whole* student and teacher as modules (it builds them from the
seed and the teacher file at start, and trains only its own blocks), so a new partition
needs no new modules: only the trained state of the student blocks that change owner, that
is their parameters, buffers and optimizer state. Those travel point to point from the old
owner to the new one over the existing process group. The teacher is frozen, so its blocks
are already right everywhere.

Transfers go in one global order of (source, destination) pairs that every rank walks, each
rank doing only its own sends and receives: matched, so no deadlock, and no rank waits on a
pair it is not part of for longer than the pairs before it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .partition import StagePartition


@dataclass(frozen=True)
class BlockMove:
    block: int
    source: int  # old owner rank
    destination: int  # new owner rank


def owners(counts: tuple[int, ...]) -> list[int]:
    """The rank of each block, from blocks-per-stage counts."""
    return [rank for rank, n in enumerate(counts) for _ in range(n)]


def student_moves(old: StagePartition, new: StagePartition) -> list[BlockMove]:
    """Student blocks whose owner changes (same number of ranks: a live REPLAN keeps the devices)."""
    if old.num_stages != new.num_stages:
        raise ValueError(f"a live re-partition keeps the devices: {old.num_stages} stages cannot become "
                         f"{new.num_stages}; use failover.replan_mode=restart for that")
    if sum(old.student) != sum(new.student) or sum(old.teacher) != sum(new.teacher):
        raise ValueError(f"partitions {old.to_dict()} and {new.to_dict()} place different numbers of blocks")
    before, after = owners(old.student), owners(new.student)
    return [BlockMove(b, s, d) for b, (s, d) in enumerate(zip(before, after)) if s != d]


def exchange_blocks(moves: list[BlockMove], rank: int, payload_of) -> dict[int, dict[str, Any]]:
    """Send the payload of each block this rank gives away; return the payloads it receives.

    ``payload_of(block)`` is the block's state on its old owner (tensors, optimizer state).
    One message per (source, destination) pair, pairs in a global order.
    """
    pairs = sorted({(m.source, m.destination) for m in moves})
    received: dict[int, dict[str, Any]] = {}
    for source, destination in pairs:
        blocks = [m.block for m in moves if (m.source, m.destination) == (source, destination)]
        if rank == source:
            dist.send_object_list([{b: payload_of(b) for b in blocks}], dst=destination)
        elif rank == destination:
            message: list[Any] = [None]
            dist.recv_object_list(message, src=source)
            received.update(message[0])
    return received


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
