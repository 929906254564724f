# Host time of launch()'s session-47 path (kernels/launch.py: the kept kernel called past Triton's launcher wrapper,
# kernels keyed by id, environment read from os.environ's dict) against the tree before it (1429b1f's launch.py and
# flash.py, in before/), on the GPU machine's host: host_profile.py in alternating processes, PAIRS of each.
# Usage (one H100, ~90 s a process): bash results/attention/host_profile/ab.sh PAIRS
# Before the call, on the CPU machine (the device's git history is stale), write the earlier files; the device copies
# them with the working tree (untracked, not ignored):
#   mkdir -p results/attention/host_profile/before && for f in launch flash; do
#     git show 1429b1f:kernels/$f.py > results/attention/host_profile/before/$f.py; done
set -e
test -f results/attention/host_profile/before/launch.py || { echo "before/ missing: see the header"; exit 1; }
D=results/attention/host_profile
rm -rf /tmp/before_tree && mkdir -p /tmp/before_tree && cp -r kernels results /tmp/before_tree/
cp $D/before/launch.py $D/before/flash.py /tmp/before_tree/kernels/
for r in $(seq 1 "$1"); do
  FLASH_AUTOTUNE=0 python $D/host_profile.py --label after | tail -1
  (cd /tmp/before_tree && FLASH_AUTOTUNE=0 python $D/host_profile.py --label before | tail -1)
done
