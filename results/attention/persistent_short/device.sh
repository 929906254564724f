#!/bin/bash
# One H100 call (~4 min), from the repo root: ab.py from the checkout before session 34 (838f71a, unpacked into
# .ab_before by `git archive 838f71a kernels scripts train | tar -x -C .ab_before` beforehand) and from this one,
# alternating, two rounds each.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/persistent_short
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for round in 1 2; do
  python $D/ab.py --root .ab_before --tag before 2>&1 | grep '^{' | tee -a $OUT/ab.jsonl | cut -c1-200
  python $D/ab.py --root . --tag after 2>&1 | grep '^{' | tee -a $OUT/ab.jsonl | cut -c1-200
done
