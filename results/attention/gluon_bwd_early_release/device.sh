#!/bin/bash
# Prepared in session 45 (one H100, ~5 minutes a head dim), repo root: every form checked against float64 and the
# shipped form (dK, dV bit-identical), then the backward timed at 1K-16K, both masks, every form and cuDNN's (writes
# gpu_hdN.txt, check_hdN_h100.txt, bench_hdN_h100.txt). Head dim 256 first (the one-slot ring), then 128 and 64:
#   bash results/attention/gluon_bwd_early_release/device.sh 256
#   bash results/attention/gluon_bwd_early_release/device.sh 128
#   bash results/attention/gluon_bwd_early_release/device.sh 64
HD=${1:?head dim}
FLASH_AUTOTUNE=0 exec bash results/attention/ab_device.sh results/attention/gluon_bwd_early_release _hd$HD \
  "--head-dims $HD" "--head-dims $HD --rounds 5"
