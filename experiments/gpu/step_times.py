"""Throughput of a run from its metrics.jsonl, after a warm-up: per 5-step block and per step.

    python experiments/gpu/step_times.py NAME RUN_DIR/metrics.jsonl WARMUP_STEPS [BATCH]

Blocks first: where the host runs a step ahead of the GPU (the single-device trainer's late
loss check on CUDA), the wait moves between neighbouring steps and a median of per-step times
no longer measures throughput; the sum over a block does.
"""
import json
import statistics
import sys

BLOCK = 5
name, path, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 128
try:
    times = [r["step_time_s"] for r in map(json.loads, open(path)) if r.get("kind") == "train"][warmup:]
except OSError as exc:
    print(f"{name}: no metrics ({exc})")
    sys.exit(0)
blocks = [BLOCK * batch / sum(times[i:i + BLOCK]) for i in range(0, len(times) - BLOCK + 1, BLOCK)]
b1, b2, b3 = statistics.quantiles(blocks, n=4)
q1, median, q3 = statistics.quantiles(times, n=4)
print(f"{name}: {b2:.0f} img/s per {BLOCK}-step block (q1 {b1:.0f}, q3 {b3:.0f}, n={len(blocks)}); "
      f"median step {median * 1e3:.1f} ms (q1 {q1 * 1e3:.1f}, q3 {q3 * 1e3:.1f}, n={len(times)})")
