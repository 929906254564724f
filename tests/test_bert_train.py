"""BERT through the training framework on the CPU: the BERT experiments with debug=smoke (tiny BERT) on
a tiny prepared folder train, log the MLM metrics and count real tokens only; the full smoke command
(preparing the committed corpus at 64 tokens on first use) is marked slow."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from train import bert_data as bd

REPO = Path(__file__).resolve().parent.parent
FAST = ["debug=smoke", "logger=csv", "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    import gzip
    import json

    with gzip.open(bd.EMBEDDED, "rt") as f:
        texts = [json.loads(line)["text"] for line in f][-10:]
    out = tmp_path_factory.mktemp("bert") / "tiny-64"
    bd.prepare_examples(texts, out, bd.Settings(max_seq_len=64, max_predictions=9, dupe_factor=1, val_fraction=0.2),
                        stamp="tiny", num_proc=1)
    return out


def run(overrides, out):
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers
    from train.run import train

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=FAST + list(overrides) + [f"output_dir={out}"])
    return train(cfg)


@pytest.mark.parametrize("experiment", ["bert/large-mlperf", "bert/base-quick", "bert/medium-quality"])
def test_bert_experiments_train_with_smoke(tiny_data, tmp_path, experiment):
    trainer, task = run([f"experiment={experiment}", "data.source=corpus", f"data.data_dir={tiny_data}",
                         "trainer.max_steps=2", "eval_every_steps=2", "trainer.limit_val_batches=1",
                         "global_batch_size=4", "trainer.log_every_n_steps=1", "callbacks.speed.every=1"], tmp_path)
    assert trainer.global_step == 2 and trainer.accumulate_grad_batches == 2
    m = trainer.callback_metrics
    assert {"val/mlm_loss", "val/mlm_acc", "val/nsp_acc", "train/loss"} <= set(m)
    assert type(task.model).__name__ == "BertForPreTraining" and task.model.n_layer == 2
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert any(r.get("perf/tokens_per_s") for r in rows)
    # real tokens only: the task counts attention_mask, not the 64-wide padded batch
    dm = trainer.datamodule
    batch = next(iter(dm.train_dataloader()))
    tokens, _ = task.batch_tokens(batch)
    assert int(tokens) == int(batch["attention_mask"].sum()) <= batch["input_ids"].numel()


def test_sequences_longer_than_the_position_table_fail(tiny_data, tmp_path):
    with pytest.raises(ValueError, match="up to 64 tokens but the model has 32 positions"):
        run(["experiment=bert/base-quick", "data.source=corpus", f"data.data_dir={tiny_data}",
             "model.max_positions=32"], tmp_path)


@pytest.mark.slow
def test_smoke_cli_prepares_the_committed_corpus(tmp_path):
    """The documented command: a tiny BERT-large-shaped run on the committed corpus (prepared at 64
    tokens on first use, about a minute and a half on 2 cores; cached afterwards)."""
    p = subprocess.run([sys.executable, "train/run.py", "experiment=bert/base-quick", "model=bert-large",
                        "debug=smoke", f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "val/mlm_acc" in (tmp_path / "metrics.csv").read_text()
