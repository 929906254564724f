# Session 49's probe of an order-dependent CUDA-graph failure (gpu_tests_bind_h200.txt): the failing test's three
# cases alone in six processes, then the block-sparse GPT-2 and CUDA-graph files together. Usage (one GPU; carry .whl
# and data/cache/embedded): bash results/attention/host_plans/cg_probe.sh; writes cg_repeat.txt, cg_pair.txt to $OUT.
export PYTHONPATH=/tmp/site FLASH_AUTOTUNE=0 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
ls /tmp/site/hydra >/dev/null 2>&1 || pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
for i in 1 2 3 4 5 6; do
  python -m pytest -q -m gpu tests/test_cuda_graph.py -k accumulate -p no:cacheprovider -W ignore 2>&1 | grep -E "passed|failed|Mismatch|Greatest|FAILED|msg|Error" | head -20
done > $OUT/cg_repeat.txt 2>&1
cat $OUT/cg_repeat.txt
timeout 300 python -m pytest -q -m gpu tests/test_blocksparse_gpt2.py tests/test_cuda_graph.py -p no:cacheprovider -W ignore --tb=short 2>&1 | grep -v "^  /" | tail -60 > $OUT/cg_pair.txt
tail -40 $OUT/cg_pair.txt
