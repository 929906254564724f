#!/bin/bash
# The persistent backward's ship run, one H100 call (~5 minutes), from the repo root, with the checkout before it
# unpacked first: rm -rf .ab_before && mkdir .ab_before && git archive 492083b kernels scripts train | tar -x -C .ab_before
# 1. ship.patch applied: the GPU tests of test_flash_gluon, test_flash, test_compile, test_padding (FLASH_AUTOTUNE=0);
# 2. ../persistent_short/ab.py, the old checkout against the patched one, alternating, graphed and eager.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_bwd_persistent
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
git apply $D/ship.patch || exit 1
FLASH_AUTOTUNE=0 timeout 330 python -m pytest -q -m gpu tests/test_flash_gluon.py tests/test_flash.py \
  tests/test_compile.py tests/test_padding.py 2>&1 | tail -15 | tee $OUT/gpu_tests_h100.txt
S="64:1024:0 64:2048:0 64:2048:1 64:4096:1 128:2048:0 128:2048:1 256:2048:0 256:2048:1"
for round in 1 2; do
  python results/attention/persistent_short/ab.py --root .ab_before --tag before --rounds 2 --shapes $S 2>&1 \
    | grep '^{' | tee -a $OUT/ab_h100.jsonl | cut -c1-120
  python results/attention/persistent_short/ab.py --root . --tag after --rounds 2 --shapes $S 2>&1 \
    | grep '^{' | tee -a $OUT/ab_h100.jsonl | cut -c1-120
done
git apply -R $D/ship.patch
