#!/bin/bash
# Nsight Compute on the head-dim-64 backward, ours against cuDNN's, one H100 (one call, ~3-5 minutes), repo root:
#   bash results/attention/gluon_bwd_profile/profile.sh
# The question (results/attention/gluon_bwd_pipeline/README.md): is the shipped Gluon backward's tile loop limited by
# shared-memory bandwidth (~210 KB a tile pair by count) rather than by exposed latency? The sections read: speed of
# light (SM, memory, L1/shared throughput), compute workload (tensor pipe utilisation), memory workload (shared
# memory wavefronts, bank conflicts) and warp state (stall reasons). --clock-control none: the device notes say to
# leave the clocks alone. Only the kernels of the one call inside drive.py's NVTX range "profiled" are profiled.
# Each report goes to $OUT as text, with the un-profiled do_bench times in times.txt.
set -u -o pipefail
export PYTHONUNBUFFERED=1 FLASH_AUTOTUNE=0
D=results/attention/gluon_bwd_profile
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
ncu --version | tail -1 | tee -a $OUT/gpu.txt
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section LaunchStats --section Occupancy"
for causal in "" "--causal"; do
  for provider in ours cudnn; do
    tag=$provider${causal:+_causal}
    python $D/drive.py $provider $causal --time | tee -a $OUT/times.txt
    timeout 200 ncu --clock-control none --nvtx --nvtx-include "profiled/" --launch-count 20 $SECTIONS \
      python $D/drive.py $provider $causal > $OUT/ncu_$tag.txt 2>&1
    grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|L1/TEX Cache Throughput|Memory Throughput" \
      $OUT/ncu_$tag.txt | head -12
  done
done
