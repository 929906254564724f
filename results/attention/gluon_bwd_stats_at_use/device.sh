#!/bin/bash
# The stats-at-use experiment's device call (one H100, ~3-4 minutes), repo root: both forms checked, then timed
# (writes gpu.txt, check_h100.txt, bench_h100.txt)
#   bash results/attention/gluon_bwd_stats_at_use/device.sh
FLASH_AUTOTUNE=0 exec bash results/attention/ab_device.sh results/attention/gluon_bwd_stats_at_use "" "" "--rounds 5"
