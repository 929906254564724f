#!/bin/bash
# Session 45: ncu of head dim 256, ours against cuDNN: the forward at 4K non-causal, then the backward at 4K.
set -u
FINAL=$OUT
for spec in "fwd:--forward --seqlen 4096:_fwd_4k" "bwd:--seqlen 4096:"; do
  IFS=: read name args tag <<< "$spec"
  mkdir -p $FINAL/$name
  OUT=$FINAL/$name HEAD_DIM=256 ARGS="$args" TAG="$tag" timeout 290 bash results/attention/gluon_bwd_profile/stalls.sh > $FINAL/$name/log.txt 2>&1
  tail -30 $FINAL/$name/log.txt
done
cd $FINAL && tar czf hd256_profile.tgz fwd bwd && rm -rf fwd bwd
