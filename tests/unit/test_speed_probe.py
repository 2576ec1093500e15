"""The start probe (synapse/health/speed_probe.py): turns, the reading, and 3 real gloo CPU ranks
probing in turn with one injected 1.5x slow from step 1 (the injector's own delay)."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from synapse.health import PROBE_ROUNDS, ProbeReading, ProbeWork, probe_devices, turn_of
from synapse.health.speed_probe import time_rounds
from synapse.injection import FaultInjector, parse_faults


def test_cpu_ranks_take_turns_and_gpus_probe_at_once_unless_shared():
    assert [turn_of(r, 3, r, [0, 1, 2], "cpu") for r in range(3)] == [(0, 3), (1, 3), (2, 3)]
    assert turn_of(4, 6, 1, [0, 1, 2], "cpu") == (4, 6)  # two nodes: maybe one host, so all in turn
    assert [turn_of(r, 4, r, [0, 1, 2, 3], "cuda") for r in range(4)] == [(0, 1)] * 4
    assert [turn_of(r, 3, r, [5, 5, 5], "cuda") for r in range(3)] == [(0, 3), (1, 3), (2, 3)]  # trainer.shared_gpu
    assert [turn_of(r, 3, r, [0, 0, 1], "cuda") for r in range(3)] == [(0, 2), (1, 2), (0, 2)]


@pytest.fixture
def one_thread():
    """As a CPU rank of the demo computes (trainer.threads=1): more threads than free cores spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_reading_is_the_fastest_round_and_each_round_is_slowed_by_its_own_work(one_thread):
    """Interference only adds time: one disturbed round does not move the reading; a slow_down of half
    each round's work (a 1.5x device) moves every round, so the reading too."""
    work = ProbeWork(torch.device("cpu"))
    disturbed = iter([0.05] + [0.0] * (PROBE_ROUNDS - 1))
    healthy = time_rounds(work, PROBE_ROUNDS, lambda work_s: time.sleep(next(disturbed)), lambda one: one())
    assert len(healthy.rounds_s) == PROBE_ROUNDS and healthy.seconds < 0.05 <= max(healthy.rounds_s)
    seen: list[float] = []

    def slow_down(work_s: float) -> None:
        seen.append(work_s)
        time.sleep(0.5 * work_s)

    slow = time_rounds(work, PROBE_ROUNDS, slow_down, lambda one: one())
    assert len(seen) == PROBE_ROUNDS and all(r >= 1.5 * s for r, s in zip(slow.rounds_s, seen))
    assert slow.seconds >= 1.5 * min(seen)
    assert ProbeReading((0.3, 0.1, 0.2)).seconds == 0.1


def _probe_rank(rank: int, world: int, port: int, out: str, faults: list[dict]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        injector = FaultInjector(parse_faults(faults, world), rank)  # the real delay: a host sleep on CPU
        readings, cost_s = probe_devices(torch.device("cpu"), rank, list(range(world)),
                                         lambda work_s: injector.slow_probe(1, work_s))
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"probe_s": readings, "cost_s": cost_s}, f)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_three_real_cpu_ranks_probe_in_turn_and_the_one_injected_1_5x_slow_reads_slow(tmp_path):
    out = tmp_path / "probe.json"
    faults = [{"kind": "slow_compute", "rank": 2, "start": 1, "factor": 1.5}]
    mp.spawn(_probe_rank, args=(3, free_port(), str(out), faults), nprocs=3)
    result = json.loads(out.read_text())
    probe_s = result["probe_s"]
    assert probe_s[2] >= 1.3 * max(probe_s[:2]) and max(probe_s[:2]) < 1.3 * min(probe_s[:2]), probe_s
    assert result["cost_s"] < 3.0, result  # 15 rounds x 3 turns of ~2 ms work: ~0.1-0.6 s measured here
