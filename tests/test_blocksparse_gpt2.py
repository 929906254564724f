"""attn=blocksparse inside GPT-2: built from configs/attn/blocksparse.yaml, checked against the same
model whose attention is plain PyTorch with the token-level block mask (CPU, interpreter, tiny sizes)."""
import pytest
import torch

from kernels.attention import Attention, BlockSparseAttention
from kernels.standard import standard_attention
from models.gpt2 import GPT2, GPT2Config

TINY = dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=2, embd_pdrop=0.0, attn_pdrop=0.0,
            resid_pdrop=0.0)


def attn_factory_from_config(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from train.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["attn=blocksparse", *overrides])
    return instantiate(cfg.attn)


class MaskedReference(Attention):
    """Standard attention restricted to another BlockSparseAttention's token-level mask."""

    def __init__(self, twin: BlockSparseAttention, dropout=0.0, softmax_scale=None):
        super().__init__(dropout, softmax_scale)
        self.twin = twin

    def forward_padded(self, q, k, v, causal, key_padding_mask):
        mask = self.twin.layout(q.shape[1], k.shape[1], q.device).to_dense().unsqueeze(0)
        return standard_attention(q, k, v, causal=causal, mask=mask)


def test_gpt2_with_blocksparse_config_matches_masked_reference():
    factory = attn_factory_from_config(["attn.pattern=[local,global_local]", "attn.block_size=16",
                                        "+attn.window=1", "+attn.n_global=1"])
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**TINY), factory)
    core = model.transformer.blocks[0].attn.core
    assert isinstance(core, BlockSparseAttention) and core.block_size == 16
    ref = GPT2(GPT2Config(**TINY), lambda dropout: MaskedReference(core, dropout))
    ref.load_state_dict(model.state_dict())

    ids = torch.randint(0, 97, (2, 64), generator=torch.Generator().manual_seed(1))
    losses = []
    for m in (model, ref):
        logits = m(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)
    # One layout per (pattern, lengths, device), shared by every layer and reused by later calls (its
    # compressed tables too).
    layout = core.layout(64, 64, "cpu")
    assert all(b.attn.core.layout(64, 64, "cpu") is layout for b in model.transformer.blocks)
    assert layout._cache


def test_gpt2_learns_a_few_steps_with_butterfly():
    factory = attn_factory_from_config(["attn.block_size=16"])  # the default pattern: butterfly
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**TINY), factory)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 97, (2, 48), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(4):
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.slow
def test_train_entry_point_runs_blocksparse(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "train/run.py", "debug=smoke", "attn=blocksparse", "attn.block_size=16",
                        "model.n_positions=32", "model.n_embd=32", "model.n_head=2", "data.batch_size=2",
                        "trainer.max_steps=2", "trainer.limit_val_batches=1", "eval_every_steps=2",
                        "logger=csv", f"hydra.run.dir={tmp_path}"],
                       cwd=repo, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "metrics.csv").exists()


def test_module_padded_batch_runs_varlen_kernel_and_config_errors(monkeypatch):
    import kernels.blocksparse as bs

    calls = []
    varlen = bs.blocksparse_attn_varlen_func
    monkeypatch.setattr(bs, "blocksparse_attn_varlen_func", lambda *a, **kw: calls.append(1) or varlen(*a, **kw))
    core = BlockSparseAttention(pattern="local", block_size=16, window=0)
    q, k, v = (torch.randn(2, 40, 2, 16) for _ in range(3))
    pad = torch.ones(2, 40, dtype=torch.bool)
    pad[1, 30:] = False
    out = core(q, k, v, causal=True, key_padding_mask=pad)
    assert calls == [1]  # the block-sparse varlen kernel, not a dense fallback
    mask = core.layout(40, 40, "cpu").to_dense().unsqueeze(0) & pad[:, None, None, :]
    ref = standard_attention(q, k, v, causal=True, mask=mask)
    torch.testing.assert_close(out[pad], ref[pad], atol=1e-5, rtol=1e-5)
    assert not out[~pad].any()  # padding rows are zero
    # An all-True padding mask takes the kernel path and gives the same answer.
    full_pad = torch.ones(2, 40, dtype=torch.bool)
    torch.testing.assert_close(core(q, k, v, causal=True, key_padding_mask=full_pad),
                               standard_attention(q, k, v, causal=True, mask=core.layout(40, 40, "cpu")
                                                  .to_dense().unsqueeze(0)), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown block-sparse pattern"):
        BlockSparseAttention(pattern="diagonal")
    with pytest.raises(ValueError, match="unknown options"):
        BlockSparseAttention(pattern="local", windw=2)
