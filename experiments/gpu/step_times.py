"""Median step time of a run from its metrics.jsonl, after a warm-up, with quartiles and n.

    python experiments/gpu/step_times.py NAME RUN_DIR/metrics.jsonl WARMUP_STEPS
"""
import json
import statistics
import sys

name, path, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    times = [r["step_time_s"] for r in map(json.loads, open(path)) if r.get("kind") == "train"][warmup:]
except OSError as exc:
    print(f"{name}: no metrics ({exc})")
    sys.exit(0)
q1, median, q3 = statistics.quantiles(times, n=4)
print(f"{name}: median step {median * 1e3:.1f} ms (q1 {q1 * 1e3:.1f}, q3 {q3 * 1e3:.1f}, n={len(times)}), "
      f"{128 / median:.0f} img/s")
