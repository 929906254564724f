# GPU check of session 50's plans for the @triton.jit launches (kernels/flash.py `_jit_fwd_plan` / `_jit_bwd_plan`;
# varlen plans keyed without the packed length, flash and block-sparse). Every @triton.jit launch now goes through
# them, so the flash, block-sparse, warp-specialisation, launch and ring files run whole on the GPU (their device
# fixture then says cuda), then the compile and CUDA-graph files' GPU tests. Usage (one GPU; carry .whl and
# data/cache/embedded):   bash results/attention/host_plans/jit_plans_gpu.sh [pytest -k expression]
export PYTHONPATH=/tmp/site:. FLASH_AUTOTUNE=0 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
ls /tmp/site/hydra >/dev/null 2>&1 || pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  2>&1 | grep -v "as the 'root' user"
K=${1:+-k "$1"}
echo "# tests/test_flash.py tests/test_blocksparse.py tests/test_launch.py tests/test_flash_ws.py tests/test_ring.py"
eval python -m pytest -q tests/test_flash.py tests/test_blocksparse.py tests/test_launch.py tests/test_flash_ws.py \
  tests/test_ring.py $K -p no:cacheprovider -W ignore --tb=short 2>&1 | grep -E "passed|failed|FAILED|^E " | head -30
echo "# -m gpu: tests/test_compile.py tests/test_cuda_graph.py tests/test_flash_gluon.py"
eval python -m pytest -q -m gpu tests/test_compile.py tests/test_cuda_graph.py tests/test_flash_gluon.py $K \
  -p no:cacheprovider -W ignore --tb=short 2>&1 | grep -E "passed|failed|FAILED|^E " | head -30
