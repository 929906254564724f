#!/bin/bash
# Prepared in session 39 (one H100, ~4 minutes), repo root: NAMED_TURNS and MASK_REL checked (bit-identical to the
# shipped form), then the forward timed, head dims 64 and 128, both masks, 1K-16K, every form and cuDNN's (writes
# gpu.txt, check_h100.txt, bench_h100.txt)
#   bash results/attention/gluon_fwd_named/device.sh
exec bash results/attention/ab_device.sh results/attention/gluon_fwd_named "" "" "--rounds 5"
