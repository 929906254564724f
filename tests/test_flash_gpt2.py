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


def test_gpt2_standard_matched_follows_flash_with_dropout(device):
    """attn=standard-matched draws the flash kernel's attention dropout masks and takes the same draws from
    torch's generator, so with every dropout on (attention, residual, embedding) GPT-2 trains on the same curve
    as attn=flash, while plain attn=standard's curve is another one (other masks everywhere)."""
    matched = attn_factory("standard-matched")
    assert matched(dropout=0.1).kernel_dropout_mask
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    drop = dict(embd_pdrop=0.1, attn_pdrop=0.3, resid_pdrop=0.1)
    flash, _ = smoke_losses(attn_factory("flash"), device, dtype, **drop)
    got, _ = smoke_losses(matched, device, dtype, **drop)
    plain, _ = smoke_losses(attn_factory("standard"), device, dtype, **drop)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert got == pytest.approx(flash, abs=tol), (got, flash)
    if dtype == torch.float32:  # without matched masks the curves part by far more than rounding
        assert max(abs(a - b) for a, b in zip(plain, flash)) > 10 * tol


def test_matched_standard_attention_packed_equals_flash_varlen(device):
    """The packed path (BERT, LRA): standard re-pads, and sequence b of the pack draws batch index b's mask,
    as the varlen kernel does; outputs and gradients agree, and both take one draw from the generator."""
    from kernels.padding import PackedBatch, unpad

    lengths, n, h, d, p = [40, 7, 23], 40, 2, 16, 0.3
    mask = torch.arange(n, device=device)[None] < torch.tensor(lengths, device=device)[:, None]
    packed = PackedBatch.from_mask(mask)
    g = torch.Generator().manual_seed(0)
    q, k, v = (unpad(torch.randn(len(lengths), n, h, d, generator=g).to(device), packed).requires_grad_()
               for _ in range(3))
    results = []
    for core in (FlashAttention(dropout=p), StandardAttention(dropout=p, kernel_dropout_mask=True)):
        torch.manual_seed(3)
        out = core.train()(q, k, v, packed=packed)
        after = torch.randint(0, 2**30, (1,), device=device)  # the generator's next draw
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v)), after))
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_matched_standard_attention_needs_the_kernel(monkeypatch):
    import kernels.launch

    monkeypatch.setattr(kernels.launch, "_interpreting", lambda: False)  # a CPU without the interpreter
    x = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="needs CUDA tensors .* or TRITON_INTERPRET=1"):
        StandardAttention(dropout=0.1, kernel_dropout_mask=True).train()(x, x, x)
    StandardAttention(dropout=0.1, kernel_dropout_mask=True).eval()(x, x, x)  # no dropout, no kernel
