#!/bin/bash
# The pipelined backward's first GPU run, one H100, from the repo root (one call, ~3-4 minutes):
#   bash results/attention/gluon_bwd_pipeline/device.sh
# pipeline_bwd.py check at head dim 64 (dK, dV bit for bit against the shipped Gluon backward, dQ within 2^-7), then,
# if every case passes, its bench against the shipped backward. Each step's output is written as it comes.
set -u -o pipefail
export PYTHONUNBUFFERED=1 FLASH_AUTOTUNE=0
D=results/attention/gluon_bwd_pipeline
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
timeout 120 python $D/pipeline_bwd.py check --head-dims 64 > $OUT/check_h100.txt 2>&1
tail -2 $OUT/check_h100.txt
grep -q "check: 0 case" $OUT/check_h100.txt || { grep -v '"ok": true' $OUT/check_h100.txt | tail -20; exit 1; }
timeout 200 python $D/pipeline_bwd.py bench --head-dims 64 --seqlens 1024 2048 4096 16384 --rounds 3 --rep 20 \
  > $OUT/bench_h100.txt 2>&1
cut -c1-260 $OUT/bench_h100.txt
