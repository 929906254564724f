# GPT-2 small with the host taken out of the step (prepared in session 43, not yet run). One H100, carry .whl and
# data/cache/embedded; two calls, each under 10 minutes:
#   bash results/training/graphed_steps/run.sh tests   # the GPU tests of both graph paths (~4 min)
#   bash results/training/graphed_steps/run.sh rows    # one throwaway row, then six rows (~5-6 min)
#   bash results/training/graphed_steps/run.sh repeat  # the compile-graphs pair again, ABBA (~4 min)
# Rows alternate sdpa / flash within each mode:
#   compile:        compile=true (the baseline: every kernel launched from the host);
#   compile-graphs: compile=true compile_mode=reduce-overhead (inductor replays the compiled forward and backward
#                   as CUDA graphs; the optimizer stays eager);
#   step-graph:     cuda_graph=step (the eager model, loss, backward and fused AdamW captured as one graph).
# The throwaway row: in session 43 the first row of each call ran 3-7% below the rest, whatever it ran
# (../compile_ops/README.md).
set -e
pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
export WANDB_MODE=offline HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%H:%M:%S
# rows ROW_LIST OUT_NAME: one throwaway row of the list's second row, then the list timed
rows() {
  python scripts/bench_training.py --rows "$(echo "$1" | cut -d, -f2)" --steps 10 --warmup 5 --row-timeout 150 \
    --out /tmp/throwaway > /dev/null 2>&1 || true
  python scripts/bench_training.py --rows "$1" --steps 60 --warmup 10 --row-timeout 150 --out "$OUT/$2" 2>&1 \
    | grep -E "^\| ours|failed" || true
}
case "$1" in
  tests)
    FLASH_AUTOTUNE=0 python -m pytest -q -m gpu tests/test_compile.py tests/test_cuda_graph.py \
      -k "reduce_overhead or inductor or step_graph" 2>&1 | tail -4 ;;
  rows)
    rows ours-sdpa-compile,ours-flash-compile,ours-sdpa-compile-graphs,ours-flash-compile-graphs,ours-sdpa-step-graph,ours-flash-step-graph graphed ;;
  repeat)  # session 44: compile-graphs alone, sdpa / flash / flash / sdpa after the throwaway row (~4 minutes)
    rows ours-sdpa-compile-graphs,ours-flash-compile-graphs,ours-flash-compile-graphs,ours-sdpa-compile-graphs repeat ;;
  *) echo "usage: bash results/training/graphed_steps/run.sh tests|rows|repeat"; exit 2 ;;
esac
date -u +%H:%M:%S
