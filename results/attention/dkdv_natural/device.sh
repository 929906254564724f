#!/bin/bash
# The natural-orientation dK/dV on one H100, in up to five device calls (each well inside 600 s). Run from the repo root.
#   bash results/attention/dkdv_natural/device.sh ab       # ab.py: the dK/dV kernel, shipped vs natural (~6-8 min)
#   bash results/attention/dkdv_natural/device.sh tests    # integrate.patch applied: the GPU kernel tests; and
#                                                          #   the parity run's bf16 gradient-error check (~4 min)
#   bash results/attention/dkdv_natural/device.sh gpt2     # GPT-2 small bench_training, eager: shipped flash, then
#                                                          #   patched flash / sdpa / flash, and with the fused bwd
#   bash results/attention/dkdv_natural/device.sh gpt2c    # the same, compiled: patched flash and sdpa
#   bash results/attention/dkdv_natural/device.sh blocksparse   # block-sparse vs Flex, shipped then patched (~6 min)
# `gpt2` and `gpt2c` need the hydra-core / omegaconf / antlr4 wheels in .whl and data/cache/embedded (prepared on
# the CPU machine), both carried. integrate.patch: kernels/flash.py's _dkdv_tile takes the queries-as-rows form for
# tiles with at least as many queries as keys at head dims up to 128 (probe_hd.txt), (128, 64, 8, 2) joins the
# dK/dV and fused candidates, and a CPU test checks both forms against each other; the CPU kernel tests pass with
# it (188 passed). Each call starts from the committed tree: the patch is applied within the call.
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
  FLASH_AUTOTUNE=0 timeout 240 python -m pytest -q -m gpu tests/test_flash.py tests/test_blocksparse.py 2>&1 \
    | tail -30 | tee $OUT/gpu_tests_integrated_h100.txt
  # again with a fixed dK/dV tile of as many queries as keys at head dim <= 64: the queries-as-rows form, dense
  PYTHONPATH=$D FLASH_AUTOTUNE=0 timeout 200 python -m pytest -q -p fixed_natural -m gpu tests/test_flash.py 2>&1 \
    | tail -30 | tee $OUT/gpu_tests_integrated_fixed_natural_h100.txt ;;
blocksparse)  # its dK/dV tile is 64 x 64 at head dim 64 (queries as rows under the patch), 64 x 128 above (unchanged)
  S="python scripts/bench_blocksparse.py --seqlens 4096 16384 --hdims 64 128 --densities --providers ours flex"
  $S --out $OUT --tag shipped 2>&1 | tail -12
  git apply $D/integrate.patch || exit 1
  $S --out $OUT --tag natural 2>&1 | tail -12 ;;
gpt2|gpt2c)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
  B="python scripts/bench_training.py --steps 30 --warmup 10 --row-timeout 140"
  if [ $1 = gpt2 ]; then  # eager: shipped flash, then patched flash / sdpa / flash, then patched with the fused bwd
    $B --rows ours-flash --out $OUT/shipped 2>&1 | tail -4
    git apply $D/integrate.patch || exit 1
    $B --rows ours-flash,ours-sdpa,ours-flash --out $OUT/natural 2>&1 | tail -6
    FLASH_FUSED_DROPOUT_BWD=1 $B --rows ours-flash --out $OUT/natural_fused 2>&1 | tail -4
  else  # compiled, patched
    git apply $D/integrate.patch || exit 1
    $B --rows ours-flash-compile,ours-sdpa-compile --out $OUT/natural_compile 2>&1 | tail -5
  fi ;;
*) echo "usage: $0 ab|tests|gpt2|gpt2c|blocksparse"; exit 2 ;;
esac
