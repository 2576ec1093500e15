#!/usr/bin/env bash
# bash experiments/gpu/graphs_recheck.sh   (one-H200 device machine; results under $OUT)
# After the ResNet capture fix and the StageGraphs refactor: the graphed-stage and graphed-profile
# GPU tests, then the stage replays of every K = 2, 3, 4 plan (predicted vs measured per stage).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, torchvision, timm; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'timm', timm.__version__)"
} 2>&1 | tee "$OUT/env.txt"
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider --tb=short tests/unit/test_graphed_stage.py \
  tests/unit/test_profiler.py 2>&1 | tail -25 | tee "$OUT/pytest_graphs.txt"
timeout ${REPLAY_TIMEOUT:-330} python3 experiments/bench_stage_replay.py --ks 2,3,4 --iters 5 --repeats 4 \
  --out "$OUT/stage_replay" 2>&1 | grep -v Warn | grep "stage\|Error\|rror" | tail -80
