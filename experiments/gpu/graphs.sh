#!/usr/bin/env bash
# bash experiments/gpu/graphs.sh   (one-H200 device machine, repository root; results under $OUT)
# CUDA-graphed stages (synapse.pipeline.graphs):
# 1. the GPU tests: graphed vs eager gradients under 1F1B with M > K, the too-few-slots control;
# 2. the user's command, ViT-L/16 -> ResNet-152 @128 on synthetic data: the single-device trainer
#    vs K = 1 through the pipeline runtime (M = 1, 2, 4; graphs on and off), 60 steps each,
#    step time medians over steps 11-60 with quartiles (experiments/gpu/step_times.py).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/unit/test_graphed_stage.py 2>&1 | tail -6 \
  | tee "$OUT/pytest_graphed_stage.txt"
source experiments/gpu/k1_runs.sh
run single pipeline.microbatches=1
run pipe_m1_graphs pipeline.microbatches=1 pipeline.cuda_graphs=true
run pipe_m1_eager pipeline.microbatches=1 pipeline.cuda_graphs=false
run pipe_m4_graphs pipeline.microbatches=4 pipeline.cuda_graphs=true
run pipe_m4_eager pipeline.microbatches=4 pipeline.cuda_graphs=false
tar czf "$OUT/k1_logs.tgz" -C "$OUT" k1_logs && rm -r "$OUT/k1_logs"
