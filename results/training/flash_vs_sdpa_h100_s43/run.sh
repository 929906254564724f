set -e
pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export WANDB_MODE=offline HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
python scripts/bench_training.py --rows ours-sdpa,ours-flash,ours-sdpa,ours-flash,ours-sdpa,ours-flash --steps 60 --warmup 10 --row-timeout 90 --out $OUT/eager 2>&1 | grep -vE "^\s*$" | tail -15
date -u
python scripts/bench_training.py --rows ours-flash-compile,ours-sdpa-compile,ours-flash-compile,ours-sdpa-compile --steps 60 --warmup 10 --row-timeout 130 --out $OUT/compile 2>&1 | tail -12
date -u
