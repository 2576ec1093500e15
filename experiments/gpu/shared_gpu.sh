#!/usr/bin/env bash
# K = 3 ranks on the one H200 (trainer.shared_gpu, issue #37 item 1): the multi-GPU code paths
# (graphs per in-flight slot on several ranks, CUDA clocks read late, GPU checkpoints through DCP,
# live re-partition of GPU stages, DEGRADE and REPLACE) where one GPU is all there is.
# Usage (device tool, repository root, .whl carried; results under $OUT):
#   bash experiments/gpu/shared_gpu.sh tests     # the CPU equivalence and failover tests, every rank on GPU 0
#   bash experiments/gpu/shared_gpu.sh story     # ViT-B/16 -> ResNet-50 through train.py: slowdown + live
#                                                # REPLAN, a kill + DEGRADE, a REPLACE with a spare, resume=auto
#   bash experiments/gpu/shared_gpu.sh replicas  # layouts (issue #34): tests/dist/test_replicas.py and
#                                                # test_live_rebalance.py and test_live_replan_replicas.py on GPU ranks,
#                                                # then ViT-B/16 -> ResNet-50 as 2 x 2 with a kill (a replica
#                                                # dropped). (A slow replica cannot be shown here: ranks that
#                                                # share a GPU take turns on it, so one rank's slowdown shows
#                                                # on every rank's clock; SCENARIOS=rebalance runs it anyway.)
# Throughput on a shared GPU means nothing (the ranks take turns on it); what is checked is what happens.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"

tests() {
  # The same tests as on CPU ranks, fp32 and deterministic kernels, bit for bit (tests/dist/helpers.py).
  SYNAPSE_TEST_SHARED_GPU=0 SYNAPSE_CACHE=/tmp/cache_tests timeout "${1:-540}" python3 -m pytest -p no:cacheprovider \
    -n 0 -v -rfE -p no:benchmark tests/dist/test_pipeline_equivalence.py tests/dist/test_failover.py \
    tests/dist/test_repartition_transfer.py 2>&1 | tail -n 80 | tee "$OUT/pytest_shared_gpu.txt"
}

story() {
  export SYNAPSE_CACHE=/tmp/cache_story
  mkdir -p $SYNAPSE_CACHE/profiles && cp experiments/results/profiles_h200/profiles/* $SYNAPSE_CACHE/profiles/ 2>/dev/null
  python3 -c "
import torch; from synapse.models import build_model; torch.manual_seed(0)
torch.save(build_model('vit_base', 100, 3, 224).state_dict(), '/tmp/teacher_vitb.pt')"
  # partition=even: on a shared GPU the planner prices each boundary as host copies and gloo, and
  # puts nearly all of ResNet-50 on rank 0 (its early activations cost more to send than to compute);
  # the story needs rank 2 to hold work.
  local common="trainer=shared_gpu trainer.devices=3 teacher=vit_base student=resnet50 data=synthetic
    data.batch_size=96 data.image_size=224 pipeline.microbatches=6 teacher.checkpoint=/tmp/teacher_vitb.pt
    trainer.progress=false trainer.eval_every_epochs=100 report=false partition=even monitor.period_s=1"
  scenario() {  # name, timeout, overrides...
    local name=$1 limit=$2; shift 2
    local dir=/tmp/story_$name; rm -rf "$dir"
    timeout "$limit" python3 train.py $common hydra.run.dir="$dir" "$@" > "$OUT/story_$name.log" 2>&1
    echo "== $name rc=$?" | tee -a "$OUT/story.txt"
    # graphed stages: a shape that could not be captured says so in its rank's log
    echo "  eager fallbacks logged: $(cat "$dir"/logs/*/* 2>/dev/null | grep -c 'cuda graphs: ')" | tee -a "$OUT/story.txt"
    python3 - "$dir" <<'PY' | tee -a "$OUT/story.txt"
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
summary = json.loads((run / "experiment_summary.json").read_text()) if (run / "experiment_summary.json").exists() else {}
print("steps", summary.get("steps"), "of", summary.get("total_steps"))
for s in summary.get("segments", []):
    print("  segment", s.get("index", s.get("segment")), s.get("reason"), "devices", s.get("devices"), "steps",
          s.get("start_step"), "->", s.get("end_step"), s.get("outcome"))
for d in summary.get("decisions", []):
    print("  decision at step", d.get("step"), d.get("action"), {k: round(v, 1) for k, v in (d.get("eta_s") or {}).items()})
events = [json.loads(l) for l in (run / "failover_events.jsonl").read_text().splitlines() if l.strip()] \
    if (run / "failover_events.jsonl").exists() else []
for e in events:
    if e.get("event") in ("slowdown_detected", "fault_injected", "graphs_captured", "graph_capture_failed",
                          "worker_failed", "rank_hung"):
        print("  event", e.get("event"), "step", e.get("step"), "rank", e.get("rank"),
              {k: e[k] for k in ("kind", "factor", "reason", "slots") if k in e})
PY
  }
  want() { [[ ",${SCENARIOS:-slowdown,kill,replace,resume}," == *",$1,"* ]]; }
  # 1. The default failover story: rank 2 three times slower from step 30, the ETA policy, a live REPLAN.
  want slowdown && scenario slowdown 240 trainer.max_steps=120 policy=eta failover.replan_mode=live \
    "injection.faults=[{kind:slow_compute,rank:2,start:30,factor:3.0}]"
  # 2. A rank killed: DEGRADE to the two survivors from the last checkpoint.
  want kill && scenario kill 200 trainer.max_steps=60 checkpoint.every=20 injection.name=kill "injection.faults=[{kind:kill,rank:1,step:40}]"
  # 3. REPLACE: device 2 swapped for the spare (device 3, a fourth rank on the same GPU).
  want replace && scenario replace 200 trainer.max_steps=60 injection=none "trainer.spare_devices=[3]" "failover.drills=[{step:30,action:replace,device:2}]"
  # 4. resume=auto: a launch stopped at step 30, then resumed to its end.
  want resume || return 0
  scenario resume_first 150 trainer.max_steps=60 trainer.stop_after=30 injection=none
  local dir=/tmp/story_resume_first
  timeout 150 python3 train.py $common hydra.run.dir="$dir" trainer.max_steps=60 injection=none resume=auto \
    > "$OUT/story_resume.log" 2>&1
  echo "== resume rc=$? $(grep -o 'resum[^,]*step [0-9]*' "$OUT/story_resume.log" | head -1)" | tee -a "$OUT/story.txt"
  python3 -c "import json; s=json.load(open('$dir/experiment_summary.json')); print('steps', s['steps'], 'of', s['total_steps'])" \
    | tee -a "$OUT/story.txt"
}

replicas() {
  # DDP's all-reduce over gloo on CUDA tensors (gloo reduces GPU tensors, it cannot send them point to point)
  SYNAPSE_TEST_SHARED_GPU=0 SYNAPSE_CACHE=/tmp/cache_replicas timeout "${1:-420}" python3 -m pytest -p no:cacheprovider \
    -n 0 -v -rfE -p no:benchmark tests/dist/test_replicas.py tests/dist/test_live_rebalance.py tests/dist/test_live_replan_replicas.py \
    ${REPLICA_TESTS:+-k "$REPLICA_TESTS"} > /tmp/replicas.txt 2>&1
  grep -E "PASSED|FAILED|^E |largest difference|passed|failed" /tmp/replicas.txt | tee "$OUT/pytest_replicas_shared_gpu.txt"
  export SYNAPSE_CACHE=/tmp/cache_story
  mkdir -p $SYNAPSE_CACHE/profiles && cp experiments/results/profiles_h200/profiles/* $SYNAPSE_CACHE/profiles/ 2>/dev/null
  [ -f /tmp/teacher_vitb.pt ] || python3 -c "
import torch; from synapse.models import build_model; torch.manual_seed(0)
torch.save(build_model('vit_base', 100, 3, 224).state_dict(), '/tmp/teacher_vitb.pt')"
  local common="trainer=shared_gpu teacher=vit_base student=resnet50 data=synthetic data.image_size=224
    teacher.checkpoint=/tmp/teacher_vitb.pt trainer.progress=false trainer.eval_every_epochs=100 report=false
    partition=even monitor.period_s=1 data.batch_size=64 pipeline.microbatches=2"
  layout() {  # name, timeout, overrides...
    local name=$1 limit=$2; shift 2
    local dir=/tmp/layout_$name; rm -rf "$dir"
    timeout "$limit" python3 train.py $common hydra.run.dir="$dir" "$@" > "$OUT/layout_$name.log" 2>&1
    echo "== $name rc=$?" | tee -a "$OUT/replicas.txt"
    grep -h "failover:\|pipeline:\|distilled" "$OUT/layout_$name.log" | tee -a "$OUT/replicas.txt"
    python3 -c "
import json, pathlib
for p in sorted(pathlib.Path('$dir/segments').glob('*/segment.json')):
    s = json.loads(p.read_text()); print('  segment', s['index'], s['reason'], s['devices'], 'replicas', s.get('replicas', 1),
          'shares', s.get('shares'), 'steps', s['start_step'], '->', s['end_step'], s['outcome'])" | tee -a "$OUT/replicas.txt"
    python3 -c "
import json
for line in open('$dir/performance.jsonl').readlines()[::5]:
    r = json.loads(line); print('  step', r['step'], 'compute', [round(c, 4) for c in r['compute_s']], 'step', round(r['step_seconds'], 4))
" | tee -a "$OUT/replicas.txt"
  }
  want() { [[ ",${SCENARIOS:-kill}," == *",$1,"* ]]; }
  want kill && layout kill 300 trainer.devices=4 trainer.replicas=2 trainer.max_steps=60 checkpoint.every=20 \
    "injection.faults=[{kind:kill,rank:3,step:45}]"
  want rebalance && layout rebalance 300 trainer.devices=2 trainer.replicas=2 trainer.max_steps=60 policy=rebalance \
    "injection.faults=[{kind:slow_compute,rank:1,start:2,factor:3.0}]"
}

host_copies() {  # what leaving the GPU costs: pageable against pinned host memory (synapse/pipeline/wire.py)
  python3 experiments/gpu/probe_host_copies.py "$OUT" 2>&1 | tail -n 12 | tee "$OUT/host_copies.txt"
}

probe() {
  # The start probe (issue #33) on GPU ranks: its tests with every rank on GPU 0, then its cost in a
  # real launch: one GPU (ViT-L/16 -> ResNet-152 @128, the user's command) and K = 3 ranks sharing it.
  SYNAPSE_TEST_SHARED_GPU=0 SYNAPSE_CACHE=/tmp/cache_probe timeout "${1:-300}" python3 -m pytest -p no:cacheprovider \
    -n 0 -v -rfE -p no:benchmark tests/dist/test_start_probe.py > /tmp/probe.txt 2>&1
  grep -E "PASSED|FAILED|SKIPPED|^E |passed|failed" /tmp/probe.txt | tee "$OUT/pytest_start_probe_shared_gpu.txt"
  export SYNAPSE_CACHE=/tmp/cache_story
  mkdir -p $SYNAPSE_CACHE/profiles && cp experiments/results/profiles_h200/profiles/* $SYNAPSE_CACHE/profiles/ 2>/dev/null
  python3 -c "
import os, torch; from synapse.models import build_model
for name, path in (('vit_base', '/tmp/teacher_vitb.pt'), ('vit_large', '/tmp/teacher_vitl.pt')):
    if not os.path.exists(path):
        torch.manual_seed(0); torch.save(build_model(name, 100, 3, 224).state_dict(), path)"
  cost() {  # name, overrides...: the start_probe event of a 20-step launch
    local name=$1; shift; local dir=/tmp/probe_$name; rm -rf "$dir"
    timeout 240 python3 train.py hydra.run.dir="$dir" data=synthetic trainer.max_steps=20 trainer.progress=false \
      trainer.eval_every_epochs=100 report=false injection=none "$@" > "$OUT/probe_$name.log" 2>&1
    echo "== $name rc=$?" | tee -a "$OUT/probe_cost.txt"
    grep -h '"start_probe"' "$dir/failover_events.jsonl" | tee -a "$OUT/probe_cost.txt"
  }
  cost one_gpu_vitl_r152 trainer=gpu teacher=vit_large student=resnet152 data.batch_size=128 data.image_size=224 \
    teacher.checkpoint=/tmp/teacher_vitl.pt
  cost shared_gpu_k3 trainer=shared_gpu trainer.devices=3 teacher=vit_base student=resnet50 data.batch_size=96 \
    data.image_size=224 pipeline.microbatches=6 partition=even teacher.checkpoint=/tmp/teacher_vitb.pt
}

for part in ${1:-tests}; do "$part"; done  # e.g. "tests story"; a scenario alone: SCENARIOS=slowdown,replace
