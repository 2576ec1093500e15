# Sourced by the K = 1 scripts (graphs.sh, k1_and_step_gap.sh): the user's command for ViT-L/16 ->
# ResNet-152 @128 on synthetic data, and `run NAME OVERRIDES...`, which runs it into /tmp/k1_NAME and
# appends its throughput (experiments/gpu/step_times.py) to $OUT/k1_step_times.txt. Its log and its
# block_calibration events go to $OUT/k1_logs/ (the device tool returns at most 8 files from $OUT:
# the calling script tars that folder at its end).
# Set K1_WORKERS and K1_STEPS before sourcing to change the loader workers and the steps.
python3 -c "
import torch; from synapse.models import build_model; torch.manual_seed(0)
torch.save(build_model('vit_large', 100, 3, 224).state_dict(), '/tmp/vitl.pt')"
common="trainer=gpu injection=none teacher=vit_large student=resnet152 data=synthetic data.batch_size=128 \
  data.num_workers=${K1_WORKERS:-8} teacher.checkpoint=/tmp/vitl.pt trainer.progress=false checkpoint.at_epoch_end=false \
  checkpoint.every=0 trainer.eval_every_epochs=100 report=false trainer.max_steps=${K1_STEPS:-60}"
run() {  # name, overrides...
  local name=$1; shift
  mkdir -p "$OUT/k1_logs"
  timeout 300 python3 train.py $common "$@" hydra.run.dir=/tmp/k1_$name > "$OUT/k1_logs/$name.log" 2>&1
  python3 experiments/gpu/step_times.py "$name" /tmp/k1_$name/metrics.jsonl 10 | tee -a "$OUT/k1_step_times.txt"
  grep -h '"block_calibration"' /tmp/k1_$name/failover_events.jsonl 2>/dev/null | head -3 > "$OUT/k1_logs/${name}_calibration.jsonl"
}
