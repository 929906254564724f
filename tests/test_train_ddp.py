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
