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
        return compose("config", overrides=[*overrides, "output_dir=/tmp/unused"])


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
