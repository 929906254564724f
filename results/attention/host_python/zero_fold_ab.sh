# The dQ zero-fill inside the delta launch (session 44, eaf632c) against the memset before it (627850f), on the H100's
# host: host_time.py at 1,024 tokens (the Gluon backward), compiled and eager, alternating processes.
# Usage (one H100, ~3 minutes for 2 pairs): bash results/attention/host_python/zero_fold_ab.sh PAIRS
# Before the call, on the CPU machine (the device's git history is stale), write the earlier files and carry them:
#   mkdir -p results/attention/host_python/before && for f in flash flash_gluon; do
#     git show 627850f:kernels/$f.py > results/attention/host_python/before/$f.py; done
#   run(..., carry=["results/attention/host_python/before"])
set -e
test -f results/attention/host_python/before/flash.py || { echo "before/ missing: see the header"; exit 1; }
rm -rf /tmp/before_tree && mkdir -p /tmp/before_tree && cp -r kernels results /tmp/before_tree/
cp results/attention/host_python/before/flash.py results/attention/host_python/before/flash_gluon.py \
  /tmp/before_tree/kernels/
nvidia-smi --query-gpu=name --format=csv,noheader
for r in $(seq 1 "$1"); do
  for mode in "" --eager; do
    FLASH_AUTOTUNE=0 python results/training/compile_ops/host_time.py --seqlen 1024 $mode --label zero_in_delta
    (cd /tmp/before_tree && FLASH_AUTOTUNE=0 python results/training/compile_ops/host_time.py --seqlen 1024 $mode \
      --label memset)
  done
done
