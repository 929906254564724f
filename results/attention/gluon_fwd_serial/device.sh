#!/bin/bash
# Prepared in session 46 (one H100, ~3 minutes), repo root: the check (float64, serial64 bit-identical to shipped),
# then the forward at 1K-16K, both masks, every form and cuDNN's (writes gpu.txt, check_h100.txt, bench_h100.txt):
#   bash results/attention/gluon_fwd_serial/device.sh
FLASH_AUTOTUNE=0 exec bash results/attention/ab_device.sh results/attention/gluon_fwd_serial "" "" "--rounds 5"
