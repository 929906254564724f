#!/bin/bash
# Second profile (after profile.sh): where the head-dim-64 backward's warps stall, instruction by instruction, ours
# against cuDNN's, non-causal, one H100 (one call, ~3 minutes), repo root:
#   bash results/attention/gluon_bwd_profile/stalls.sh      (PROVIDERS="pp64" for ../gluon_bwd_pp64's kernel;
#   HEAD_DIM=128 for head dim 128, its files named *_hd128; ARGS="--forward --causal --seqlen 2048" TAG=_fwd_c2k
#   for drive.py's other calls, their files named *$TAG)
# profile.sh's run showed neither the tensor pipe (42%) nor L1/shared memory (64%) saturated; this one reads the
# stall reasons (warp state, PC sampling) and the scheduler statistics, per kernel and per SASS instruction.
# Only the kernels between drive.py's cudaProfilerStart and Stop are profiled (--profile-from-start off).
set -u -o pipefail
export PYTHONUNBUFFERED=1 FLASH_AUTOTUNE=0
D=results/attention/gluon_bwd_profile
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
ncu --version | tail -1 | tee -a $OUT/gpu.txt
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section WarpStateStats --section SchedulerStats --section SourceCounters --section LaunchStats"
HD=${HEAD_DIM:-64}
SUFFIX=$([ "$HD" = 64 ] || echo _hd$HD)${TAG:-}
ARGS=${ARGS:-}
for provider in ${PROVIDERS:-ours cudnn}; do
  python $D/drive.py $provider --time --head-dim $HD $ARGS | tee -a $OUT/times$SUFFIX.txt
  timeout 240 ncu -f --clock-control none --profile-from-start off --launch-count 20 $SECTIONS \
    --import-source no -o /tmp/$provider python $D/drive.py $provider --head-dim $HD $ARGS > /tmp/ncu_$provider.log 2>&1
  tail -3 /tmp/ncu_$provider.log
  ncu -i /tmp/$provider.ncu-rep --page details --print-details all > $OUT/stalls_$provider$SUFFIX.txt 2>&1
  # per-instruction SASS with the sampled stall reasons of the largest kernel only (ours: _bwd_kernel)
  ncu -i /tmp/$provider.ncu-rep --page source --csv --print-source sass > /tmp/sass_$provider.csv 2>&1
  gzip -c /tmp/sass_$provider.csv > $OUT/sass_$provider$SUFFIX.csv.gz
  ls -la /tmp/sass_$provider.csv /tmp/$provider.ncu-rep
done
grep -E "^  [A-Za-z_].*\(|Duration|Stall|stall|Issued Warp|Eligible|Active Warps Per Scheduler" $OUT/stalls_*.txt | head -80
