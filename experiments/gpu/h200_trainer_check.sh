#!/usr/bin/env bash
# bash experiments/gpu/h200_trainer_check.sh   (one-H200 device machine; results under $OUT)
# After the trainer became a composition (runner + checkpointer + evaluation):
# 1. exactness on that machine's torch (2.11), CPU ranks: pipeline equivalence and failover tests;
# 2. the user's single-device command on the GPU, a checkpoint, and resume=auto from it;
# 3. K = 1 through the pipeline runtime on the GPU (NCCL), with a checkpoint and resume=auto.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
timeout 400 python3 -m pytest -q -p no:cacheprovider tests/dist/test_pipeline_equivalence.py tests/dist/test_failover.py \
  2>&1 | tail -8 | tee "$OUT/pytest_torch211_exactness.txt"
python3 - <<'PY'
import torch
from synapse.models import build_model
torch.manual_seed(0)
torch.save(build_model("vit_base", 100, 3, 224).state_dict(), "/tmp/vit_base_teacher.pt")
PY
common="trainer=gpu injection=none teacher=vit_base student=resnet50 data=synthetic data.batch_size=64 \
  data.num_workers=8 data.synthetic_train_size=4096 teacher.checkpoint=/tmp/vit_base_teacher.pt \
  trainer.progress=false checkpoint.at_epoch_end=false report=false"
for path in single pipeline; do
  extra=""; [ $path = pipeline ] && extra=" pipeline.microbatches=4"
  timeout 240 python3 train.py $common $extra trainer.max_steps=20 trainer.stop_after=12 checkpoint.every=6 \
    hydra.run.dir=/tmp/run_$path 2>&1 | tail -4 | tee "$OUT/${path}_first.txt"
  timeout 240 python3 train.py $common $extra trainer.max_steps=20 checkpoint.every=6 resume=auto \
    hydra.run.dir=/tmp/run_$path 2>&1 | tail -4 | tee "$OUT/${path}_resumed.txt"
  ls /tmp/run_$path/checkpoints | tee -a "$OUT/${path}_resumed.txt"
done
