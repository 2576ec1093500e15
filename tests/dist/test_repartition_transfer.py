"""The live REPLAN's block transfer between real gloo processes: what arrives is what was sent.

Three processes, moves in both directions and a pair that crosses another (0 -> 2 while 2 -> 1),
payloads shaped like the real ones: parameters, an int64 BatchNorm counter, Adam moments, a CPU
step count, and plain values.
"""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from synapse.pipeline import BlockMove, exchange_blocks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]

MOVES = [BlockMove(0, 0, 2), BlockMove(1, 0, 2), BlockMove(4, 2, 1), BlockMove(5, 1, 0)]


def payload(block: int) -> dict:
    generator = torch.Generator().manual_seed(block)
    return {"tensors": {f"b{block}.weight": torch.randn(3, 4, generator=generator),
                        f"b{block}.bn.num_batches_tracked": torch.tensor(block * 7, dtype=torch.int64),
                        f"b{block}.half": torch.randn(5, generator=generator).to(torch.bfloat16)},
            "optim": {f"b{block}.weight": {"exp_avg": torch.randn(3, 4, generator=generator),
                                           "step": torch.tensor(float(block + 1)), "note": "adam", "lr": 0.1}}}


def worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        received = exchange_blocks(MOVES, rank, payload)
        out[rank] = received
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_same(a, b) -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


def test_every_rank_receives_exactly_the_blocks_moved_to_it():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(worker, args=(3, free_port(), out), nprocs=3, start_method="spawn")
        received = dict(out)
    expected = {rank: {m.block: payload(m.block) for m in MOVES if m.destination == rank} for rank in range(3)}
    assert {rank: sorted(r) for rank, r in received.items()} == {0: [5], 1: [4], 2: [0, 1]}
    for rank in range(3):
        assert_same(received[rank], expected[rank])
