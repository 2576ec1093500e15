#!/usr/bin/env bash
# bash experiments/gpu/graphs_check.sh   (one-H200 device machine; results under $OUT)
# After graphed profiles: the GPU tests, K = 1 runs with graphs (M = 1, 4, auto), the stage replays.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
python3 - <<'PY' | tee "$OUT/torch_1f1b_warmup.txt"
import inspect, torch
from torch.distributed.pipelining import Schedule1F1B
src = inspect.getsource(Schedule1F1B._step_microbatches)
print(torch.__version__, [l.strip() for l in src.splitlines() if "warmup_chunks" in l or "_num_stages -" in l][:4])
PY
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/unit/test_graphed_stage.py \
  tests/unit/test_profiler.py -k "graphed or pipeline_runtime or slot or eager" 2>&1 | tail -15 | tee "$OUT/pytest_graphs.txt"
python3 -c "
import torch; from synapse.models import build_model; torch.manual_seed(0)
torch.save(build_model('vit_large', 100, 3, 224).state_dict(), '/tmp/vitl.pt')"
common="trainer=gpu injection=none teacher=vit_large student=resnet152 data=synthetic data.batch_size=128 \
  data.num_workers=8 teacher.checkpoint=/tmp/vitl.pt trainer.progress=false checkpoint.at_epoch_end=false \
  checkpoint.every=0 trainer.eval_every_epochs=100 report=false trainer.max_steps=60"
for m in ${MICROBATCHES:-1 4 auto}; do
  timeout 200 python3 train.py $common pipeline.microbatches=$m hydra.run.dir=/tmp/k1_m$m > "$OUT/k1_graphs_m$m.log" 2>&1
  python3 experiments/gpu/step_times.py "pipeline K=1 graphs M=$m" /tmp/k1_m$m/metrics.jsonl 10 | tee -a "$OUT/k1_step_times.txt"
done
grep -h "microbatches=auto\|cuda graphs" "$OUT"/k1_graphs_m*.log | tee -a "$OUT/k1_step_times.txt"
timeout ${REPLAY_TIMEOUT:-290} python3 experiments/bench_stage_replay.py --ks 2,3,4 --iters 5 --repeats 4 \
  --out "$OUT/stage_replay" 2>&1 | grep -v Warn | grep "stage\|Error" | tail -80
