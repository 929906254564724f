#!/bin/bash
# SPLIT_M on one H100, run from the repo root; each mode one call, well inside 600 s; outputs packed into
# $OUT/<mode>.tgz (a call brings back at most 8 files). split_m.patch is applied within the call.
#   bash results/attention/fwd_split_m/device.sh ab      # hd 64 forward, 512-2K, causal and not, ours (and Flex at
#                                                        # 1K): the committed kernel, then patched, in one process each
#   bash results/attention/fwd_split_m/device.sh tests   # the GPU kernel tests, patched; again with SPLIT_M forced
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/fwd_split_m
W=/tmp/split_$1
mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
case $1 in
ab)
  A="python scripts/bench_attention.py --seqlens 512 1024 2048 --hdims 64 --causal both --providers ours flex
     --flex-seqlens 1024 --modes fwd --no-memory --no-gpt2 --rounds 3"
  $A --out $W --tag before 2>&1 | grep -E "^\| (512|1024|2048) "
  git apply $D/split_m.patch || exit 1
  $A --out $W --tag after 2>&1 | grep -E "^\| (512|1024|2048) " ;;
tests)
  git apply $D/split_m.patch || exit 1
  FLASH_AUTOTUNE=0 timeout 250 python -m pytest -q -m gpu tests/test_flash.py 2>&1 | tail -20 | tee $W/gpu_tests.txt
  PYTHONPATH=$D FLASH_AUTOTUNE=0 timeout 250 python -m pytest -q -p force_split_m -m gpu tests/test_flash.py 2>&1 \
    | tail -20 | tee $W/gpu_tests_forced.txt ;;
*) echo "usage: $0 ab|tests"; exit 2 ;;
esac
tar czf $OUT/$1.tgz -C /tmp split_$1
