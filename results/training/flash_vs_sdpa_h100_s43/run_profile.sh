set -e
pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
export WANDB_MODE=offline HF_DATASETS_OFFLINE=1
date -u
python scripts/bench_training.py --rows ours-sdpa-compile,ours-flash-compile,ours-sdpa-compile,ours-flash-compile --steps 60 --warmup 10 --profile 8 --row-timeout 150 --out $OUT/compile_profile 2>&1 | grep -v "^ours" | tail -80
date -u
