#!/usr/bin/env bash
# bash experiments/gpu/early_faults.sh   (one-H200 device machine, repository root; results under $OUT)
# #15 on a GPU, with the pipeline's timing read a step late (the CUDA default since 2026-12-02):
# ViT-B/16 -> ResNet-50 @256 (2 micro-batches, synthetic) as a K = 1 pipeline under the failover
# supervisor, the user's command with one fault each:
#   none     fault-free, 300 steps: no detection (its performance.jsonl becomes a regression stream)
#   compute5 rank 0's tasks 2x as slow from step 5 (torch.cuda._sleep on its stream)
#   bgload30 2 processes looping 8192^2 bf16 matmuls on the same GPU from step 30
# early_faults.txt: per run, the detections (rank, kind, ratio, onset, detected) and the decisions;
# early_faults.tgz: each run's failover_events.jsonl, performance.jsonl and config.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/early"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
common="trainer=gpu trainer.devices=[0] teacher=vit_base student=resnet50
  teacher.auto_train_epochs=0 data=synthetic data.batch_size=256 data.synthetic_train_size=8192 data.num_workers=8
  pipeline.microbatches=2 trainer.eval_every_epochs=100 trainer.progress=false report=false"
run() {  # name, steps, overrides...
  local name=$1 steps=$2; shift 2
  timeout 240 python3 train.py $common trainer.max_steps=$steps "$@" hydra.run.dir=/tmp/early_$name \
    > "$OUT/early/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/early_faults.txt"
  mkdir -p "$OUT/early/$name"
  cp /tmp/early_$name/{failover_events.jsonl,performance.jsonl,config.yaml} "$OUT/early/$name/" 2>/dev/null
  python3 - "$name" /tmp/early_$name <<'PY' | tee -a "$OUT/early_faults.txt"
import json, statistics, sys
from collections import Counter
name, run = sys.argv[1], sys.argv[2]
events = [json.loads(line) for line in open(f"{run}/failover_events.jsonl")]
steps = [json.loads(line) for line in open(f"{run}/performance.jsonl")]
walls = sorted(r["step_seconds"] for r in steps if "step_seconds" in r)
print(f"  {len(steps)} step records, median step {1e3 * statistics.median(walls):.1f} ms" if walls else "  no steps")
for e in events:
    if e["event"] in ("slowdown_detected", "recovery_detected", "fault_injected", "block_calibration"):
        if e["event"] == "block_calibration":
            e = {"event": "block_calibration", **{k: round(v, 4) if isinstance(v, float) else v
                                                   for k, v in e["segments"][0].items()}}
        print("  " + e["event"] + ": " + ", ".join(f"{k}={e[k]}" for k in
              ("kind", "rank", "ratio", "onset_step", "detected_step", "latency_steps", "start",
               "profile_s", "measured_s", "slowdown") if k in e))
print("  decisions:", dict(Counter((e["action"], e["reason"][:60]) for e in events if e["event"] == "decision")))
PY
}
for name in ${RUNS:-none compute5 bgload30}; do  # RUNS="none compute5": a subset
  case $name in
    none) run none 300 injection=none ;;
    compute5) run compute5 150 "injection.faults=[{kind:slow_compute,rank:0,start:5,factor:2.0}]" injection.name=compute5 ;;
    bgload30) run bgload30 150 "injection.faults=[{kind:background_load,rank:0,start:30,workers:2,matrix_size:8192}]" \
      injection.name=bgload30 ;;
  esac
done
tar czf "$OUT/early_faults.tgz" -C "$OUT" early && rm -r "$OUT/early"
