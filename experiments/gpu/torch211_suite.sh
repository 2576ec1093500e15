#!/usr/bin/env bash
# bash experiments/gpu/torch211_suite.sh   (one-H200 device machine, repository root; results under $OUT)
# The whole default test suite on the GPU image's torch (2.11), the lowest torch we test besides
# this repository's 2.14: first the GPU-marked tests alone on the H200 (so nothing else shares the
# card while their clocks run), then every other default test in pytest-xdist workers on the host's
# 16 cores (CPU ranks, gloo), verbose so each result is logged as it comes even if the call's limit
# cuts the run. Usage: torch211_suite.sh [seconds for the whole script] [xdist workers].
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
budget=${1:-540}   # seconds for the whole script; the call's limit is 600
start=$SECONDS
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], 'cuda', torch.cuda.is_available())" \
  | tee "$OUT/env.txt"
# tests/dist/test_analysis.py runs notebooks (nbformat, nbclient, ipykernel: not on the image).
skip="--ignore=tests/dist/test_analysis.py -p no:benchmark"
timeout 150 python3 -m pytest -q -p no:cacheprovider $skip -m "gpu and not long" -rs 2>&1 | tee "$OUT/pytest_gpu.txt"
left=$(( budget - (SECONDS - start) ))
timeout "$left" python3 -m pytest -p no:cacheprovider $skip -m "not gpu and not long" -n "${2:-10}" -v -rfE 2>&1 \
  | tee "$OUT/pytest_cpu.txt"
echo "exit ${PIPESTATUS[0]} after $(( SECONDS - start )) s" | tee -a "$OUT/pytest_cpu.txt"
