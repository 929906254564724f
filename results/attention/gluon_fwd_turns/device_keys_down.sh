#!/bin/bash
# The third forward-turns call (one H100, ~3 minutes), repo root: the key tiles in descending order (KEYS_DOWN),
# with and without EXP_TURNS, causal, head dims 64 and 128
#   bash results/attention/gluon_fwd_turns/device_keys_down.sh
# writes gpu_keys_down.txt, check_keys_down_h100.txt and bench_keys_down_h100.txt to $OUT; the bench runs only if
# every check case passes. Then, for the profile of the forms (one call each, ~1 minute):
#   PROVIDERS=ours ARGS="--forward --causal --seqlen 2048 --fwd-flags KEYS_DOWN=1" TAG=_fwd_c2k_down \
#     bash results/attention/gluon_bwd_profile/stalls.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_fwd_turns
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu_keys_down.txt
timeout 200 python $D/ab.py check 2>&1 | tee $OUT/check_keys_down_h100.txt | tail -2
grep -q "^all ok" $OUT/check_keys_down_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 200 python $D/ab.py bench --causal-only --rounds 5 2>&1 | tee $OUT/bench_keys_down_h100.txt
