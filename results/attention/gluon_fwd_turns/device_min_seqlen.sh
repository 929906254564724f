#!/bin/bash
# Session 39's call (one H100, ~5 minutes), repo root: the shipped KEYS_DOWN checked (every form, the per-tile grid
# included), the causal forms timed again (a second run of bench_keys_down_h100.txt), then min_seqlen.py
#   bash results/attention/gluon_fwd_turns/device_min_seqlen.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_turns
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu_min_seqlen.txt
timeout 150 python $D/ab.py check --head-dims 64 2>&1 | tee $OUT/check_keys_down2_h100.txt | tail -2
grep -q "^all ok" $OUT/check_keys_down2_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 150 python $D/ab.py bench --causal-only --head-dims 64 --seqlens 1024 2048 4096 8192 16384 --rounds 5 \
  2>&1 | tee $OUT/bench_keys_down2_h100.txt
timeout 250 python $D/min_seqlen.py 2>&1 | tee $OUT/min_seqlen_h100.txt | cut -c1-400
