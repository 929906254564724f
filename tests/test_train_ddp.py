"""Data-parallel training on two CPU processes (gloo): the same run as one process with a doubled
micro-batch, since the ranks stride over the same global sample stream, gradients are averaged, and
the split metrics are sums over rank shards. Slow (two process launches)."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(run_dir, *overrides):
    cmd = [sys.executable, "train/run.py", "experiment=synthetic/classification", "debug=smoke",
           "model.dropout=0", "model.attn_dropout=0",
           "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.max_steps=6",
           "trainer.log_every_n_steps=3", "eval_every_steps=6", "trainer.limit_val_batches=null",
           "data.val_samples=50", "test_after_fit=false", "scheduler.warmup_steps=2", f"hydra.run.dir={run_dir}",
           *overrides]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(Path(run_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {k: {int(r["step"]): float(r[k]) for r in rows if r.get(k)} for k in rows[0]}


@pytest.mark.slow
def test_two_ranks_match_one_rank_with_twice_the_micro_batch(tmp_path):
    one = run(tmp_path / "one", "data.batch_size=4")
    two = run(tmp_path / "two", "trainer=ddp", "trainer.devices=2", "data.batch_size=2")
    # 25 validation samples per rank, the last batch of each shard short: the metrics stay exact
    assert two["val/loss"][5] == pytest.approx(one["val/loss"][5], rel=1e-4)
    assert two["val/acc"][5] == one["val/acc"][5]
    # tokens/s counts both ranks: the same real tokens per 3-step window as the single process
    def tokens(m, step):
        return m["perf/tokens_per_s"][step] * m["perf/step_time_ms"][step] * 3 / 1000

    for step in (2, 5):
        assert tokens(two, step) == pytest.approx(tokens(one, step), rel=1e-6)


@pytest.mark.slow
def test_two_ranks_keep_the_kernels_dropout_masks_matched(tmp_path):
    """The parity experiment on several GPUs (experiment=gpt2/small-parity-long with trainer=ddp): every rank
    draws the same dropout seeds, so attn=standard-matched and attn=flash still drop the same scores and hidden
    units and train identically (float32 on the CPU). Uses the registry-corpus prefix when prepared."""
    data = REPO / "data" / "cache" / "corpus-12m"
    if not (data / "train.bin").exists():
        pytest.skip("needs scripts/prepare_corpus.py --prefix-tokens 12000000 --prefix-out data/cache/corpus-12m")
    common = ("experiment=gpt2/small-parity", "trainer=ddp", "trainer.devices=2", "data.batch_size=1",
              "trainer.max_steps=6", "trainer.log_every_n_steps=3", "eval_every_steps=6", "trainer.limit_val_batches=2",
              "test_after_fit=false")
    cmd = [sys.executable, "train/run.py", "debug=smoke", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
           *common]
    losses = {}
    for attn in ("standard-matched", "flash"):
        p = subprocess.run([*cmd, f"attn={attn}", f"hydra.run.dir={tmp_path / attn}"], cwd=REPO, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        with open(tmp_path / attn / "metrics.csv") as f:
            losses[attn] = [(r["step"], float(r[k])) for r in csv.DictReader(f)
                            for k in ("train/loss", "val/loss") if r.get(k)]
    assert len(losses["flash"]) == 3
    for (step_a, a), (step_b, b) in zip(losses["standard-matched"], losses["flash"]):
        assert step_a == step_b and a == pytest.approx(b, rel=1e-4)
