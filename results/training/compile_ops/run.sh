# GPT-2 small compiled: the operators as torch.library.custom_op (shipped at the commit in shipped/) against
# kernels/ops.py's Library operators called from autograd Functions (this tree), and attn=sdpa, rows alternating.
# Usage (one H100, carry .whl and data/cache/embedded): bash results/training/compile_ops/run.sh ROUNDS [TESTS] [FIRST]
# FIRST=custom_op runs the shipped operators first in each round (the default runs this tree's first).
# Before the call, on the CPU machine (the device's git history is stale), write the shipped files and carry them:
#   mkdir -p results/training/compile_ops/shipped && for f in flash blocksparse; do
#     git show bdfb2d0:kernels/$f.py > results/training/compile_ops/shipped/$f.py; done
#   run(..., carry=[".whl", "data/cache/embedded", "results/training/compile_ops/shipped"])
set -e
test -f results/training/compile_ops/shipped/flash.py || { echo "shipped/ missing: see the header"; exit 1; }
pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
export WANDB_MODE=offline HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$PWD
rm -rf /tmp/shipped_tree && cp -r "$here" /tmp/shipped_tree
cp results/training/compile_ops/shipped/flash.py /tmp/shipped_tree/kernels/flash.py
cp results/training/compile_ops/shipped/blocksparse.py /tmp/shipped_tree/kernels/blocksparse.py
if [ -n "$2" ]; then
  FLASH_AUTOTUNE=0 python -m pytest -q -m gpu tests/test_compile.py tests/test_cuda_graph.py 2>&1 | tail -3
fi
bench() {  # folder, rows, tree
  (cd "$3" && python scripts/bench_training.py --rows "$2" --steps 60 --warmup 10 --row-timeout 150 \
     --out "$OUT/$1" 2>&1 | grep -E "^\| ours" || true)
}
for r in $(seq 1 "$1"); do
  date -u +%H:%M:%S
  if [ "$3" = custom_op ]; then
    bench "r${r}_custom_op" ours-flash-compile /tmp/shipped_tree
    bench "r${r}_ops" ours-flash-compile "$here"
  else
    bench "r${r}_ops" ours-flash-compile "$here"
    bench "r${r}_custom_op" ours-flash-compile /tmp/shipped_tree
  fi
  bench "r${r}_sdpa" ours-sdpa-compile "$here"
done
date -u +%H:%M:%S
