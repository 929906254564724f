"""Long context (Path-X, Path-256): the experiment configs, the curriculum (init_from with learned positions
interpolated in 2D), chained runs (a run split over invocations equals an unsplit one; calls.csv)."""
import csv
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from models.encoder import SequenceClassifier
from models.layers import load_resizing_positions, resize_positions_2d
from train.config import CONFIG_DIR, register_resolvers

REPO = Path(__file__).resolve().parent.parent
register_resolvers()


def cfg_for(*overrides, out="outputs/compose-only"):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[*overrides, f"output_dir={out}"])


# ------------------------------------------------------------------------------ configs

@pytest.mark.parametrize("name,res,attn,batch", [("pathfinder64", 64, "FlashAttention", 256),
                                                 ("pathx", 128, "FlashAttention", 64),
                                                 ("path256", 256, "BlockSparseAttention", 32)])
def test_experiments_share_one_model_at_r_squared_tokens(name, res, attn, batch):
    cfg = cfg_for(f"experiment=lra/{name}")
    assert cfg.model.max_positions == cfg.data.seq_len == res * res
    assert cfg.data.data_dir.endswith(f"data/cache/lra/pathfinder{res}-hard") and cfg.data.batch_size == batch
    assert cfg.attn._target_ == f"kernels.attention.{attn}"
    assert cfg.model.positions == "learned" and cfg.model.pooling == "mean"  # a pure R x R grid, no [CLS]
    base = cfg_for("experiment=lra/pathx").model
    assert {k: v for k, v in cfg.model.items() if k != "max_positions"} == \
        {k: v for k, v in base.items() if k != "max_positions"}
    if name != "pathfinder64":  # the curriculum: later stages start from Path-64
        assert cfg.init_from.endswith("outputs/longctx/path64/checkpoints/last.ckpt")
    smoke = cfg_for(f"experiment=lra/{name}", "debug=smoke")
    assert smoke.init_from is None and smoke.attn._target_.endswith("StandardAttention")
    assert smoke.model.max_positions == smoke.data.seq_len == 1024 and smoke.data.auto_prepare.resolution == 32
    assert cfg_for(f"experiment=lra/{name}", "debug=smoke", "attn=flash").attn._target_.endswith("FlashAttention")


def test_configs_cite_the_paper():
    text = {n: (REPO / "configs" / "experiment" / "lra" / f"{n}.yaml").read_text() for n in ("pathx", "path256")}
    assert "61.4%" in text["pathx"] and "Table 6" in text["pathx"]
    assert "63.1%" in text["path256"] and "Table 6" in text["path256"]


def test_path256_layout_at_64k():
    cfg = cfg_for("experiment=lra/path256")
    core = instantiate(cfg.attn)(dropout=0.0)
    assert (core.pattern, core.block_size, core.pattern_kwargs) == (["butterfly", "local"], 128, {"window": 2})
    lay = core.layout(65536, 65536, "cpu")
    per_row = lay.blocks[0].sum(1)
    assert per_row.max() == 12 and lay.density() == pytest.approx(12 / 512, abs=2e-4)  # the config's numbers
    # the row above and below every pixel: blocks i - 2 and i + 2 (256 tokens = one image row of 256)
    i = torch.arange(2, 510)
    assert lay.blocks[0, i, i - 2].all() and lay.blocks[0, i, i + 2].all()
    for name in ("pathx", "pathfinder64"):  # the shorter stages' layouts build too
        instantiate(cfg_for(f"experiment=lra/{name}", "attn=blocksparse").attn)(dropout=0.0)


@pytest.mark.parametrize("name", ["pathfinder64", "pathx", "path256"])
def test_smoke_runs_train_validate_and_test(tmp_path, name):
    """debug=smoke for each experiment, two steps (the CLI's full 20 take about a minute each here)."""
    from train.run import train

    trainer, _ = train(cfg_for(f"experiment=lra/{name}", "debug=smoke", "trainer.enable_progress_bar=false",
                               "trainer.max_steps=2", "eval_every_steps=2", "trainer.limit_val_batches=1",
                               "trainer.limit_test_batches=1", out=tmp_path))
    assert trainer.global_step == 2 and "test/acc" in trainer.callback_metrics
    assert any(r.get("val/acc") for r in rows(tmp_path / "metrics.csv"))
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and (tmp_path / "calls.csv").exists()


# ------------------------------------------------------------------------------ curriculum

def small(res, **kw):
    torch.manual_seed(res)
    return SequenceClassifier(vocab_size=256, num_classes=2, max_positions=res * res, d_model=16, n_layer=2,
                              n_head=2, d_ff=32, pooling="mean", positions="learned", **kw)


def test_resize_positions_is_2d_row_major():
    # channel 0 = row, channel 1 = column: after resizing, channel 0 depends only on the new row
    r0, r1 = 8, 16
    rows, cols = torch.meshgrid(torch.arange(float(r0)), torch.arange(float(r0)), indexing="ij")
    table = torch.stack([rows, cols], -1).reshape(r0 * r0, 2)
    out = resize_positions_2d(table, r1 * r1).reshape(r1, r1, 2)
    assert torch.allclose(out[..., 0], out[:, :1, 0].expand(r1, r1), atol=1e-5)   # constant along a row
    assert torch.allclose(out[..., 1], out[:1, :, 1].expand(r1, r1), atol=1e-5)   # constant down a column
    assert (out[1:, 0, 0] >= out[:-1, 0, 0]).all() and out[-1, 0, 0] > out[0, 0, 0]
    # the same as resampling the grid by hand
    ref = torch.nn.functional.interpolate(table.reshape(r0, r0, 2).permute(2, 0, 1)[None], size=(r1, r1),
                                          mode="bicubic", align_corners=False)[0].permute(1, 2, 0).reshape(-1, 2)
    torch.testing.assert_close(out.reshape(-1, 2), ref)
    assert torch.equal(resize_positions_2d(table, r0 * r0), table)  # same size: unchanged
    with pytest.raises(ValueError, match="square pixel grids"):
        resize_positions_2d(table, 1 + 16 * 16)


def test_init_from_res8_into_res16(tmp_path):
    """Train-free: a model at 8x8 saved, loaded into one at 16x16: positions interpolated, the rest equal."""
    from train.run import init_from_checkpoint

    src, dst = small(8), small(16)
    # a Lightning checkpoint of train/run.py holds the task's state: the model under `model.`
    torch.save({"state_dict": {f"model.{k}": v for k, v in src.state_dict().items()}, "global_step": 7},
               tmp_path / "res8.ckpt")
    resized = init_from_checkpoint(dst, tmp_path / "res8.ckpt")
    assert resized == {"embed.position.weight": (64, 256)}
    want = resize_positions_2d(src.embed.position.weight, 256)
    torch.testing.assert_close(dst.embed.position.weight, want, rtol=0, atol=0)
    assert dst.embed.position.weight.shape == (256, 16)
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        if name != "embed.position.weight":
            assert torch.equal(a, b), name
    # a plain state dict file works too; the model then runs at 16x16
    torch.save(src.state_dict(), tmp_path / "plain.pt")
    init_from_checkpoint(small(16), tmp_path / "plain.pt")
    assert dst(torch.randint(0, 256, (2, 256))).shape == (2, 2)


def test_init_from_errors(tmp_path):
    from train.run import init_from_checkpoint

    with pytest.raises(FileNotFoundError, match="train the smaller resolution first"):
        init_from_checkpoint(small(16), tmp_path / "nothing.ckpt")
    wide = SequenceClassifier(vocab_size=256, num_classes=2, max_positions=64, d_model=32, n_layer=2, n_head=2,
                              d_ff=32, positions="learned")
    torch.save(wide.state_dict(), tmp_path / "wide.pt")
    with pytest.raises(ValueError, match=r"embed\.word\.weight: checkpoint \(256, 32\), model \(256, 16\)"):
        init_from_checkpoint(small(16), tmp_path / "wide.pt")
    with pytest.raises(ValueError, match=r"missing \['transformer\.blocks\.1\."):
        load_resizing_positions(small(16), {k: v for k, v in small(8).state_dict().items() if ".1." not in k})
    sinus = SequenceClassifier(vocab_size=256, num_classes=2, max_positions=64, d_model=16, n_layer=2, n_head=2,
                               d_ff=32, positions="sinusoidal")
    with pytest.raises(ValueError, match=r"missing \['embed\.position\.weight'\]"):
        load_resizing_positions(small(8), sinus.state_dict())


# ------------------------------------------------------------------------------ chained runs

TINY = ["experiment=lra/pathx", "debug=smoke", "trainer.enable_progress_bar=false", "model.d_model=16",
        "model.n_layer=1", "model.n_head=1", "model.d_ff=16", "trainer.log_every_n_steps=1", "eval_every_steps=3",
        "trainer.limit_val_batches=1", "test_after_fit=false"]


def run(out, *overrides):
    from train.run import train

    return train(cfg_for(*TINY, *overrides, out=out))


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def train_losses(path):
    return {int(r["step"]): float(r["train/loss"]) for r in rows(path) if r.get("train/loss")}


def test_chained_run_equals_unsplit_run(tmp_path):
    """6 steps in one call vs 4 + 2 in two calls of the same command (ckpt_path=last), on the Pathfinder
    datamodule: same loss at every step (same data order, dropout, optimizer, schedule), same final weights,
    a calls.csv row per call, the first call's metrics.csv kept. Checkpoints every 2 steps, so the second
    call resumes from the stop checkpoint, not one ModelCheckpoint wrote at the end."""
    common = ["trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=2", "ckpt_path=last"]
    a, b = tmp_path / "a", tmp_path / "b"
    run(a, *common)
    trainer, _ = run(b, *common, "callbacks.calls.max_steps=3")
    assert trainer.global_step == 3
    trainer, _ = run(b, *common)
    assert trainer.global_step == 6
    unsplit = train_losses(a / "metrics.csv")
    split = {**train_losses(b / "metrics.part1.csv"), **train_losses(b / "metrics.csv")}
    assert sorted(split) == sorted(unsplit) == list(range(6))
    assert split == unsplit  # float-exact on the CPU
    wa = torch.load(a / "checkpoints" / "last.ckpt", weights_only=False)
    wb = torch.load(b / "checkpoints" / "last.ckpt", weights_only=False)
    assert wa["global_step"] == wb["global_step"] == 6
    assert all(torch.equal(wa["state_dict"][k], wb["state_dict"][k]) for k in wa["state_dict"])
    calls = rows(b / "calls.csv")
    assert [(c["call"], c["start_step"], c["end_step"], c["status"]) for c in calls] == [
        ("1", "0", "3", "stopped: max_steps"), ("2", "3", "6", "finished")]
    assert calls[0]["resumed_from"] == "" and calls[1]["resumed_from"].endswith("checkpoints/last.ckpt")
    assert all(c["started_utc"] and c["ended_utc"] and float(c["wall_s"]) > 0 and c["device"]
               and c["software"].startswith("torch ") for c in calls)
    assert [c["status"] for c in rows(a / "calls.csv")] == ["finished"]

    # the curriculum through run.py: this 32x32 checkpoint starts a 64x64 model (positions 1,024 -> 4,096)
    from train.run import build

    _, task, _ = build(cfg_for(*TINY, "model.max_positions=4096", f"init_from={b / 'checkpoints' / 'last.ckpt'}",
                               out=tmp_path / "c"))
    assert task.model.embed.position.weight.shape == (4096, 16)
    src = {k[len("model."):]: v for k, v in wb["state_dict"].items() if k.startswith("model.")}
    want = resize_positions_2d(src["embed.position.weight"], 4096)
    torch.testing.assert_close(task.model.embed.position.weight, want)
    assert torch.equal(task.model.head[0].weight, src["head.0.weight"])
    # resuming ignores init_from (the checkpoint holds the weights)
    _, task, _ = build(cfg_for(*TINY, "init_from=/nonexistent.ckpt", "ckpt_path=last", out=b))


def test_time_budget_stops_a_call_with_a_checkpoint(tmp_path):
    # an earlier call killed from outside left its row "running"
    (tmp_path / "calls.csv").write_text("call,start_step,status\n1,0,running\n")
    trainer, _ = run(tmp_path, "trainer.max_steps=50", "callbacks.checkpoint.every_n_train_steps=100",
                     "callbacks.calls.budget_s=0", "ckpt_path=last")  # the chained command, no checkpoint yet
    assert trainer.global_step == 1
    killed, call = rows(tmp_path / "calls.csv")
    assert killed["status"] == "killed (no end recorded)" and call["call"] == "2"
    assert (call["start_step"], call["end_step"], call["status"]) == ("0", "1", "stopped: budget_s")
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
    assert not math.isnan(float(call["wall_s"]))
