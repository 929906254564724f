#!/bin/bash
# The natural-orientation dK/dV on one H100, in three device calls (each well inside 600 s). Run from the repo root.
#   bash results/attention/dkdv_natural/device.sh ab       # ab.py: the dK/dV kernel, shipped vs natural (~6-8 min)
#   bash results/attention/dkdv_natural/device.sh tests    # integrate.patch applied: the GPU kernel tests; and
#                                                          #   the parity run's bf16 gradient-error check (~4 min)
#   bash results/attention/dkdv_natural/device.sh gpt2     # GPT-2 small bench_training, shipped then patched (~7 min)
# `gpt2` needs the hydra-core / omegaconf / antlr4 wheels in .whl and data/cache/embedded (prepared on the CPU
# machine), both carried. integrate.patch is kernels/flash.py with _dkdv_tile in the natural form and (128, 64, 8, 2)
# among the dK/dV tuning candidates; its CPU kernel tests pass (186 passed under TRITON_INTERPRET=1).
set -u -o pipefail
D=results/attention/dkdv_natural
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case $1 in
ab)
  python $D/ab.py 2>&1 | tee $OUT/ab_h100.txt ;;
tests)
  python results/training/gpt2_parity_quiet/grad_error.py --seeds 3 2>&1 | tee $OUT/grad_error_h100.txt
  git apply $D/integrate.patch || exit 1
  FLASH_AUTOTUNE=0 timeout 400 python -m pytest -q -m gpu tests/test_flash.py tests/test_blocksparse.py 2>&1 \
    | tail -30 | tee $OUT/gpu_tests_integrated_h100.txt ;;
gpt2)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
  python scripts/bench_training.py --rows ours-flash,ours-sdpa --steps 30 --warmup 10 --row-timeout 70 \
    --out $OUT/shipped 2>&1 | tail -8
  git apply $D/integrate.patch || exit 1
  python scripts/bench_training.py --rows ours-flash,ours-sdpa,ours-flash,ours-flash-compile,ours-sdpa-compile \
    --steps 30 --warmup 10 --row-timeout 140 --out $OUT/natural 2>&1 | tail -12 ;;
*) echo "usage: $0 ab|tests|gpt2"; exit 2 ;;
esac
