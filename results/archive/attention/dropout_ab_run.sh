#!/bin/bash
# The one device call behind results/attention/dropout_ab_gpt2.*, d128_causal_512.* and
# results/training/flash_dropout/ (run from the repo root on the lent H100, carry: .whl data/cache/bench_corpus).
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
L=$OUT/all.log
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u
  echo "== 1. GPU tests"
  FLASH_AUTOTUNE=0 timeout 130 python -m pytest -q -x -m gpu tests/test_flash.py tests/test_blocksparse.py
  echo "== 2. dropout A/B microbenchmark"; date -u
  timeout 190 python scripts/bench_attention.py --dropout-ab philox1 philox4 --out $OUT --tag dropout_ab_gpt2
  echo "== 3. training rows"; date -u
  PYTHONPATH=.whl/site_train timeout 220 python scripts/bench_training.py --data-dir data/cache/bench_corpus \
    --data-source corpus --steps 40 --warmup 10 --row-timeout 100 --rows ours-sdpa,ours-flash,ours-flash-philox1 \
    --out $OUT/training
  echo "== 4. d128 causal 512 re-measure (512 first, then 1024, then 512 again)"; date -u
  timeout 60 python scripts/bench_attention.py --seqlens 512 1024 512 --hdims 128 --causal yes \
    --providers ours sdpa_flash --no-memory --no-gpt2 --out $OUT --tag d128_causal_512
  rm -f $OUT/*.csv $OUT/*.png; date -u
} > $L 2>&1
tail -c 6000 $L
