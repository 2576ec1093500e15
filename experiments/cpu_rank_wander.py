"""How far CPU ranks' own compute wanders in fault-free runs, and what the detector made of it.

    python experiments/cpu_rank_wander.py RUN_DIR [RUN_DIR ...] [--skip 60] [--window 20]

Per run and rank: each step's compute over the rank's median (steps after ``--skip``), the
spread of that ratio (p5-p95), the range of its ``--window``-step rolling median (a drift the
detector's window sees), the share of steps above 1.25x, and the run's live detections
(``slowdown_detected`` in failover_events.jsonl). A markdown table on stdout.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rank_wander(compute: list[float], window: int) -> dict[str, float]:
    typical = statistics.median(compute)
    ratios = [c / typical for c in compute]
    rolling = [statistics.median(ratios[i - window:i]) for i in range(window, len(ratios) + 1)]
    return {"p5": quantile(ratios, 0.05), "p95": quantile(ratios, 0.95), "roll_min": min(rolling),
            "roll_max": max(rolling), "above_1.25": sum(r > 1.25 for r in ratios) / len(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--skip", type=int, default=60, help="steps of warm-up left out")
    parser.add_argument("--window", type=int, default=20)
    args = parser.parse_args()
    print("| run | steps | rank | median ms | p5-p95 | rolling median min-max | > 1.25x | detections |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in args.runs:
        steps = [r for r in rows(run / "performance.jsonl") if "compute_s" in r and r["step"] > args.skip]
        events = rows(run / "failover_events.jsonl")
        detections = [f"r{e['rank']}@{e['detected_step']} {e['ratio']:.2f}x" for e in events
                      if e.get("event") == "slowdown_detected"]
        if len(steps) <= args.window:
            print(f"| {run.name} | {len(steps)} | - | - | - | - | - | {', '.join(detections) or 'none'} |")
            continue
        for rank in range(len(steps[0]["compute_s"])):
            compute = [r["compute_s"][rank] for r in steps]
            w = rank_wander(compute, args.window)
            print(f"| {run.name} | {len(steps)} | {rank} | {1e3 * statistics.median(compute):.1f} | "
                  f"{w['p5']:.2f}-{w['p95']:.2f} | {w['roll_min']:.2f}-{w['roll_max']:.2f} | "
                  f"{100 * w['above_1.25']:.1f}% | "
                  f"{(', '.join(detections) or 'none') if rank == 0 else ''} |")


if __name__ == "__main__":
    main()
