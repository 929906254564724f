# session 34, third call: head dim 256, and 512-16K at head dims 64 and 128 with 5 rounds and the one-unit-a-program column
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_persistent
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 110 python $D/persistent.py check 2>&1 | tee $OUT/check.txt | tail -1
timeout 170 python $D/persistent.py bench --head-dims 256 --seqlens 512 1024 2048 4096 8192 16384 --one-unit 2>&1 | tee $OUT/bench_hd256.txt | grep -v rounds_ms | cut -c1-330
timeout 290 python $D/persistent.py bench --head-dims 64 128 --seqlens 512 4096 8192 16384 --rounds 5 --one-unit 2>&1 | tee $OUT/bench_long.txt | grep -v rounds_ms| cut -c1-330
