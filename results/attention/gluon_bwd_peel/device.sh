#!/bin/bash
# Session 39's backward call (one H100, ~5 minutes), repo root: PEEL_DIAG checked at head dims 64, 128 and 256
# (causal), then the causal backward timed at head dims 64 and 128, 1K-32K, against the shipped form and cuDNN's
#   bash results/attention/gluon_bwd_peel/device.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_bwd_peel
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu.txt
timeout 200 python $D/ab.py check --head-dims 64 128 256 2>&1 | tee $OUT/check_h100.txt | tail -3
grep -q "^all ok" $OUT/check_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 330 python $D/ab.py bench --rounds 5 2>&1 | tee $OUT/bench_h100.txt
