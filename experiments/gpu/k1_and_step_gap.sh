#!/usr/bin/env bash
# bash experiments/gpu/k1_and_step_gap.sh   (one-H200 device machine, repository root; results under $OUT)
# #17, on the final code: the user's command, ViT-L/16 -> ResNet-152 @128 synthetic, the single-device
# trainer vs K = 1 through the pipeline runtime with graphs, alternating twice, throughput per 5-step
# block (experiments/gpu/step_times.py):
#   single       the single-device trainer (M = 1)
#   pipe_m1      K = 1, M = 1, as a user runs it (timing read a step late, loss checked late, exchange on gloo)
#   pipe_m1_sync the same with two of the old per-step waits for the GPU back (pipeline.timing_read=at_step,
#                trainer.nonfinite_check=at_step; the exchange stays on gloo): what reading late is worth
# then K = 1 with pipeline.microbatches=auto; the K = 1 runs' online calibration (block_calibration events).
# About 7 minutes; the logs come back as one tarball (the device tool returns at most 8 files).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
K1_WORKERS=14 K1_STEPS=70 source experiments/gpu/k1_runs.sh
for round in 1 2; do
  run single_$round pipeline.microbatches=1
  run pipe_m1_$round pipeline.microbatches=1
  run pipe_m1_sync_$round pipeline.microbatches=1 pipeline.timing_read=at_step \
    trainer.nonfinite_check=at_step
done
run pipe_auto pipeline.microbatches=auto
grep -h "microbatches=auto\|cuda graphs" "$OUT"/k1_logs/pipe_auto.log | tee -a "$OUT/k1_step_times.txt"
tar czf "$OUT/k1_logs.tgz" -C "$OUT" k1_logs && rm -r "$OUT/k1_logs"
