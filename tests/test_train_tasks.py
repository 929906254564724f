"""The task group on tiny configs: every family trains and logs, real tokens and FLOPs are counted as
specified, schedules have their shapes, LAMB and the weight-decay groups are built, a synthetic run
resumes the same curve, and the synthetic data says what it claims.

Encoder families run models/encoder.py at debug=smoke sizes."""
import csv
import math
from pathlib import Path

import pytest
import torch

from models.layers import transformer_flops
from train.callbacks import SpeedMonitor, model_flops
from train.optim import lr_multiplier, param_groups, warmup_schedule
from train.synthetic_data import (CLS, FIRST, IGNORE, MASK, CountingExamples, MaskedLMExamples, RetrievalExamples)
from train.task import ClassificationTask, LMTask, Task

def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def synthetic_cfg(family, out, *extra):
    return compose(f"experiment=synthetic/{family}", "debug=smoke", "logger=csv", "trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
                   f"output_dir={out}", *extra)


def metrics(run_dir):
    with open(Path(run_dir) / "metrics.csv") as f:
        return list(csv.DictReader(f))


def series(rows, key):
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


SHORT = ["trainer.max_steps=6", "trainer.log_every_n_steps=3", "trainer.limit_val_batches=2",
         "trainer.limit_test_batches=2", "eval_every_steps=6", "scheduler.warmup_steps=2"]


@pytest.mark.parametrize("family,logged", [
    ("mlm", ["train/loss", "train/mlm_loss", "train/nsp_loss", "val/mlm_loss", "val/mlm_acc", "val/nsp_acc"]),
    ("classification", ["train/loss", "train/acc", "val/loss", "val/acc", "test/acc", "test/loss"]),
    ("retrieval", ["train/loss", "train/acc", "val/loss", "val/acc", "test/acc"]),
])
def test_each_family_trains_and_logs(tmp_path, family, logged):
    from train.run import train

    cfg = synthetic_cfg(family, tmp_path, *SHORT)
    trainer, task = train(cfg)
    assert trainer.global_step == 6
    rows = metrics(tmp_path)
    for key in logged:
        values = series(rows, key)
        assert values and all(math.isfinite(v) for v in values.values()), key
    if family == "mlm":
        assert series(rows, "val/mlm_loss")[5] < 1.5 * math.log(cfg.model.vocab_size)
    # what run.py's closing summary prints: training's last values stay beside the test split's
    assert set(logged) <= set(trainer.callback_metrics)

    # Speed: the windows count real tokens (padding excluded) of every consumed sample, and the FLOPs
    # are the model's for exactly those counts.
    speed = next(c for c in trainer.callbacks if isinstance(c, SpeedMonitor))
    from hydra.utils import instantiate

    n = 6 * cfg.data.batch_size
    train_split = instantiate(cfg.data).split("train", n)
    lens = [int(v.sum()) for i in range(n) for k, v in train_split[i].items() if k.startswith("attention_mask")]
    tokens, sum_sq = sum(lens), sum(x * x for x in lens)
    assert [r["step"] for r in speed.history] == [3, 6]
    assert sum(r["tokens"] for r in speed.history) == tokens
    assert sum(r["sum_sq_len"] for r in speed.history) == sum_sq
    width = cfg.model.max_positions * n * (2 if family == "retrieval" else 1)
    assert tokens < width  # there was padding, and it was not counted
    flops = sum(r["flops"] for r in speed.history)
    assert flops == pytest.approx(task.model.flops(tokens, sum_sq), rel=1e-12)


def test_batch_tokens_counts_real_tokens_only():
    task = Task(torch.nn.Linear(2, 2))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    ids = torch.ones(2, 4, dtype=torch.long)
    tokens, sum_sq = task.batch_tokens({"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(2)})
    assert (int(tokens), int(sum_sq)) == (5, 3 * 3 + 2 * 2)
    two = {"input_ids": ids, "attention_mask": mask, "input_ids_2": ids, "attention_mask_2": mask[:, [0, 0, 0, 0]]}
    tokens, sum_sq = task.batch_tokens(two)
    assert (int(tokens), int(sum_sq)) == (5 + 8, 13 + 16 + 16)
    assert task.batch_tokens({"input_ids": ids}) == (8, 2 * 16)  # no mask: every position is real
    lm = LMTask(torch.nn.Linear(2, 2))
    assert lm.batch_tokens(torch.zeros(3, 17, dtype=torch.long)) == (3 * 16, 3 * 16 * 16)


def test_lm_task_fused_loss_equals_plain_loss():
    """GPT-2 hands LMTask the fused loss in training and validation; the numbers are the plain logits' ones."""
    from models.gpt2 import GPT2

    torch.manual_seed(0)
    model = GPT2(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4, embd_pdrop=0.0, attn_pdrop=0.0,
                 resid_pdrop=0.0)
    batch = torch.randint(0, 50, (3, 17))
    results = []
    for fused in (True, False):
        model.fuses_loss = fused  # the instance attribute shadows GPT2's
        task = LMTask(model)
        loss = task.training_step(batch, 0)
        task.validation_step(batch, 0)
        results.append((loss.detach(), task.val_ppl.compute()[0]))
    (loss_f, val_f), (loss_p, val_p) = results
    torch.testing.assert_close(loss_f, loss_p, rtol=1e-5, atol=1e-6)
    assert val_f.item() == pytest.approx(val_p.item(), rel=1e-5)
    assert val_f.item() == pytest.approx(loss_p.item(), rel=1e-5)  # one batch: validation NLL = training loss


def test_gpt2_flops_hand_computed():
    from models.gpt2 import GPT2

    model = GPT2(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    # tied embeddings once, without the 128 - 50 padding rows; no position table
    n = sum(p.numel() for p in model.parameters()) - 16 * 32 - (128 - 50) * 32
    b, t = 3, 16
    # 6 N per token + 12 L H Q T per token of a full sequence, halved for causal: 6 L H Q T^2 per sequence
    expected = 6 * n * b * t + 6 * 2 * 4 * 8 * b * t * t
    assert model_flops(model, b * t, b * t * t) == pytest.approx(expected, rel=1e-12)
    assert model_flops(torch.nn.Linear(2, 2), 10, 100) is None  # a model that does not say: no MFU
    assert transformer_flops(n, 2, 4, 8, b * t, b * t * t, causal=False) == 6 * n * b * t + 12 * 2 * 4 * 8 * b * t * t


@pytest.mark.parametrize("decay,values", [
    # warmup 10 to step 9, decay over steps 10..110, min ratio 0.1 (power 2 for poly)
    ("cosine", {0: 0.1, 9: 1.0, 60: 0.55, 110: 0.1, 500: 0.1}),
    ("linear", {0: 0.1, 9: 1.0, 35: 1 - 0.9 * 0.25, 60: 0.55, 110: 0.1}),
    ("poly", {0: 0.1, 9: 1.0, 60: 0.1 + 0.9 * 0.25, 85: 0.1 + 0.9 * 0.0625, 110: 0.1}),
    ("constant", {0: 0.1, 9: 1.0, 60: 1.0, 500: 1.0}),
])
def test_schedule_shapes(decay, values):
    for step, v in values.items():
        assert lr_multiplier(step, 10, 110, decay, 0.1, power=2.0) == pytest.approx(v), step
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_schedule(opt, max_steps=110, warmup_steps=10, decay=decay, min_lr_ratio=0.1, power=2.0)
    lrs = []
    for _ in range(111):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for step, v in values.items():
        if step <= 110:
            assert lrs[step] == pytest.approx(2.0 * v), step
    with pytest.raises(ValueError, match="unknown decay"):
        lr_multiplier(20, 10, 110, "step")


def test_scheduler_configs_compose_to_their_decay():
    for name, decay in [("cosine", "cosine"), ("linear", "linear"), ("poly", "poly"), ("constant", "constant")]:
        cfg = compose(f"scheduler={name}", "output_dir=outputs/compose-only")
        assert cfg.scheduler.decay == decay and cfg.scheduler.max_steps == cfg.trainer.max_steps


def test_lamb_and_weight_decay_groups(tmp_path):
    from pytorch_optimizer import Lamb

    from train.run import build

    _, task, _ = build(synthetic_cfg("mlm", tmp_path))
    opt = task.configure_optimizers()["optimizer"]
    assert type(opt) is Lamb
    decay, plain = opt.param_groups
    assert decay["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    owner = {id(p): (n, type(m)) for m in task.model.modules() for n, p in m.named_parameters(recurse=False)}
    assert plain["params"] and all(owner[id(p)][0] == "bias" or owner[id(p)][1] is torch.nn.LayerNorm
                                   for p in plain["params"])
    assert all(p.ndim == 2 for p in decay["params"])  # matrices and embedding tables
    assert len(decay["params"]) + len(plain["params"]) == len(list(task.model.parameters()))


def test_gpt2_adamw_groups_match_the_old_rule():
    from models.gpt2 import GPT2

    model = GPT2(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    decay, plain = param_groups(model)
    params = list(model.parameters())
    # the previous LMTask's groups, in the same order (optimizer state in old checkpoints lines up)
    assert [id(p) for p in decay["params"]] == [id(p) for p in params if p.dim() >= 2]
    assert [id(p) for p in plain["params"]] == [id(p) for p in params if p.dim() < 2]
    opt = LMTask(model).configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[1]["weight_decay"] == 0.0


def test_synthetic_resume_continues_the_same_curve(tmp_path):
    from train.run import train

    common = ["trainer.max_steps=8", "callbacks.checkpoint.every_n_train_steps=4", "trainer.log_every_n_steps=1",
              "trainer.limit_val_batches=2", "eval_every_steps=8", "scheduler.warmup_steps=3", "test_after_fit=false"]
    train(synthetic_cfg("classification", tmp_path / "a", *common))
    ckpt = tmp_path / "a" / "checkpoints" / "step0000004.ckpt"
    trainer_b, _ = train(synthetic_cfg("classification", tmp_path / "b", *common, f"ckpt_path={ckpt}"))
    assert trainer_b.global_step == 8
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    loss_a, loss_b = series(a, "train/loss"), series(b, "train/loss")
    assert sorted(loss_b) == [4, 5, 6, 7]
    for step in loss_b:  # same samples, same dropout masks, same optimizer and LR state
        assert loss_b[step] == pytest.approx(loss_a[step], rel=1e-5), step
    assert series(b, "val/acc")[7] == series(a, "val/acc")[7]
    assert series(b, "val/loss")[7] == pytest.approx(series(a, "val/loss")[7], rel=1e-5)


# ---- the synthetic data ---------------------------------------------------------------------------
def test_examples_are_pure_functions_of_seed_split_index():
    a = CountingExamples(100, 7, 0, vocab_size=64, seq_len=40)
    b = CountingExamples(100, 7, 0, vocab_size=64, seq_len=40)
    assert all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in (0, 5, 99))
    assert not torch.equal(a[5]["input_ids"], CountingExamples(100, 7, 1, vocab_size=64, seq_len=40)[5]["input_ids"])
    lens = {int(a[i]["attention_mask"].sum()) for i in range(100)}
    assert min(lens) >= 20 and max(lens) <= 40 and len(lens) > 10  # natural lengths, real padding


def test_counting_and_retrieval_labels_follow_the_rule():
    ex = CountingExamples(200, 1, 0, vocab_size=64, seq_len=48, num_classes=3, max_count=6)
    labels = []
    for i in range(200):
        e = ex[i]
        ids = e["input_ids"][e["attention_mask"]]
        counts = torch.stack([(ids == FIRST + c).sum() for c in range(3)])
        assert ids[0] == CLS and int(e["labels"]) == int(counts.argmax()) and (counts == counts.max()).sum() == 1
        labels.append(int(e["labels"]))
    assert all(30 < labels.count(c) < 110 for c in range(3))
    rx = RetrievalExamples(200, 1, 0, vocab_size=64, seq_len=32, n_keys=8, repeats=3)
    same = 0
    for i in range(200):
        e = rx[i]
        k1 = set(e["input_ids"][(e["input_ids"] >= FIRST) & (e["input_ids"] < FIRST + 8)].tolist())
        k2 = set(e["input_ids_2"][(e["input_ids_2"] >= FIRST) & (e["input_ids_2"] < FIRST + 8)].tolist())
        assert len(k1) == len(k2) == 1 and int(e["labels"]) == (k1 == k2)
        same += int(e["labels"])
    assert 70 < same < 130


@pytest.mark.parametrize("nsp", [False, True])
def test_masked_lm_examples(nsp):
    ex = MaskedLMExamples(300, 3, 0, vocab_size=100, seq_len=64, nsp=nsp, max_predictions=10)
    masked = total = 0
    for i in range(300):
        e = ex[i]
        n = int(e["attention_mask"].sum())
        used = e["mlm_labels"] != IGNORE
        k = int(used.sum())
        assert 1 <= k <= 10 and bool(used[:k].all()) and not bool(used[k:].any())
        pos = e["mlm_positions"][:k]
        assert bool((pos > 0).all()) and bool((pos < n).all()) and bool((pos[1:] > pos[:-1]).all())
        assert bool((e["mlm_labels"][:k] >= FIRST).all())  # only content tokens are predicted
        masked += int((e["input_ids"][pos] == MASK).sum())
        total += k
        assert ("nsp_labels" in e) == nsp
        if nsp:
            assert int(e["token_type_ids"][:n].max()) == 1 and int(e["token_type_ids"][n:].sum()) == 0
    assert 0.7 < masked / total < 0.9  # 80% [MASK]


def test_eval_shards_cover_every_sample_once():
    from train.data import ShardSampler

    seen = sorted(i for r in range(3) for i in ShardSampler(10, r, 3))
    assert seen == list(range(10)) and len(ShardSampler(10, 2, 3)) == 3


def test_classification_task_logs_test_split_metrics_exactly():
    torch.manual_seed(0)
    task = ClassificationTask(torch.nn.Linear(2, 2))
    logits, labels = torch.randn(7, 3), torch.randint(0, 3, (7,))
    m = task.split_metrics["val"]
    m["acc"].update(logits[:4], labels[:4])
    m["acc"].update(logits[4:], labels[4:])  # a short last batch weighs 3 examples, not half
    assert m["acc"].compute().item() == pytest.approx((logits.argmax(-1) == labels).double().mean().item())
