#!/bin/bash
# Prepared in session 32, run in session 35 (README.md, calling_thread_h100/). One H100, one call (~6 minutes), from
# the repo root, carrying .whl (hydra-core, omegaconf, antlr4 wheels) and data/cache/embedded (`python -c "from
# train.data import prepare_embedded; prepare_embedded('data/cache/embedded')"`):
#   bash results/attention/host_profile/calling_thread.sh
# The question: does a training step gain from running its backward on the calling thread instead of autograd's
# device thread? breakdown_threads_h100.txt measured our attention's eager forward+backward at 656 -> 350 us with
# that change, SDPA's at 197 -> 190. GPT-2 small eager, micro-batch 4 (host-bound) and 16 (the benchmark's,
# GPU-bound), calling_thread.patch applied (FLASH_BACKWARD_ON_CALLING_THREAD=1 turns it on), invocations
# alternating. Ship a `backward_on_calling_thread` option (or make it the default) only if micro-batch 4 gains beyond
# the spread of its repeats and micro-batch 16 loses nothing. One tarball comes back: $OUT/calling_thread.tgz.
set -u -o pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
W=/tmp/calling_thread
mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
git apply results/attention/host_profile/calling_thread.patch || exit 1
run() {  # run <micro-batch> <rows> <0|1> <tag>
  FLASH_BACKWARD_ON_CALLING_THREAD=$3 timeout 170 python scripts/bench_training.py --rows $2 --batch $1 --steps 40 \
    --warmup 10 --row-timeout 80 --out $W/$4 2>&1 | grep -E "^\| ours|Error|rror" | tail -4
}
n=0
for thread in 0 1 0 1; do
  n=$((n + 1)); run 4 ours-flash,ours-sdpa $thread b4_run${n}_calling${thread}
done
for thread in 0 1; do
  n=$((n + 1)); run 16 ours-flash $thread b16_run${n}_calling${thread}
done
tar czf $OUT/calling_thread.tgz -C /tmp calling_thread
