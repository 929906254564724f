#!/bin/bash
# The persistent backward's ship run on one H100, from the repo root, two calls of ~5 minutes:
#   bash results/attention/gluon_bwd_persistent/device.sh ship        # 1. and 2.
#   bash results/attention/gluon_bwd_persistent/device.sh min_seqlen  # 3.
#   bash results/attention/gluon_bwd_persistent/device.sh hd128       # 4. (~3 minutes; needs no patch)
# 1. ship.patch applied: the GPU tests of test_flash_gluon, test_flash, test_compile, test_padding (FLASH_AUTOTUNE=0);
# 2. ../persistent_short/ab.py, the checkout before the patch against the patched one, alternating, graphed and eager
#    (unpack the old one first: rm -rf .ab_before && mkdir .ab_before && git archive HEAD kernels scripts train |
#    tar -x -C .ab_before, with HEAD the commit the patch applies to);
# 3. min_seqlen.py with the patch: the Gluon backward against the @triton.jit one at head dim 64, 512-2K;
# 4. the experiment's own kernel at head dim 128 with 64-key tiles and two K/V buffers (persistent_bwd.py VARIANTS):
#    its check, then its bench against the shipped backward.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_bwd_persistent
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ "${1:-}" = hd128 ]; then
  FLASH_AUTOTUNE=0 timeout 150 python $D/persistent_bwd.py check 2>&1 | tee $OUT/check_h100_s35.txt | tail -2
  grep -q "check: 0 case" $OUT/check_h100_s35.txt && FLASH_AUTOTUNE=0 timeout 200 python $D/persistent_bwd.py bench \
    --head-dims 128 2>&1 | tee $OUT/bench_h100_hd128_s35.txt | cut -c1-240
  exit 0
fi
git apply $D/ship.patch || exit 1
case ${1:-} in
ship)
  FLASH_AUTOTUNE=0 timeout 330 python -m pytest -q -m gpu tests/test_flash_gluon.py tests/test_flash.py \
    tests/test_compile.py tests/test_padding.py 2>&1 | tail -15 | tee $OUT/gpu_tests_h100.txt
  S="64:1024:0 64:2048:0 64:2048:1 64:4096:1 128:2048:0 128:2048:1 256:2048:0 256:2048:1"
  for round in 1 2; do  # the "before" process imports everything from .ab_before
    python results/attention/persistent_short/ab.py --root .ab_before --tag before --rounds 2 --shapes $S 2>&1 \
      | grep '^{' | tee -a $OUT/ab_h100.jsonl | cut -c1-120
    python results/attention/persistent_short/ab.py --root . --tag after --rounds 2 --shapes $S 2>&1 \
      | grep '^{' | tee -a $OUT/ab_h100.jsonl | cut -c1-120
  done ;;
min_seqlen)
  timeout 500 python $D/min_seqlen.py 2>&1 | tee $OUT/min_seqlen_h100.txt | cut -c1-200 ;;
*) echo "usage: $0 ship|min_seqlen|hd128"; git apply -R $D/ship.patch; exit 2 ;;
esac
git apply -R $D/ship.patch
