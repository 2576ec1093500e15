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
python3 -c "
import torch; from synapse.models import build_model; torch.manual_seed(0)
torch.save(build_model('vit_large', 100, 3, 224).state_dict(), '/tmp/vitl.pt')"
common="trainer=gpu injection=none teacher=vit_large student=resnet152 data=synthetic data.batch_size=128 \
  data.num_workers=14 teacher.checkpoint=/tmp/vitl.pt trainer.progress=false checkpoint.at_epoch_end=false \
  checkpoint.every=0 trainer.eval_every_epochs=100 report=false trainer.max_steps=70"
run() {  # name, overrides...
  local name=$1; shift
  timeout 200 python3 train.py $common "$@" hydra.run.dir=/tmp/k1_$name > "$OUT/k1_$name.log" 2>&1
  python3 experiments/gpu/step_times.py "$name" /tmp/k1_$name/metrics.jsonl 10 | tee -a "$OUT/k1_step_times.txt"
  grep -h '"block_calibration"' /tmp/k1_$name/failover_events.jsonl 2>/dev/null | head -3 > "$OUT/k1_${name}_calibration.jsonl"
}
for round in 1 2; do
  run single_$round pipeline.microbatches=1
  run pipe_m1_$round trainer.strategy=pipeline pipeline.microbatches=1
done
run pipe_auto trainer.strategy=pipeline pipeline.microbatches=auto
grep -h "microbatches=auto\|cuda graphs" "$OUT"/k1_pipe_auto.log | tee -a "$OUT/k1_step_times.txt"
timeout 150 python3 experiments/gpu/probe_trainer_gap.py vit_large resnet152 128 14 2>&1 | grep -v -i warn \
  | tee "$OUT/probe_trainer_gap_vitl.txt"
