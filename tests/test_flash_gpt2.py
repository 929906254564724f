"""attn=flash inside GPT-2: built from configs/attn/flash.yaml, a few training steps match attn=standard
for the same seed (CPU under the interpreter with tiny sizes; the same test runs on the GPU in bf16)."""
import pytest
import torch

from kernels.attention import FlashAttention, StandardAttention
from models.gpt2 import GPT2, GPT2Config

TINY = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=2, embd_pdrop=0.0, attn_pdrop=0.0,
            resid_pdrop=0.0)


def attn_factory(name):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from train.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"attn={name}"])
    return instantiate(cfg.attn)


def smoke_losses(factory, device, dtype, steps=3, **overrides):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**{**TINY, **overrides}), factory).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, TINY["vocab_size"], (2, TINY["n_positions"]), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    losses = []
    for _ in range(steps):
        with torch.autocast(device_type=device, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, TINY["vocab_size"]),
                                                 ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_gpt2_flash_matches_standard_loss(device):
    flash = attn_factory("flash")
    assert isinstance(flash(dropout=0.1), FlashAttention)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    got, model = smoke_losses(flash, device, dtype)
    ref, _ = smoke_losses(attn_factory("standard"), device, dtype)
    assert isinstance(model.transformer.blocks[0].attn.core, FlashAttention)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert got == pytest.approx(ref, abs=tol), (got, ref)
    assert got[-1] < got[0]  # it trains


def test_gpt2_flash_attention_dropout_only_in_training(device):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**{**TINY, "attn_pdrop": 0.5}), attn_factory("flash")).to(device)
    ids = torch.randint(0, TINY["vocab_size"], (1, 16), device=device)
    model.eval()
    assert torch.equal(model(ids), model(ids))
    assert model.transformer.blocks[0].attn.core.dropout_p == 0.0
    model.train()
    assert not torch.equal(model(ids), model(ids))  # fused attention dropout draws a new mask per call
    assert isinstance(StandardAttention(), torch.nn.Module)
