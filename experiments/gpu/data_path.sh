#!/usr/bin/env bash
# bash experiments/gpu/data_path.sh   (on the one-H200 device machine, repository root; results under $OUT)
# 1. the data-path tests on that machine's torch, including the nvJPEG-vs-libjpeg comparison (marked gpu);
# 2. experiments/bench_data_path.py: the loader alone per decode placement and worker count, then
#    train.py vs a resident-data eager loop for ViT-L/16 -> ResNet-152 (synthetic, JPEG) and
#    ViT-B/16 -> ResNet-50 (JPEG), batch 128. About 5 minutes on an H200 with 16 CPU cores.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, torchvision, timm, sys; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'timm', timm.__version__, 'python', sys.version.split()[0])"
  nproc
} 2>&1 | tee "$OUT/env_data_path.txt"

timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/unit/test_data_path.py 2>&1 | tail -8 \
  | tee "$OUT/pytest_data_path.txt"

timeout 450 python3 experiments/bench_data_path.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench_data_path.txt"
