"""The start probe: every rank of a launch times the same small workload before its first step.

Why: a device slow from a launch's first step (a bad card, a throttled node) cannot be told from a
heavy stage by step times alone, since the plan that says what a stage should cost is itself off
(a healthy CPU rank of the demo read up to 1.68x its peers against it; `synapse.detection.start`).
On *identical* work the plan does not enter: a device whose probe reads ``probe_threshold`` times
its peers' is slow, whatever its stage.

What is timed: a fixed chain of matrix products (fixed sizes and values, the same on every rank of
the platform), ``PROBE_ROUNDS`` times after one untimed warm-up. A rank's reading is its *fastest*
round: what else runs on the machine only ever adds time to a round, while a slow device is slow
in every round. Ranks that share hardware take turns (on CPU the host's cores; on CUDA, ranks on
one GPU): while one times a round the others wait at a barrier, so they do not slow each other;
ranks on GPUs of their own time their rounds at once.

What slows a device slows the probe: the injected compute slowdowns scale each round as they
scale a training task (`synapse.injection.FaultInjector.slow_probe`: a ``factor`` f makes a round
take f times its work), so an injected slow-from-the-start device reads slow here as a real one does.

Cost (the 2-core machine, 3 CPU ranks; docs/failover.md#detection): ~2 ms of work per round, the
whole probe 0.17 s median in all (1.18 s at most with two busy-loops beside), mostly turns and
barriers. Fifteen rounds, not fewer: of 150 probes beside two busy-loops, cut to their first 9
rounds one read a healthy rank 1.62x the fastest; with 12 or 15 none read above 1.16x.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

PROBE_ROUNDS = 15
# The work of one round: ``_CHAIN`` products of a ``side`` x ``side`` matrix. CPU: ~2 ms on one core of the
# 2-core machine (fp32; short rounds: more of them get through between other processes' time slices);
# CUDA: 10 bf16 GEMMs of 4096 (~1.4 TFLOP: past the launch-bound regime; on an H200 a round read 1.80 ms and
# the whole probe of one GPU cost 0.136 s in a real launch, docs/gpu.md)
_CPU_SIDE, _CUDA_SIDE, _CHAIN = 256, 4096, 10


@dataclass(frozen=True)
class ProbeReading:
    """One rank's probe: each round's seconds (injected delays included), and the reading itself."""

    rounds_s: tuple[float, ...]

    @property
    def seconds(self) -> float:
        """The fastest round: interference only adds time, a slow device is slow in every round."""
        return min(self.rounds_s)


class ProbeWork:
    """The fixed workload of one round on ``device`` (the same sizes and values on every rank)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        side, dtype = (_CUDA_SIDE, torch.bfloat16) if device.type == "cuda" else (_CPU_SIDE, torch.float32)
        # Drawn on the device itself (a 4096^2 draw on the host took 0.3 s here), with entries of variance
        # 1/side: a product then keeps its scale on average, so ten of them neither overflow nor reach
        # subnormals (measured: |x| at most 0.09 after ten bf16 products of 4096). An orthogonal factor would
        # keep it exactly, but a 4096^2 QR took 14 s on this 2-core machine, at every launch.
        generator = torch.Generator(device).manual_seed(0)
        self._a = (torch.randn(side, side, generator=generator, device=device) / side ** 0.5).to(dtype)
        self._b = (torch.randn(side, side, generator=generator, device=device) / side ** 0.5).to(dtype)

    def run(self) -> None:
        x = self._a
        for _ in range(_CHAIN):
            x = x @ self._b
        self.synchronize()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def time_rounds(work: ProbeWork, rounds: int, slow_down: Callable[[float], None],
                turn: Callable[[Callable[[], float]], float | None]) -> ProbeReading:
    """``rounds`` timed rounds of ``work``; ``slow_down(work_s)`` adds what slows this device to a round
    that took ``work_s`` (the injected slowdowns); ``turn(time_one)`` runs ``time_one`` in this rank's
    turn and returns its seconds (None where the rank had no turn: never, for a probing rank)."""
    work.run()  # warm-up: first-touch allocation, kernels loaded; untimed

    def time_one() -> float:
        started = time.perf_counter()
        work.run()
        slow_down(time.perf_counter() - started)
        work.synchronize()  # an injected delay on CUDA is a kernel: it ends in the round
        return time.perf_counter() - started

    readings = []
    for _ in range(rounds):
        seconds = turn(time_one)
        if seconds is not None:
            readings.append(seconds)
    return ProbeReading(tuple(readings))


def turn_of(rank: int, world: int, local_rank: int, node_devices: Sequence[int], device_type: str) -> tuple[int, int]:
    """(this rank's turn, how many turns its node needs; ``node_devices``: the physical device of each
    local rank). CPU ranks take a turn each, all of the group in turn: they share cores, and nodes named
    apart may be one host (two launchers on 127.0.0.1). On CUDA the ranks of one GPU take turns, and
    GPUs (of every node) probe at once."""
    if device_type != "cuda":
        return rank, world
    mine = node_devices[local_rank]
    sharing = [r for r, d in enumerate(node_devices) if d == mine]
    return sharing.index(local_rank), max(node_devices.count(d) for d in node_devices)


def probe_devices(device: torch.device, local_rank: int, node_devices: Sequence[int],
                  slow_down: Callable[[float], None], rounds: int = PROBE_ROUNDS,
                  group: dist.ProcessGroup | None = None) -> tuple[list[float], float]:
    """Every rank's probe reading (seconds, in rank order) and this rank's wall seconds for the whole
    probe. Collective: every rank of the process group calls it at the same point of its start-up."""
    started = time.perf_counter()
    world = dist.get_world_size(group)
    my_turn, node_turns = turn_of(dist.get_rank(group), world, local_rank, node_devices, device.type)
    # Every rank passes the same barriers: as many turns as the node that needs the most (nodes may hold
    # different numbers of ranks after a device was dropped)
    counts: list[int] = [0] * world
    dist.all_gather_object(counts, node_turns, group=group)
    turns = max(counts)

    def in_turn(time_one: Callable[[], float]) -> float | None:
        seconds = None
        for turn in range(turns):
            if turn == my_turn:
                seconds = time_one()
            dist.barrier(group=group)
        return seconds

    reading = time_rounds(ProbeWork(device), rounds, slow_down, in_turn)
    gathered: list[float] = [0.0] * world
    dist.all_gather_object(gathered, reading.seconds, group=group)
    return [float(s) for s in gathered], time.perf_counter() - started
