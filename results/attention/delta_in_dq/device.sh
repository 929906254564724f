#!/bin/bash
# delta_in_dq on one H100, one call (~6-8 minutes), from the repo root; outputs packed into $OUT/delta_in_dq.tgz.
#   [ONLY_TESTS=1] bash results/attention/delta_in_dq/device.sh
# 1. The GPU kernel tests with the patch (FLASH_AUTOTUNE=0), 2. the A/B: ab.py without / with the patch, alternating,
# two rounds each (autotuned; the first round of each also tunes), 3. host_profile/breakdown.py without / with.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/delta_in_dq
W=/tmp/delta_in_dq
mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
git apply $D/delta_in_dq.patch || exit 1
FLASH_AUTOTUNE=0 timeout 250 python -m pytest -q -m gpu tests/test_flash.py tests/test_blocksparse.py tests/test_compile.py \
  tests/test_padding.py 2>&1 | tail -15 \
  | tee $W/gpu_tests.txt
git apply -R $D/delta_in_dq.patch
if [ "${ONLY_TESTS:-0}" = 1 ]; then tar czf $OUT/delta_in_dq.tgz -C /tmp delta_in_dq; exit 0; fi  # the A/B ran in session 33
for round in 1 2; do
  python $D/ab.py --tag before 2>&1 | grep '^{' | tee -a $W/ab.jsonl
  git apply $D/delta_in_dq.patch && python $D/ab.py --tag after 2>&1 | grep '^{' | tee -a $W/ab.jsonl
  git apply -R $D/delta_in_dq.patch
done
python results/attention/host_profile/breakdown.py > $W/breakdown_before.txt 2>&1
git apply $D/delta_in_dq.patch && python results/attention/host_profile/breakdown.py > $W/breakdown_after.txt 2>&1
git apply -R $D/delta_in_dq.patch
tar czf $OUT/delta_in_dq.tgz -C /tmp delta_in_dq
