#!/bin/bash
# One device call of a Gluon A/B experiment (one H100, a few minutes), repo root:
#   bash results/attention/ab_device.sh DIR TAG "CHECK ARGS" "BENCH ARGS"
# runs DIR/ab.py check CHECK ARGS, then, only if every case passed ("all ok"), DIR/ab.py bench BENCH ARGS, writing
# $OUT/gpu$TAG.txt (GPU, versions, date), $OUT/check${TAG}_h100.txt and $OUT/bench${TAG}_h100.txt. The experiments'
# own device*.sh name their arguments.
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=$1 TAG=$2
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee $OUT/gpu$TAG.txt
timeout 200 python $D/ab.py check $3 2>&1 | tee $OUT/check${TAG}_h100.txt | tail -3
grep -q "^all ok" $OUT/check${TAG}_h100.txt || { echo "check failed: no bench"; exit 1; }
timeout 330 python $D/ab.py bench $4 2>&1 | tee $OUT/bench${TAG}_h100.txt
