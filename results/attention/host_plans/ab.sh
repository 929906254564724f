# Host time of the plans per call geometry (kernels/flash.py `_gluon_fwd_plan` / `_gluon_bwd_plan`, kernels/launch.py
# `Prepared`) against the tree before them (8d237f3's flash.py, flash_gluon.py and launch.py, in before/), on the GPU
# machine's host: results/attention/host_profile/host_profile.py in alternating processes, PAIRS of each, with dropout
# 0.1 (the Gluon backward, the @triton.jit forward) and 0 (both Gluon).
# Usage (one GPU, ~45 s a process): bash results/attention/host_plans/ab.sh PAIRS
# Before the call, on the CPU machine (the device's git history is stale), write the earlier files; the device copies
# them with the working tree (untracked, not ignored):
#   mkdir -p results/attention/host_plans/before && for f in flash flash_gluon launch; do
#     git show 8d237f3:kernels/$f.py > results/attention/host_plans/before/$f.py; done
# (ab_h200.txt's runs). For the binding of Prepared alone (ebca30a), write them from 2be7fb0 instead: its plans
# without binding, whose flash.py and launch.py have what today's kernels/blocksparse.py imports.
set -e
D=results/attention/host_plans
test -f $D/before/flash_gluon.py || { echo "before/ missing: see the header"; exit 1; }
rm -rf /tmp/before_tree && mkdir -p /tmp/before_tree && cp -r kernels results /tmp/before_tree/
cp $D/before/*.py /tmp/before_tree/kernels/
P=results/attention/host_profile/host_profile.py
for r in $(seq 1 "$1"); do
  for p in 0.1 0; do
    FLASH_AUTOTUNE=0 python $P --dropout $p --label after | tail -1
    (cd /tmp/before_tree && FLASH_AUTOTUNE=0 python $P --dropout $p --label before | tail -1)
  done
done
