"""Config composition: the attn group contract, clear errors for bad choices, experiment inheritance."""
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from hydra.utils import instantiate

from train.config import CONFIG_DIR, register_resolvers

REPO = Path(__file__).resolve().parent.parent
register_resolvers()


def cfg_for(*overrides):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[*overrides, "output_dir=outputs/compose-only"])


def test_unknown_attn_lists_the_choices_on_the_command_line():
    p = subprocess.run([sys.executable, "train/run.py", "attn=nope"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0
    err = p.stderr + p.stdout
    assert "Could not find 'attn/nope'" in err
    assert "Available options in 'attn'" in err
    for choice in ("standard", "sdpa", "flash"):
        assert f"\t{choice}\n" in err


def test_unknown_choice_in_compose_api():
    with pytest.raises(MissingConfigException, match="(?s)Available options.*sdpa.*standard"):
        cfg_for("attn=nope")


@pytest.mark.parametrize("name,cls", [("standard", "StandardAttention"), ("sdpa", "SDPAttention"),
                                      ("flash", "FlashAttention")])
def test_attn_configs_are_partials_of_the_interface(name, cls):
    import kernels.attention as ka

    factory = instantiate(cfg_for(f"attn={name}").attn)
    core = factory(dropout=0.1)
    assert type(core) is getattr(ka, cls) and core.dropout == 0.1


def test_model_sizes_and_experiment_inheritance():
    small, medium = cfg_for("model=gpt2").model, cfg_for("model=gpt2-medium").model
    assert (small.n_layer, small.n_embd, small.n_head, small.n_positions, small.vocab_size) == (12, 768, 12, 1024, 50257)
    assert (medium.n_layer, medium.n_embd, medium.n_head) == (24, 1024, 16)
    e = cfg_for("experiment=gpt2/medium-corpus", "attn=sdpa")
    assert e.model.n_layer == 24 and e.optimizer.lr == 1.5e-4 and e.global_batch_size == 512
    assert e.data.batch_size == 8 and e.data.source == "corpus" and e.attn._target_.endswith("SDPAttention")
    s = cfg_for("experiment=gpt2/small-corpus")
    assert s.optimizer.lr == 6e-4 and s.optimizer.weight_decay == 0.1 and list(s.optimizer.betas) == [0.9, 0.95]
    assert s.optimizer.eps == 1e-8 and s.scheduler.warmup_steps == 2000 and s.scheduler.min_lr_ratio == 0.1
    assert s.trainer.gradient_clip_val == 1.0 and s.data.val_fraction == 0.005


def test_global_batch_must_divide(tmp_path):
    from train.run import build

    cfg = cfg_for("debug=smoke", "global_batch_size=5")
    with pytest.raises(ValueError, match="not a multiple"):
        build(cfg)


EXPERIMENTS = sorted(str(p.relative_to(REPO / "configs" / "experiment").with_suffix(""))
                     for p in (REPO / "configs" / "experiment").rglob("*.yaml"))


def test_experiments_live_in_family_folders():
    assert {"gpt2/small-corpus", "gpt2/medium-corpus", "gpt2/small-embedded",
            "synthetic/mlm", "synthetic/classification", "synthetic/retrieval"} <= set(EXPERIMENTS)
    assert all("/" in e for e in EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_alone_and_with_smoke(name):
    full, smoke = cfg_for(f"experiment={name}"), cfg_for(f"experiment={name}", "debug=smoke")
    for cfg in (full, smoke):
        assert {"task", "model", "data", "optimizer", "scheduler", "trainer"} <= set(cfg)
        assert cfg.optimizer._partial_ and cfg.scheduler._partial_
        assert cfg.data.seq_len in (cfg.model.get("n_positions"), cfg.model.get("max_positions"))
    # debug=smoke shrinks whichever model the experiment picked, through its own sizes file
    assert smoke.model.n_layer <= 2 and smoke.trainer.max_steps == 20 and smoke.data.batch_size == 2
    assert smoke.model._target_ == full.model._target_ and smoke.task._target_ == full.task._target_
    width = lambda m: m.get("n_embd", m.get("d_model"))  # noqa: E731
    assert width(smoke.model) <= width(full.model)  # LRA's own image model is already smoke-sized (32 wide)


def test_task_model_and_data_of_each_family():
    lm = cfg_for()
    assert lm.task._target_ == "train.task.LMTask" and lm.optimizer._target_ == "train.optim.adamw"
    assert lm.scheduler.decay == "cosine"
    mlm = cfg_for("experiment=synthetic/mlm")
    assert mlm.task._target_ == "train.task.MLMTask" and mlm.optimizer._target_ == "pytorch_optimizer.Lamb"
    assert mlm.scheduler.decay == "poly" and mlm.scheduler.power == 1.0 and mlm.data.nsp is True
    ret = cfg_for("experiment=synthetic/retrieval")
    assert ret.task._target_ == "train.task.ClassificationTask" and ret.model.two_inputs is True
    assert ret.data._target_.endswith("SyntheticRetrieval")


def test_ddp_trainer_config():
    from train.run import world_size

    cfg = cfg_for("trainer=ddp")
    assert cfg.trainer.devices == 2 and cfg.trainer.strategy._target_.endswith("DDPStrategy")
    assert cfg.trainer.use_distributed_sampler is False
    assert world_size(cfg.trainer) == 2 and world_size({"devices": [0, 1, 2], "num_nodes": 2}) == 6
