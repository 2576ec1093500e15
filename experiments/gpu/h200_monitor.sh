#!/usr/bin/env bash
# bash experiments/gpu/h200_monitor.sh   (on a 1-GPU machine; results under $OUT, default ./gpu_out)
# 1. The pipeline equivalence and failover tests on this machine's torch (CPU ranks, gloo).
# 2. A KD run on the GPU (vit_base -> resnet50, synthetic 224 px, bf16, batch 256; a 1-stage pipeline so the
#    failover controller watches it) with the NVML health monitor sampling every second, and a
#    background load (2 separate processes looping 8192^2 bf16 matmuls on the same GPU) from
#    step 120: the detector must see the slowdown; its latency is in failover_events.jsonl.
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
python3 -c "import torch, timm, pynvml; print('torch', torch.__version__, 'timm', timm.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/versions.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
[ "${SKIP_TESTS:-0}" = 1 ] || timeout 420 python3 -m pytest -x -q -p no:cacheprovider tests/dist/test_pipeline_equivalence.py tests/dist/test_failover.py \
    > "$OUT/equivalence_tests.txt" 2>&1; echo "pytest exit $?" >> "$OUT/equivalence_tests.txt"
RUN="$OUT/kd_bgload"
# Batch 256 in 2 micro-batches keeps the GPU busy (83% utilisation alone): with small micro-batches
# the run is bound by kernel launches and a contending process finds idle SMs and slows nothing.
timeout 500 python3 train.py hydra.run.dir="$RUN" trainer=gpu "trainer.devices=[0]" \
    teacher=vit_base student=resnet50 teacher.auto_train_epochs=0 data=synthetic data.image_size=224 \
    data.batch_size=256 data.synthetic_train_size=8192 data.num_workers=8 pipeline.microbatches=2 partition=even \
    trainer.max_steps=240 trainer.eval_every_epochs=100 \
    "injection.faults=[{kind:background_load,rank:0,start:120,workers:2,matrix_size:8192}]" injection.name=gpu_bgload \
    monitor.period_s=1 trainer.progress=false report=false > "$OUT/kd_bgload.txt" 2>&1
echo "train exit $?" >> "$OUT/kd_bgload.txt"
rm -rf "$RUN/checkpoints" "$RUN/teacher_training" "$RUN/segments"/*/resume
tar -czf "$OUT/kd_bgload.tgz" -C "$OUT" kd_bgload && rm -rf "$RUN"
