#!/usr/bin/env bash
# bash experiments/gpu/h200_validate.sh   (on the one-H200 device machine; results under $OUT)
# 1. the pipeline equivalence and runtime tests on that machine's torch (2.11), CPU ranks (gloo);
# 2. K = 1 through the pipeline runtime on the GPU (NCCL, bf16), vit_base -> resnet50;
# 3. the single-device trainer's KD throughput against a hand-written loop, same models.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, timm, sys; print('torch', torch.__version__, 'timm', timm.__version__, 'python', sys.version.split()[0])"
} 2>&1 | tee "$OUT/env.txt"

timeout 420 python3 -m pytest -q -p no:cacheprovider tests/dist/test_pipeline_equivalence.py \
  tests/dist/test_pipeline_runtime.py 2>&1 | tail -15 | tee "$OUT/pytest_torch211.txt"

python3 - <<'PY'
import torch
from synapse.models import build_model
torch.manual_seed(0)
torch.save(build_model("vit_base", 100, 3, 224).state_dict(), "/tmp/vit_base_teacher.pt")
PY
timeout 300 python3 train.py trainer=gpu teacher=vit_base student=resnet50 \
  data=synthetic data.batch_size=64 data.num_workers=8 data.synthetic_train_size=4096 pipeline.microbatches=4 \
  teacher.checkpoint=/tmp/vit_base_teacher.pt trainer.max_steps=40 trainer.progress=false \
  checkpoint.at_epoch_end=false run_dir=/tmp/run_k1_gpu 2>&1 | tail -20 | tee "$OUT/k1_pipeline_gpu.txt"
cp /tmp/run_k1_gpu/performance.jsonl "$OUT/k1_pipeline_gpu_performance.jsonl" 2>/dev/null

timeout 420 python3 experiments/bench_kd_throughput.py --teacher vit_base --student resnet50 --image-size 224 \
  --batch 64 --device cuda --precision bf16 --steps 20 --segments 5 \
  --out "$OUT/bench_kd_throughput_h200.json" 2>&1 | tail -25 | tee "$OUT/bench_kd_throughput_h200.txt"
