#!/bin/bash
# Session 39's fourth step (one H100, ~3 minutes), repo root: PEEL_MASK (with KEYS_DOWN, the loop's tiles unmasked
# at compile time), with and without the exponentials' turns, head dim 64 causal
#   bash results/attention/gluon_fwd_turns/device_peel.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_turns
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu_peel.txt
timeout 200 python $D/ab.py check --head-dims 64 2>&1 | tee $OUT/check_peel_h100.txt | tail -2
grep -q "^all ok" $OUT/check_peel_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 300 python $D/ab.py bench --causal-only --head-dims 64 --rounds 5 2>&1 | tee $OUT/bench_peel_h100.txt
