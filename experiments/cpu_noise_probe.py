"""Is a CPU rank's speed drift the host's or ours? The same fixed work, timed, with nothing else.

    python experiments/cpu_noise_probe.py [--seconds 40] [--layouts free,0-1-2,spread,alone]

Each layout starts one process per listed core (one torch thread each) that repeats the same
small conv forward + backward (the demo student's size) for ``--seconds`` and times every
iteration. No pipeline, no gloo, no supervisor, no checkpoints: if these iterations drift
as the demo's CPU ranks do (10-step medians 0.65-1.6x), the drift is the host's (steal,
frequency, SMT siblings, neighbours), and only the detector can allow for it.

Layouts: ``free`` 3 unpinned processes; ``a-b-c`` pinned to those cores; ``spread`` pinned to
3 cores on distinct physical cores (from /sys topology); ``alone`` one process on core 0.
Prints the host's topology and steal time, then one line per process.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path


def physical_cores() -> dict[int, str]:
    """Logical core -> its physical core (package:core id), where /sys says."""
    out = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            out[cpu] = f"{(topo / 'physical_package_id').read_text().strip()}:{(topo / 'core_id').read_text().strip()}"
        except OSError:
            out[cpu] = str(cpu)
    return out


def steal_jiffies() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) if len(fields) > 8 else 0


def work(core: int | None, seconds: float, queue) -> None:
    import torch
    import torch.nn as nn

    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        times.append(time.perf_counter() - start)
    queue.put((core, times))


def describe(times: list[float], window: int = 10, skip: int = 20) -> str:
    times = times[skip:]
    typical = statistics.median(times)
    ratios = sorted(t / typical for t in times)
    rolling = [statistics.median(times[i - window:i]) / typical for i in range(window, len(times) + 1)]
    p = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]  # noqa: E731
    return (f"{len(times)} iterations, median {1e3 * typical:.1f} ms, p5-p95 {p(0.05):.2f}-{p(0.95):.2f}, "
            f"{window}-iteration median {min(rolling):.2f}-{max(rolling):.2f}")


def run_layout(name: str, seconds: float, topology: dict[int, str]) -> None:
    cores = sorted(topology)
    if name == "free":
        placement = [None] * 3
    elif name == "alone":
        placement = [cores[0]]
    elif name == "spread":
        seen, placement = set(), []
        for cpu in cores:
            if topology[cpu] not in seen and len(placement) < 3:
                seen.add(topology[cpu])
                placement.append(cpu)
    else:
        placement = [int(c) for c in name.split("-")]
    queue = mp.get_context("spawn").Queue()
    steal = steal_jiffies()
    procs = [mp.get_context("spawn").Process(target=work, args=(core, seconds, queue)) for core in placement]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    ticks = os.sysconf("SC_CLK_TCK")
    steal_s = (steal_jiffies() - steal) / ticks
    print(f"{name}: cores {placement}, host steal {steal_s:.2f} cpu-s over the layout", flush=True)
    for core, times in results:
        print(f"  core {core}: {describe(times)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--layouts", default="free,0-1-2,spread,alone")
    args = parser.parse_args()
    topology = physical_cores()
    print(f"{len(topology)} cores; physical (package:core) of each: {topology}", flush=True)
    for name in args.layouts.split(","):
        run_layout(name, args.seconds, topology)


if __name__ == "__main__":
    main()
