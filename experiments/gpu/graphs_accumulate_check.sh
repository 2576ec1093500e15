#!/usr/bin/env bash
# bash experiments/gpu/graphs_accumulate_check.sh   (one-H200 device machine, repository root; results under $OUT)
# After graphed stages add parameter gradients inside the backward graph (engine.graph_capture):
# 1. the graphed-stage and graphed-profile GPU tests (graphed vs eager gradients under 1F1B, M > K);
# 2. stage replays at micro-batch 16 and 32, where the host's per-parameter gradient launches showed;
# 3. the data path end to end with per-block throughput (experiments/bench_data_path.py);
# 4. the kernel probe of a mid-network ResNet-50 stage (experiments/gpu/probe_stage_kernels.py).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/replay" "$OUT/data_path"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
timeout 130 python3 -m pytest -q -p no:cacheprovider -p no:warnings --tb=short tests/unit/test_graphed_stage.py \
  tests/unit/test_profiler.py -k "graph" 2>&1 | tail -30 | tee "$OUT/pytest_graphs.txt"
timeout 150 python3 experiments/bench_stage_replay.py --ks 2,3,4 --micro 16,32 --iters 5 --repeats 4 \
  --out "$OUT/replay" 2>&1 | grep -v Warn | grep "stage\|rror" | tee "$OUT/replay_log.txt"
timeout 240 python3 experiments/bench_data_path.py --out-dir "$OUT/data_path" --cpu-workers 14 --gpu-workers '' \
  --split-workers '' --loader-batches 10 --e2e-workers 14 --e2e-decode cpu 2>&1 | grep -v "Warn\|warn" \
  | tee "$OUT/data_path_log.txt" | grep '"case"\|^|'
timeout 45 python3 experiments/gpu/probe_stage_kernels.py vit_base resnet50 128 12:13 6:11 2>&1 | grep -v Warn \
  | tee "$OUT/probe_stage_kernels.txt"
