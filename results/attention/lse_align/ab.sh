set -u
# Run once, in session 31, on the device with the fix uncommitted on top of b32bf45: it times the committed kernels
# ("before"), then applies the working tree's kernel diff ("after"). README.md has the results.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git diff -- kernels/ > /tmp/fix.patch && git checkout -q -- kernels/ || exit 1
S="python scripts/bench_blocksparse.py --seqlens 4096 16384 --hdims 128 --densities --providers ours flex"
A="python scripts/bench_attention.py --seqlens 1024 --hdims 64 --causal no --providers ours --no-memory --no-gpt2 --rounds 3 --modes fwdbwd"
$S --out $OUT --tag bs_before 2>&1 | grep -E "^\| (4096|16384)"
$A --out $OUT --tag dense_before 2>&1 | grep -E "^\| 1024"
git apply /tmp/fix.patch || exit 1
$S --out $OUT --tag bs_after 2>&1 | grep -E "^\| (4096|16384)"
$A --out $OUT --tag dense_after 2>&1 | grep -E "^\| 1024"
