#!/usr/bin/env bash
# The one-GPU user command before and after the one run path (issue #32), interleaved in one call:
#   before: the single-device trainer that `trainer=gpu` on one device took (code of cb367a2, in .before/)
#   after:  the same command through the supervised pipeline runtime (K = 1, graphed, failover on)
# Usage (device tool, repository root, .whl and .before carried):
#   git archive cb367a2 synapse train.py | tar -x -C .before      # the code before, once
#   bash experiments/gpu/one_run_path.sh PAIR REPEATS STEPS     # PAIR: vitb (ViT-B/16 -> ResNet-50) | vitl
#   SKIP_WARM_BEFORE=1: no uncounted first run of the old code (to fit ViT-L in one 10-minute call)
# Throughput: images over wall-clock time between the records of steps WARM and STEPS-5 (run stamps).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
PAIR=${1:-vitb}; REPEATS=${2:-3}; STEPS=${3:-80}; WARM=16
case $PAIR in
  vitb) T=vit_base; S=resnet50 ;;
  vitl) T=vit_large; S=resnet152 ;;
esac
export SYNAPSE_CACHE=/tmp/synapse_cache
python3 -c "
import torch; from synapse.models import build_model; torch.manual_seed(0)
torch.save(build_model('$T', 100, 3, 224).state_dict(), '/tmp/teacher_$T.pt')"
common="trainer=gpu injection=none teacher=$T student=$S data=synthetic data.batch_size=128 data.image_size=224 \
  teacher.checkpoint=/tmp/teacher_$T.pt trainer.progress=false checkpoint.at_epoch_end=false checkpoint.every=0 \
  trainer.eval_every_epochs=100 report=false trainer.max_steps=$STEPS"
rate() {  # run dir -> images/s between the records of steps WARM and STEPS-5
  python3 - "$1/metrics.jsonl" <<PY
import json, sys
recs = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"}
a, b = $WARM, $STEPS - 5
print(f"{(b - a) * 128 / (recs[b]['time'] - recs[a]['time']):.1f}" if a in recs and b in recs else "nan")
PY
}
run() {  # name, which (before|after), round
  local dir=/tmp/run_${PAIR}_$1_$3
  rm -rf "$dir"  # a warm machine keeps /tmp: a fresh run refuses a directory holding another run's checkpoints
  if [ "$2" = before ]; then
    (cd .before && timeout 280 python3 train.py $common hydra.run.dir=$dir > "$OUT/$1_$3.log" 2>&1)
  else
    timeout 280 python3 train.py $common hydra.run.dir=$dir > "$OUT/$1_$3.log" 2>&1
  fi
  echo "$PAIR $2 round=$3 rc=$? img_per_s=$(rate $dir)" | tee -a "$OUT/one_run_path_$PAIR.txt"
}
# A first run of each fills the profile and cuDNN caches (not counted), then the rounds alternate.
run warm_after after 0 > /dev/null; [ "${SKIP_WARM_BEFORE:-0}" = 1 ] || run warm_before before 0 > /dev/null
for r in $(seq 1 "$REPEATS"); do run before before "$r"; run after after "$r"; done
tail -c 3000 "$OUT/after_1.log" > "$OUT/after_tail.txt"
rm -f "$OUT"/*_0.log "$OUT"/before_*.log "$OUT"/after_[2-9].log
