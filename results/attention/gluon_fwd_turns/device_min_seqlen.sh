#!/bin/bash
# Session 39's call (one H100, ~5 minutes), repo root: the head-dim-64 forms checked (the per-tile grid included), the
# causal forms timed again, then min_seqlen.py (writes gpu_min_seqlen.txt, check_keys_down2_h100.txt,
# bench_keys_down2_h100.txt, min_seqlen_h100.txt)
#   bash results/attention/gluon_fwd_turns/device_min_seqlen.sh
set -u -o pipefail
bash results/attention/ab_device.sh results/attention/gluon_fwd_turns _keys_down2 "--head-dims 64" \
  "--causal-only --head-dims 64 --seqlens 1024 2048 4096 8192 16384 --rounds 5" || exit 1
mv $OUT/gpu_keys_down2.txt $OUT/gpu_min_seqlen.txt
timeout 250 python results/attention/gluon_fwd_turns/min_seqlen.py 2>&1 | tee $OUT/min_seqlen_h100.txt | cut -c1-400
