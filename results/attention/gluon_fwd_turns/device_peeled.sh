#!/bin/bash
# Session 39's fifth call (one H100, ~3 minutes), repo root: the shipped loop without the mask branch under
# KEYS_DOWN, checked and timed causal at head dims 64 and 128 (is KEYS_DOWN now worth it at 128 too?)
#   bash results/attention/gluon_fwd_turns/device_peeled.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_turns
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu_peeled.txt
timeout 200 python $D/ab.py check 2>&1 | tee $OUT/check_peeled_h100.txt | tail -2
grep -q "^all ok" $OUT/check_peeled_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 300 python $D/ab.py bench --causal-only --rounds 5 2>&1 | tee $OUT/bench_peeled_h100.txt
