#!/bin/bash
# One device call (one H100, ~4 minutes), repo root: bash results/attention/gluon_bwd_split128/device.sh
# writes gpu.txt, check_h100.txt and bench_h100.txt to $OUT; the bench runs only if every check case passes.
set -u -o pipefail
export FLASH_AUTOTUNE=0 PYTHONUNBUFFERED=1
D=results/attention/gluon_bwd_split128
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu.txt
timeout 200 python $D/split128.py check 2>&1 | tee $OUT/check_h100.txt | tail -3
grep -q "^all ok" $OUT/check_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 330 python $D/split128.py bench --rounds 3 2>&1 | tee $OUT/bench_h100.txt
