#!/bin/bash
# Prepared in session 39 (one H100, ~4 minutes), repo root: NAMED_TURNS and MASK_REL checked (bit-identical to the
# shipped form), then the forward timed, head dims 64 and 128, both masks, 1K-16K, every form and cuDNN's
#   bash results/attention/gluon_fwd_named/device.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_named
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu.txt
timeout 120 python $D/ab.py check 2>&1 | tee $OUT/check_h100.txt | tail -2
grep -q "^all ok" $OUT/check_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 330 python $D/ab.py bench --rounds 5 2>&1 | tee $OUT/bench_h100.txt
