#!/usr/bin/env bash
# bash experiments/gpu/k1_and_step_gap.sh   (one-H200 device machine, repository root; results under $OUT)
# 1. #17, on the final code: the user's command, ViT-L/16 -> ResNet-152 @128 synthetic, single-device
#    trainer vs K = 1 through the pipeline runtime with graphs (M = 1 and auto), alternating twice,
#    throughput per 5-step block (experiments/gpu/step_times.py); the K = 1 runs' online calibration
#    (block_calibration events: each stage's measured compute vs its graphed profile).
# 2. #16: where train.py's last 5% goes (experiments/gpu/probe_trainer_gap.py), both pairs.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
timeout 100 python3 experiments/gpu/probe_trainer_gap.py vit_base resnet50 128 14 2>&1 | grep -v -i warn \
  | tee "$OUT/probe_trainer_gap_vitb.txt"
K1_WORKERS=14 K1_STEPS=70 source experiments/gpu/k1_runs.sh
for round in 1 2; do
  run single_$round pipeline.microbatches=1
  run pipe_m1_$round trainer.strategy=pipeline pipeline.microbatches=1
done
run pipe_auto trainer.strategy=pipeline pipeline.microbatches=auto
grep -h "microbatches=auto\|cuda graphs" "$OUT"/k1_logs/pipe_auto.log | tee -a "$OUT/k1_step_times.txt"
timeout 150 python3 experiments/gpu/probe_trainer_gap.py vit_large resnet152 128 14 2>&1 | grep -v -i warn \
  | tee "$OUT/probe_trainer_gap_vitl.txt"
tar czf "$OUT/k1_logs.tgz" -C "$OUT" k1_logs && rm -r "$OUT/k1_logs"
