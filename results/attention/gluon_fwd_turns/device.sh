#!/bin/bash
# The forward-turns experiment's device call (one H100, ~3-4 minutes), repo root:
#   bash results/attention/gluon_fwd_turns/device.sh
# writes gpu.txt, check_h100.txt and bench_h100.txt to $OUT; the bench runs only if every check case passes.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_turns
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format=%h 2>/dev/null; date -u; } | tee $OUT/gpu.txt
timeout 200 python $D/ab.py check 2>&1 | tee $OUT/check_h100.txt | tail -4
grep -q "^all ok" $OUT/check_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 330 python $D/ab.py bench --rounds 5 2>&1 | tee $OUT/bench_h100.txt
