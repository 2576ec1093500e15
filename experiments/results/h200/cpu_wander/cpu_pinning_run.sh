#!/usr/bin/env bash
# bash experiments/gpu/cpu_pinning.sh   (the H200 device machine's 16 idle cores, repository root; results under $OUT)
# Do CPU ranks drift less when each has cores of its own (trainer.pin_cores)? The demo models on
# 3 CPU ranks (one thread each), fault-free, policy=keep so that nothing re-plans, alternating
# unpinned (pin_cores=false) and pinned (pin_cores=null: on this host every rank gets its own core);
# then the injection members whose first detection came before their fault here, pinned.
# cpu_pinning.md: experiments/cpu_rank_wander.py over every run; cpu_pinning.tgz: their records.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/pin"
export SYNAPSE_CACHE=/tmp/synapse_cache PYTHONUNBUFFERED=1
STEPS=${STEPS:-600}; REPEATS=${REPEATS:-3}
run() {  # name, overrides...
  local name=$1; shift
  local start=$SECONDS
  timeout 240 python3 train.py "$@" report=false hydra.run.dir=/tmp/pin_$name > "$OUT/pin/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/cpu_pinning.txt"
  mkdir -p "$OUT/pin/$name"
  cp /tmp/pin_$name/{failover_events.jsonl,performance.jsonl,config.yaml} "$OUT/pin/$name/" 2>/dev/null
  cp -r /tmp/pin_$name/logs "$OUT/pin/$name/" 2>/dev/null
  python3 experiments/cpu_rank_wander.py /tmp/pin_$name | tail -n +3 | tee -a "$OUT/cpu_pinning.md"
  tar czf "$OUT/cpu_pinning.tgz" -C "$OUT" pin  # as we go: a time-out keeps what finished
}
python3 experiments/cpu_rank_wander.py --help > /dev/null || exit 1
python3 experiments/cpu_rank_wander.py /dev/null 2>/dev/null | head -2 > "$OUT/cpu_pinning.md"
cpu3="trainer.accelerator=cpu trainer.devices=3"
for i in $(seq 1 "$REPEATS"); do
  run "free_$i" $cpu3 trainer.max_steps=$STEPS injection=none policy=keep trainer.pin_cores=false
  run "pinned_$i" $cpu3 trainer.max_steps=$STEPS injection=none policy=keep
done
for policy in keep eta; do  # each member's documented command
  run "demo_${policy}_pinned" policy=$policy
  run "background_load_${policy}_pinned" $cpu3 trainer.max_steps=120 injection=background_load policy=$policy
done
rm -r "$OUT/pin"
