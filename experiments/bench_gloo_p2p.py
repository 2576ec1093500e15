# python experiments/bench_gloo_p2p.py --out experiments/results/gloo_p2p.json
"""Point-to-point cost of gloo between two CPU processes on this machine (the pipeline's link).

Two ranks, one intra-op thread each, ping-pong a float32 tensor of each size: rank 0 sends,
rank 1 receives and sends it back. One-way time = round trip / 2 (median over repeats).
A straight-line fit over the sizes gives the link's two physical parameters, what
``DeviceSpec.link_latency_s`` and ``DeviceSpec.link_bandwidth_bytes_per_s`` stand for:

    one_way(bytes) = latency + bytes / bandwidth

``--busy N`` starts N extra single-threaded processes that spin on arithmetic during the
measurement, so the ranks share the cores as K > cores pipeline ranks do: a rank that sleeps
in recv must then wait for a core before it can run (the latency grows, not the bandwidth).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_SIZES_BYTES = (4, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping_pong(rank: int, size_bytes: int, repeats: int, warmup: int) -> float:
    """Median one-way seconds for one tensor of `size_bytes` (measured on rank 0)."""
    tensor = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32)
    samples = []
    for index in range(warmup + repeats):
        start = time.perf_counter()
        if rank == 0:
            dist.send(tensor, dst=1)
            dist.recv(tensor, src=1)
        else:
            dist.recv(tensor, src=0)
            dist.send(tensor, dst=0)
        if index >= warmup:
            samples.append((time.perf_counter() - start) / 2)
    return statistics.median(samples)


def _rank_main(rank: int, port: int, sizes: tuple[int, ...], repeats: int, results) -> None:
    torch.set_num_threads(1)  # as the pipeline ranks run in the planner report
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for size in sizes:  # the first messages of a size set up buffers: not part of the link's cost
            _ping_pong(rank, size, repeats=1, warmup=5)
        one_way = {size: _ping_pong(rank, size, repeats, warmup=2) for size in sizes}
        if rank == 0:
            results.put(one_way)
    finally:
        dist.destroy_process_group()


def _spin(stop) -> None:
    torch.set_num_threads(1)
    x = 1.0
    while not stop.is_set():
        for _ in range(10_000):
            x = x * 1.0000001 + 1e-9


def fit_link(one_way_s: dict[int, float]) -> tuple[float, float]:
    """(latency_s, bandwidth_bytes_per_s) of one_way = latency + bytes / bandwidth (least squares)."""
    sizes = np.array(sorted(one_way_s), dtype=np.float64)
    times = np.array([one_way_s[int(s)] for s in sizes])
    slope, intercept = np.polyfit(sizes, times, 1)
    if slope <= 0:
        raise ValueError(f"one-way times {times.tolist()} do not grow with size {sizes.tolist()}: "
                         f"the machine is too noisy for a fit; rerun with more --repeats")
    return max(0.0, float(intercept)), float(1.0 / slope)


def measure_link(sizes: tuple[int, ...] = DEFAULT_SIZES_BYTES, repeats: int = 50, busy: int = 0) -> dict:
    """Spawn two gloo ranks (plus `busy` spinning processes) and measure the link; returns a JSON-able dict."""
    ctx = mp.get_context("spawn")
    results, stop = ctx.Queue(), ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(busy)]
    for process in spinners:
        process.start()
    try:
        port = _free_port()
        ranks = [ctx.Process(target=_rank_main, args=(r, port, sizes, repeats, results)) for r in range(2)]
        for process in ranks:
            process.start()
        one_way = results.get(timeout=600)
        for process in ranks:
            process.join()
    finally:
        stop.set()
        for process in spinners:
            process.join(timeout=5)
    latency, bandwidth = fit_link(one_way)
    return {"busy_processes": busy, "repeats": repeats, "one_way_s": {str(k): v for k, v in one_way.items()},
            "latency_s": latency, "bandwidth_bytes_per_s": bandwidth}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--busy", type=int, nargs="*", default=[0],
                        help="extra spinning processes, one measurement per value (e.g. --busy 0 1 2)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    runs = [measure_link(repeats=args.repeats, busy=b) for b in args.busy]
    result = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "cores": cores,
              "torch": torch.__version__, "runs": runs}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
