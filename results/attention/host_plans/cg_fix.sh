# Checks train/cuda_graph.py's collector_paused on the GPU (session 49's fix, gpu_tests_bind_h200.txt): the two
# tests that collect garbage in the middle of a capture, first with collector_paused replaced by a no-op (they
# should fail: the stale graph is destroyed mid-capture), then as shipped, then the suite order that failed once in
# every run before the fix. Usage (one GPU; carry .whl and data/cache/embedded):
#   bash results/attention/host_plans/cg_fix.sh   (~6 min with a cold Triton cache)
export PYTHONPATH=/tmp/site:. FLASH_AUTOTUNE=0 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
ls /tmp/site/hydra >/dev/null 2>&1 || pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
T="tests/test_cuda_graph.py::test_graphed_model_capture_survives_a_collection_mid_capture tests/test_cuda_graph.py::test_step_graph_capture_survives_a_collection_mid_capture"
echo "# without the fix (collector_paused -> contextlib.nullcontext): expect 2 failures"
python - $T <<'PY' 2>&1 | grep -E "passed|failed|FAILED|^E " | head -12
import contextlib, sys
import pytest
import train.cuda_graph as cg
cg.collector_paused = contextlib.nullcontext
sys.exit(pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "-W", "ignore", "--tb=line", *sys.argv[1:]]))
PY
echo "# as shipped"
python -m pytest -q -m gpu $T -p no:cacheprovider -W ignore --tb=short 2>&1 | grep -E "passed|failed|FAILED|^E " | head -12
echo "# the order that failed before the fix"
python -m pytest -q -m gpu tests/test_launch.py tests/test_flash_gluon.py tests/test_gluon_dropout.py tests/test_blocksparse.py \
  tests/test_blocksparse_gpt2.py tests/test_cuda_graph.py -p no:cacheprovider -W ignore --tb=short 2>&1 \
  | grep -E "passed|failed|FAILED|^E " | head -12
