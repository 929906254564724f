#!/bin/bash
# The quiet parity recipe on four H100s, detached over several device calls (each call <= 600 s, the machine held
# between them; checkpoints cannot come back, so everything that reads them runs here). From the repo root:
#   bash results/training/gpt2_parity_quiet/device.sh start NAME KINDS SLEEP [OVERRIDES...]
#   bash results/training/gpt2_parity_quiet/device.sh watch NAME SLEEP
# start unpacks the corpus (outputs/corpus_xz/{train,val}.bin.xz and meta.json, made here with
# `python scripts/prepare_corpus.py` then `xz -k`), installs the carried wheels (.whl: hydra-core, omegaconf,
# antlr4), and starts compare_attention in its own session. Every call watches until SLEEP seconds pass or the
# sweep ends; once it has ended, scripts/swap_eval.py scores the first kind's checkpoints with every kind (or
# SWAP_KINDS; four groups of checkpoints, one GPU each, merged into swap/swap_eval.md), and the call packs the small files (table,
# metrics, configs, logs) into $OUT/bundle.tgz (a call brings back 8 files at most). Session 30 ran an earlier form
# of this script (no swap_eval) with NAME=parity_quiet KINDS=standard-matched,flash,standard-matched-fp32; the next
# step (README here) is NAME=parity_seed2 KINDS=standard-matched,flash with dropout_seed=2, SWAP_KINDS adding
# standard-matched-fp32.
set -u
MODE=$1; NAME=$2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_DATASETS_OFFLINE=1
P=outputs/$NAME
if [ "$MODE" = start ]; then
  KINDS=$3; SLEEP=$4; shift 4
  mkdir -p data/corpus $P
  python3 -c "
import glob, lzma, os, shutil
for f in glob.glob('outputs/corpus_xz/*.xz'):
    with lzma.open(f) as src, open('data/corpus/' + os.path.basename(f)[:-3], 'wb') as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
" && cp outputs/corpus_xz/meta.json data/corpus/ && ls -la data/corpus || exit 1
  nvidia-smi --query-gpu=name --format=csv,noheader
  echo "$KINDS" > $P/kinds
  setsid nohup python scripts/compare_attention.py --attn $KINDS --reuse --timeout 900 --name gpt2_$NAME \
    --out $P/table --runs-dir $P/runs experiment=gpt2/small-parity-quiet trainer=ddp trainer.devices=4 \
    data.batch_size=4 data.num_workers=3 "$@" > $P/log 2>&1 < /dev/null &
  sleep 5
else
  SLEEP=$3
fi
end=$((SECONDS + SLEEP))
while [ $SECONDS -lt $end ] && pgrep -f compare_attention.py > /dev/null; do sleep 20; echo "--- $(date +%T)"; tail -2 $P/log; done
echo "=== tail"; tail -15 $P/log
if ! pgrep -f compare_attention.py > /dev/null && [ ! -f $P/swap/done ]; then
  KINDS=$(cat $P/kinds); FIRST=${KINDS%%,*}; SWAP=${SWAP_KINDS:-$KINDS}; mkdir -p $P/swap
  for i in 0 1 2 3; do  # four checkpoint groups, one GPU each
    STEPS=$(ls $P/runs/$FIRST/checkpoints | sed -n 's/^step0*\([0-9]*\)\.ckpt$/\1/p' | sort -n | awk -v i=$i 'NR % 4 == i')
    [ -n "$STEPS" ] && CUDA_VISIBLE_DEVICES=$i python scripts/swap_eval.py --run $P/runs/$FIRST --attn $SWAP \
      --steps $STEPS --out $P/swap --name part$i data.batch_size=16 > $P/swap/log$i 2>&1 &
  done
  wait; tail -3 $P/swap/log*
  python scripts/swap_eval.py --merge $P/swap/part*.json --out $P/swap --name swap_eval && touch $P/swap/done
fi
B=/tmp/bundle; rm -rf $B; mkdir -p $B/runs
cp -r $P/log $P/table $P/swap $B/ 2>/dev/null
for d in $P/runs/*/; do
  k=$(basename $d); mkdir -p $B/runs/$k/hydra
  cp $d/*.csv $d/*.yaml $d/run.log $d/console.log $B/runs/$k/ 2>/dev/null; cp $d/.hydra/*.yaml $B/runs/$k/hydra/
done
tar czf $OUT/bundle.tgz -C $B . && ls -la $OUT
