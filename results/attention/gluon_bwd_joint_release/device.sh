#!/bin/bash
# Session 46 (one H100, ~2 minutes), repo root: check, then the backward at 1K-16K, both masks, head dim 128.
#   bash results/attention/gluon_bwd_joint_release/device.sh
FLASH_AUTOTUNE=0 exec bash results/attention/ab_device.sh results/attention/gluon_bwd_joint_release _hd128 \
  "--head-dims 128" "--head-dims 128 --rounds 5"
