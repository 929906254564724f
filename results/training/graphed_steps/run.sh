# GPT-2 small with the host taken out of the step (prepared in session 43, not yet run). One H100 call, ~8 minutes;
# carry .whl and data/cache/embedded. Rows alternate sdpa / flash within each mode:
#   compile:        compile=true (the baseline: every kernel launched from the host);
#   compile-graphs: compile=true compile_mode=reduce-overhead (inductor replays the compiled forward and backward
#                   as CUDA graphs; the optimizer stays eager);
#   step-graph:     cuda_graph=step (the eager model, loss, backward and fused AdamW captured as one graph).
# First the GPU tests of the two graph paths, so a failing capture shows as a test before it shows as a row.
set -e
pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
export WANDB_MODE=offline HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
FLASH_AUTOTUNE=0 python -m pytest -q -m gpu tests/test_compile.py tests/test_cuda_graph.py -k "reduce_overhead or inductor or step_graph" 2>&1 | tail -2
date -u +%H:%M:%S
python scripts/bench_training.py --rows \
  ours-sdpa-compile,ours-flash-compile,ours-sdpa-compile-graphs,ours-flash-compile-graphs,ours-sdpa-step-graph,ours-flash-step-graph,ours-sdpa-compile-graphs,ours-flash-compile-graphs \
  --steps 60 --warmup 10 --row-timeout 150 --out "$OUT/graphed" 2>&1 | grep -E "^\| ours|failed" || true
date -u +%H:%M:%S
