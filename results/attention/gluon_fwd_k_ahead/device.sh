#!/bin/bash
# Session 45 (one H100, ~5 minutes), repo root: K_AHEAD (and NAMED_TURNS at head dim 256) checked bit-identical to
# the shipped form at head dims 256, 128 and 64, then the forward timed at 1K-16K, both masks, every form and cuDNN's
# (writes gpu.txt, check_h100.txt, bench_h100.txt)
#   bash results/attention/gluon_fwd_k_ahead/device.sh
exec bash results/attention/ab_device.sh results/attention/gluon_fwd_k_ahead "" "--head-dims 256 128 64" \
  "--head-dims 256 128 64 --rounds 5"
