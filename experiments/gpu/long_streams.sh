#!/usr/bin/env bash
# bash experiments/gpu/long_streams.sh   (one-H200 device machine, repository root; results under $OUT)
# #15 on real hardware, the user's command each time: long fault-free runs whose performance.jsonl
# become regression streams for the detector (zero false detections over >= 2,000 real steps), and a
# gradual slowdown (a ramp) to see how soon it is found.
#   gpu_none    ViT-B/16 -> ResNet-50 @256 (M = 2), K = 1 pipeline, fault-free, 1,500 steps
#   gpu_ramp    the same, rank 0's compute 1x -> 4x over steps 30-80 (the slow_ramp member's shape)
#   gpu_l152    ViT-L/16 -> ResNet-152 @128 (M auto), K = 1 pipeline, fault-free, 600 steps
#   cpu3_none   the demo models on 3 CPU ranks (16 idle cores), fault-free, 800 steps
#   cpu3_ramp   the slow_ramp member with its own documented command, on the idle 16-core host
# long_streams.txt: per run, the detections and decisions; long_streams.tgz: each run's records.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/long"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
gpu="trainer=gpu trainer.devices=[0] teacher.auto_train_epochs=0 data=synthetic
  data.synthetic_train_size=8192 data.num_workers=8 trainer.eval_every_epochs=100 trainer.progress=false report=false"
vitb="teacher=vit_base student=resnet50 data.batch_size=256 pipeline.microbatches=2"
run() {  # name, overrides...
  local name=$1; shift
  timeout 300 python3 train.py "$@" hydra.run.dir=/tmp/long_$name > "$OUT/long/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/long_streams.txt"
  mkdir -p "$OUT/long/$name"
  cp /tmp/long_$name/{failover_events.jsonl,performance.jsonl,config.yaml} "$OUT/long/$name/" 2>/dev/null
  python3 - /tmp/long_$name <<'PY' | tee -a "$OUT/long_streams.txt"
import json, statistics, sys
from collections import Counter
run = sys.argv[1]
events = [json.loads(line) for line in open(f"{run}/failover_events.jsonl")]
steps = [json.loads(line) for line in open(f"{run}/performance.jsonl")]
walls = sorted(r["step_seconds"] for r in steps if "step_seconds" in r)
print(f"  {len(steps)} step records, median step {1e3 * statistics.median(walls):.1f} ms" if walls else "  no steps")
for e in events:
    if e["event"] in ("slowdown_detected", "recovery_detected", "fault_injected"):
        print("  " + e["event"] + ": " + ", ".join(f"{k}={e[k]}" for k in
              ("kind", "rank", "ratio", "onset_step", "detected_step", "latency_steps", "start") if k in e))
print("  decisions:", dict(Counter(e["action"] for e in events if e["event"] == "decision")))
PY
  tar czf "$OUT/long_streams.tgz" -C "$OUT" long  # as we go: a time-out keeps what finished
}
for name in ${RUNS:-gpu_ramp cpu3_ramp cpu3_none gpu_none gpu_l152}; do
  case $name in
    gpu_none) run gpu_none $gpu $vitb trainer.max_steps=1500 injection=none ;;
    gpu_ramp) run gpu_ramp $gpu $vitb trainer.max_steps=150 injection.name=ramp30 \
      "injection.faults=[{kind:slow_compute,rank:0,start:30,factor:4.0,ramp_steps:50}]" ;;
    gpu_l152) run gpu_l152 $gpu teacher=vit_large student=resnet152 data.batch_size=128 \
      pipeline.microbatches=auto trainer.max_steps=600 injection=none ;;
    cpu3_none) run cpu3_none trainer.accelerator=cpu trainer.devices=3 trainer.max_steps=800 injection=none report=false ;;
    cpu3_ramp) run cpu3_ramp trainer.accelerator=cpu trainer.devices=3 trainer.max_steps=120 injection=slow_ramp report=false ;;
  esac
done
rm -r "$OUT/long"
