#!/bin/bash
# The same A/B as device.sh at head dim 256 (512-2K) and head dim 128 causal 16K: where the forward keeps one work
# unit a program, the restructured kernel should time as before (one H100 call, ~3 min).
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/persistent_short
S="256:512:1 256:512:0 256:1024:1 256:2048:1 128:16384:1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for round in 1 2; do
  python $D/ab.py --root .ab_before --tag before --shapes $S 2>&1 | grep '^{' | tee -a $OUT/ab_hd256.jsonl | cut -c1-150
  python $D/ab.py --root . --tag after --shapes $S 2>&1 | grep '^{' | tee -a $OUT/ab_hd256.jsonl | cut -c1-150
done
