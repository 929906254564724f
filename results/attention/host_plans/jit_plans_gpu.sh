# GPU check of session 50's plans for the @triton.jit launches (kernels/flash.py `_jit_fwd_plan` / `_jit_bwd_plan`;
# varlen plans keyed without the packed length, flash and block-sparse). Every @triton.jit launch now goes through
# them, so the flash, block-sparse, launch and warp-specialisation files run whole on the GPU (their device fixture
# then says cuda), then the GPU tests of the ring, compile, CUDA-graph and Gluon files (test_ring's other tests run
# CPU tensors, which only the interpreter takes). Usage (one GPU; carry .whl and data/cache/embedded), one part a
# device call (a call has 10 minutes; part 1 took 95 s with a warm Triton cache, and with a cold one it and a whole
# test_ring run did not finish in 575 s):
#   bash results/attention/host_plans/jit_plans_gpu.sh 1     then     bash results/attention/host_plans/jit_plans_gpu.sh 2
export PYTHONPATH=/tmp/site:. FLASH_AUTOTUNE=0 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
ls /tmp/site/hydra >/dev/null 2>&1 || pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  2>&1 | grep -v "as the 'root' user"
PART=${1:?part 1 or 2}
if [ "$PART" = 1 ]; then
echo "# tests/test_flash.py tests/test_blocksparse.py tests/test_launch.py tests/test_flash_ws.py"
python -m pytest -q tests/test_flash.py tests/test_blocksparse.py tests/test_launch.py tests/test_flash_ws.py \
  -p no:cacheprovider -W ignore --tb=line 2>&1 | grep -E "passed|failed|FAILED|^/" | tail -40
else
echo "# -m gpu: tests/test_ring.py tests/test_compile.py tests/test_cuda_graph.py tests/test_flash_gluon.py"
python -m pytest -q -m gpu tests/test_ring.py tests/test_compile.py tests/test_cuda_graph.py tests/test_flash_gluon.py \
  -p no:cacheprovider -W ignore --tb=line 2>&1 | grep -E "passed|failed|FAILED|^/" | tail -40
fi
