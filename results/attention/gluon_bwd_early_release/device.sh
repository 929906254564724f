#!/bin/bash
# Prepared in session 45 (one H100, ~5 minutes), repo root: STATS_FIRST and EARLY_RELEASE checked against float64 and
# the shipped form (dK, dV bit-identical), then the backward timed at head dims 256 and 128, 1K-16K, both masks,
# every form and cuDNN's (writes gpu.txt, check_h100.txt, bench_h100.txt)
#   bash results/attention/gluon_bwd_early_release/device.sh
FLASH_AUTOTUNE=0 exec bash results/attention/ab_device.sh results/attention/gluon_bwd_early_release "" "" "--rounds 5"
