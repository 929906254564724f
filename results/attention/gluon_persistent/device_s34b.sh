# session 34, second call (pairs for causal units): the check, the bench, and the GPU tests of test_flash_gluon with BWD_TILES[64] = (64, 128, 3, 2)
set -u -o pipefail
export PYTHONUNBUFFERED=1
D=results/attention/gluon_persistent
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 python $D/persistent.py check 2>&1 | tee $OUT/check_h100.txt | tail -2 || { echo "check failed or hung"; exit 1; }
timeout 240 python $D/persistent.py bench 2>&1 | tee $OUT/bench_h100.txt | cut -c1-400
FLASH_AUTOTUNE=0 timeout 190 python -m pytest -q -m gpu tests/test_flash_gluon.py 2>&1 | tail -4 | tee $OUT/gluon_tests.txt
