#!/usr/bin/env bash
# bash experiments/gpu/wire_check.sh   (one-H200 device machine, repository root; results under $OUT)
# After activations travel channels_last between stages (synapse.pipeline.wire):
# 1. the graphed-stage and graphed-profile GPU tests, the channels_last wire parameter included;
# 2. the stage replays of every K = 2, 3, 4 plan at micro-batch 16, 32, 64 and 128, fed in wire
#    format: graphed vs kernel time and the planner's prediction vs the graphed replay, per stage.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/replay"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -p no:warnings --tb=short \
  tests/unit/test_graphed_stage.py tests/unit/test_profiler.py -k "graph" 2>&1 | tail -30 | tee "$OUT/pytest_graphs.txt"
timeout ${REPLAY_TIMEOUT:-400} python3 experiments/bench_stage_replay.py --ks 2,3,4 --iters 5 --repeats 4 \
  --out "$OUT/replay" 2>&1 | grep -v Warn | grep "stage\|rror" | tee "$OUT/replay_log.txt"
