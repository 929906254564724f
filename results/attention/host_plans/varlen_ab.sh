# Same-process-kind A/B of session 50's @triton.jit plans on the GPU machine's host: BERT's varlen attention (and
# GPT-2's) eager and graphed, `bench_attention.py --model-shapes --providers ours sdpa_cudnn`, in alternating processes,
# PAIRS of each: this tree's kernels ("after") against eb70886's ("before", written into before_jit/). cuDNN in the same
# process is the yardstick for the host's speed at that moment. Usage (one GPU, ~1 min a process once the Triton cache
# is warm): bash results/attention/host_plans/varlen_ab.sh PAIRS
# Before the call, on the CPU machine (the device's git history is stale), write the earlier kernels; the device copies
# them with the working tree (untracked, not ignored):
#   mkdir -p results/attention/host_plans/before_jit && for f in flash launch blocksparse; do
#     git show eb70886:kernels/$f.py > results/attention/host_plans/before_jit/$f.py; done
set -e
D=results/attention/host_plans
test -f $D/before_jit/flash.py || { echo "before_jit/ missing: see the header"; exit 1; }
rm -rf /tmp/before_tree && mkdir -p /tmp/before_tree && cp -r kernels scripts /tmp/before_tree/
cp $D/before_jit/*.py /tmp/before_tree/kernels/
OUT_DIR=${OUT:-/tmp}/varlen_ab
mkdir -p $OUT_DIR
for r in $(seq 1 "$1"); do
  for side in after before; do
    dir=.; [ $side = before ] && dir=/tmp/before_tree
    echo "# pair $r, $side"
    (cd $dir && python scripts/bench_attention.py --model-shapes --providers ours sdpa_cudnn --rounds 1 \
       --out $OUT_DIR --tag ${side}_$r | grep -E "^## |^\| (ours|sdpa_cudnn) ")
  done
done
