#!/bin/bash
# The second forward-turns call (one H100, ~2-3 minutes), repo root: the causal variants at head dim 64
#   bash results/attention/gluon_fwd_turns/device_causal.sh
# writes gpu_causal.txt, check_causal_h100.txt and bench_causal_h100.txt to $OUT; the bench runs only if every check
# case passes.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_turns
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu_causal.txt
timeout 120 python $D/ab.py check --head-dims 64 2>&1 | tee $OUT/check_causal_h100.txt | tail -2
grep -q "^all ok" $OUT/check_causal_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 90 python $D/ab.py bench --head-dims 64 --causal-only --rounds 3 2>&1 | tee $OUT/bench_causal_h100.txt
