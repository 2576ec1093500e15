#!/usr/bin/env bash
# PARTS=smoke,throughput bash experiments/gpu/multigpu_validate.sh [extra bench_multigpu.py args]
# (on a machine with 2+ GPUs; results under $OUT, default ./gpu_out). Runs experiments/bench_multigpu.py
# for the given parts, then packs each run's records (no checkpoints, no weights) into runs_<parts>.tgz.
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
GPUS=${GPUS:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
PARTS=${PARTS:-smoke,throughput,kill,failover}
TAG=${PARTS//,/_}
nvidia-smi topo -m > "$OUT/topology_$TAG.txt" 2>&1
python3 experiments/bench_multigpu.py --gpus "$GPUS" --parts "$PARTS" --out "$OUT/mg" "$@" 2>&1 | tee "$OUT/bench_$TAG.txt"
cd "$OUT/mg" || exit 1
find runs -type d \( -name checkpoints -o -name resume -o -name teacher_training \) -prune -exec rm -rf {} + 2>/dev/null
find runs -name '*.pt' -delete 2>/dev/null
tar -czf "$OUT/runs_$TAG.tgz" runs train_output.log && rm -rf runs cache train_output.log
mv ./*.json "$OUT/" 2>/dev/null
ls -la "$OUT"
