#!/bin/bash
# The quiet parity recipe on four H100s, detached over several device calls (each call <= 600 s, the machine held
# between them; checkpoints cannot come back, so everything that reads them runs here). From the repo root:
#   [SEEDS="1 2 3"] [MICRO=16] bash results/training/gpt2_parity_quiet/device.sh start NAME KINDS SLEEP [OVERRIDES...]
#   [SWAP_KINDS=a,b,c] bash results/training/gpt2_parity_quiet/device.sh watch NAME SLEEP
# start unpacks the corpus (outputs/corpus_xz/{train,val}.bin.xz and meta.json, made here with
# `python scripts/prepare_corpus.py` then `xz -k`), installs the carried wheels (.whl: hydra-core, omegaconf,
# antlr4), and starts, in its own session, one compare_attention sweep over KINDS per dropout seed in SEEDS
# (`dropout_seed=S`: the same init and data order, other masks; "none", the default, keeps the run's seed),
# with micro-batch MICRO on each of the four ranks (default 4, as session 30 ran; the recipe's 64 sequences a
# step also split as 16 a rank without accumulation). Every call watches until SLEEP seconds pass or the
# sweeps end; once they have ended, scripts/swap_eval.py scores the first kind's checkpoints of each seed with
# every kind (or SWAP_KINDS), four groups of checkpoints on the four GPUs, merged into <seed>/swap/swap_eval.md.
# The call packs the small files (tables, metrics, configs, logs) into $OUT/bundle.tgz (a call brings back at
# most 8 files). Session 30 ran an earlier form of this script: NAME=parity_quiet, KINDS=standard-matched,flash,
# standard-matched-fp32, one seed, MICRO=4, no swap_eval.
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
  echo "${SEEDS:-none}" > $P/seeds
  {
    echo "set -u"
    for s in ${SEEDS:-none}; do
      seed_arg=""; [ "$s" != none ] && seed_arg="dropout_seed=$s"
      echo "python scripts/compare_attention.py --attn $KINDS --reuse --timeout 900 --name gpt2_${NAME}_$s" \
        "--out $P/$s/table --runs-dir $P/$s/runs experiment=gpt2/small-parity-quiet trainer=ddp trainer.devices=4" \
        "data.batch_size=${MICRO:-4} data.num_workers=3 $seed_arg $* > $P/$s.log 2>&1"
    done
  } > $P/sweep.sh
  cat $P/sweep.sh
  setsid nohup bash $P/sweep.sh > /dev/null 2>&1 < /dev/null &
  sleep 5
else
  SLEEP=$3
fi
running() { pgrep -f "$P/sweep.sh" > /dev/null; }
end=$((SECONDS + SLEEP))
while [ $SECONDS -lt $end ] && running; do sleep 20; echo "--- $(date +%T)"; tail -qn 1 $P/*.log; done
echo "=== tail"; tail -n 15 $P/*.log
if ! running; then
  KINDS=$(cat $P/kinds); FIRST=${KINDS%%,*}; SWAP=${SWAP_KINDS:-$KINDS}
  for s in $(cat $P/seeds); do
    [ -f $P/$s/swap/done ] && continue
    mkdir -p $P/$s/swap
    for i in 0 1 2 3; do  # four checkpoint groups, one GPU each
      STEPS=$(ls $P/$s/runs/$FIRST/checkpoints | sed -n 's/^step0*\([0-9]*\)\.ckpt$/\1/p' | sort -n | awk -v i=$i 'NR % 4 == i')
      [ -n "$STEPS" ] && CUDA_VISIBLE_DEVICES=$i python scripts/swap_eval.py --run $P/$s/runs/$FIRST --attn $SWAP \
        --steps $STEPS --out $P/$s/swap --name part$i data.batch_size=16 > $P/$s/swap/log$i 2>&1 &
    done
    wait; tail -n 3 $P/$s/swap/log*
    python scripts/swap_eval.py --merge $P/$s/swap/part*.json --out $P/$s/swap --name swap_eval && touch $P/$s/swap/done
  done
fi
B=/tmp/bundle; rm -rf $B; mkdir -p $B
cp $P/*.log $P/sweep.sh $B/ 2>/dev/null
for s in $(cat $P/seeds); do
  mkdir -p $B/$s; cp -r $P/$s/table $P/$s/swap $B/$s/ 2>/dev/null
  for d in $P/$s/runs/*/; do
    [ -d "$d" ] || continue
    k=$(basename $d); mkdir -p $B/$s/runs/$k/hydra
    cp $d/*.csv $d/*.yaml $d/run.log $d/console.log $B/$s/runs/$k/ 2>/dev/null; cp $d/.hydra/*.yaml $B/$s/runs/$k/hydra/
  done
done
tar czf $OUT/bundle.tgz -C $B . && ls -la $OUT
