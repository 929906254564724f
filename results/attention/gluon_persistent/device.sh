#!/bin/bash
# The persistent Gluon forward on one H100, one call (~4-6 minutes), from the repo root:
#   bash results/attention/gluon_persistent/device.sh
# 1. check: outputs against the shipped Gluon forward (a hang here is a barrier-phase bug: the timeout ends it and
#    the bench does not run); 2. bench: forward times of shipped / persistent configs / cuDNN (and the autotuned
#    @triton.jit forward at head dim 64 up to 2K), 3 alternating rounds. Autotuning is on (FLASH_AUTOTUNE unset).
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_persistent
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python $D/persistent.py check 2>&1 | tee $OUT/check_h100.txt || { echo "check failed or hung"; exit 1; }
timeout 360 python $D/persistent.py bench 2>&1 | tee $OUT/bench_h100.txt
