# Host time per compiled step of 12 tiny attention layers, this tree (kernels/ops.py operators) against the shipped
# custom_op operators, alternating processes. Usage (one H100): bash results/training/compile_ops/host_time.sh PAIRS
# Before the call, on the CPU machine (the device's git history is stale), write the shipped files and carry them:
#   mkdir -p results/training/compile_ops/shipped && for f in flash blocksparse; do
#     git show bdfb2d0:kernels/$f.py > results/training/compile_ops/shipped/$f.py; done
#   run(..., carry=[".whl", "data/cache/embedded", "results/training/compile_ops/shipped"])
set -e
test -f results/training/compile_ops/shipped/flash.py || { echo "shipped/ missing: see the header"; exit 1; }
here=$PWD
rm -rf /tmp/shipped_tree && mkdir -p /tmp/shipped_tree && cp -r kernels results /tmp/shipped_tree/
cp results/training/compile_ops/shipped/flash.py /tmp/shipped_tree/kernels/flash.py
cp results/training/compile_ops/shipped/blocksparse.py /tmp/shipped_tree/kernels/blocksparse.py
nvidia-smi --query-gpu=name --format=csv,noheader
for r in $(seq 1 "$1"); do
  FLASH_AUTOTUNE=0 python results/training/compile_ops/host_time.py --label ops
  (cd /tmp/shipped_tree && FLASH_AUTOTUNE=0 python results/training/compile_ops/host_time.py --label custom_op)
done
