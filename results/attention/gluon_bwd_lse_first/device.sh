#!/bin/bash
# Prepared in session 46 (one H100, ~2 minutes), repo root: the check (float64; dK, dV bit-identical to shipped), then
# the backward at 1K-16K, both masks, every form and cuDNN's, head dim 128 (writes gpu_hd128.txt,
# check_hd128_h100.txt, bench_hd128_h100.txt):
#   bash results/attention/gluon_bwd_lse_first/device.sh
FLASH_AUTOTUNE=0 exec bash results/attention/ab_device.sh results/attention/gluon_bwd_lse_first _hd128 \
  "--head-dims 128" "--head-dims 128 --rounds 5"
