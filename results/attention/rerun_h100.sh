#!/bin/bash
# The device calls that refresh the kernel tables after a kernel change, one H100, run from the repo root, each call
# well inside 600 s. A call brings back at most 8 files, so each mode packs its outputs into $OUT/<mode>.tgz.
#   bash results/attention/rerun_h100.sh tests        # the GPU tests of the kernels (~5 min), first
#   bash results/attention/rerun_h100.sh hd64         # results/attention/h100.md's head-dim-64 part (~3.5 min)
#   bash results/attention/rerun_h100.sh hd128        # its head-dim-128 part (~3.5 min)
#   bash results/attention/rerun_h100.sh hd256        # its head-dim-256 part (512-16K)
#   bash results/attention/rerun_h100.sh blocksparse  # results/blocksparse/h100.* (~4 min: 250 s on 2026-11-27)
# Then, on the CPU machine: unpack each tarball, copy the parts to results/attention/h100_parts/ and merge them
# (`python scripts/bench_attention.py --merge results/attention/h100_parts/h100_hd64.json
# results/attention/h100_parts/h100_hd128.json results/attention/h100_parts/h100_hd256.json --out results/attention
# --tag h100`), and rewrite the commands recorded in the files as results/README.md says.
# Ran 2026-11-27 05:37-05:53 UTC (session 31's backward changes; the repo at 5a1e7ac) and again in session 34 (the
# persistent Gluon forward, the 3-deep head-dim-64 backward ring, delta in the dQ kernel); results/README.md has
# each run's commit.
set -u -o pipefail
export PYTHONUNBUFFERED=1
W=/tmp/rerun_$1
mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
# --graphed-upto 2048 (from session 35 on): CUDA-graph ratios beside the eager ones where the eager rows are the host's
T="python scripts/bench_attention.py --providers ours standard sdpa_flash sdpa_cudnn flex --flex-seqlens 1024 4096 16384
   --rep 30 --rounds 3 --seqlens 512 1024 2048 4096 8192 16384 32768 65536 --graphed-upto 2048"
case $1 in
tests)
  FLASH_AUTOTUNE=0 timeout 500 python -m pytest -q -m gpu tests/test_flash.py tests/test_flash_gluon.py \
    tests/test_blocksparse.py tests/test_compile.py tests/test_padding.py 2>&1 | tail -40 | tee $W/h100_pytest_gpu.txt ;;
hd64)
  $T --hdims 64 --out $W --tag h100_hd64 2>&1 | tail -30 ;;
hd128)
  $T --hdims 128 --no-gpt2 --out $W --tag h100_hd128 2>&1 | tail -30 ;;
hd256)
  python scripts/bench_attention.py --hdims 256 --seqlens 512 1024 2048 4096 8192 16384 --providers ours standard \
    sdpa_flash sdpa_cudnn flex --flex-seqlens 1024 4096 16384 --rep 30 --rounds 3 --graphed-upto 2048 --no-gpt2 \
    --out $W --tag h100_hd256 2>&1 | tail -30 ;;
blocksparse)
  timeout 560 python scripts/bench_blocksparse.py --rep 25 --out $W --tag h100 2>&1 | tee $W/h100.log | tail -30 ;;
*) echo "usage: $0 tests|hd64|hd128|hd256|blocksparse"; exit 2 ;;
esac
tar czf $OUT/$1.tgz -C /tmp rerun_$1
