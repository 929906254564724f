"""GPT-2: HuggingFace checkpoint interchange, GPT-2 details, and attention injection."""
import math

import pytest
import torch

from kernels.attention import SDPAttention, StandardAttention
from models import GPT2, GPT2Config

TINY = dict(vocab_size=101, n_positions=32, n_embd=64, n_layer=2, n_head=4)


def test_hf_checkpoint_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = GPT2.from_pretrained(str(tmp_path / "hf")).eval()
    x = torch.randint(0, TINY["vocab_size"], (2, 23))
    with torch.no_grad():
        ref = hf(x).logits
        torch.testing.assert_close(ours(x), ref, rtol=1e-5, atol=1e-5)
    # Our parameter names are the shared blocks'; under HF's names every key and shape matches.
    hf_names = {k: v for k, v in hf.state_dict().items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert set(ours.hf_state_dict()) == set(hf_names)
    for k, v in hf_names.items():
        assert ours.hf_state_dict()[k].shape == v.shape, k
    # and back: HF reads what we save, with the same function
    ours.save_pretrained(str(tmp_path / "ours"))
    hf2 = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf2(x).logits, ref, rtol=1e-5, atol=1e-5)


def test_from_pretrained_rejects_mismatched_checkpoint(tmp_path):
    m = GPT2(**TINY)
    m.save_pretrained(str(tmp_path))
    from safetensors.torch import load_file, save_file

    sd = load_file(tmp_path / "model.safetensors")
    sd["transformer.extra.weight"] = torch.zeros(1)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected"):
        GPT2.from_pretrained(str(tmp_path))


def test_gpt2_details():
    cfg = GPT2Config(**TINY, embd_pdrop=0.2, attn_pdrop=0.3, resid_pdrop=0.4)
    m = GPT2(cfg)
    assert m.lm_head.weight is m.embed.word.weight  # tied
    assert m.embed.dropout.p == 0.2
    assert all(b.attn.core.dropout == 0.3 for b in m.transformer.blocks)
    assert all(b.dropout1.p == 0.4 and b.dropout2.p == 0.4 for b in m.transformer.blocks)
    # scaled init of the residual projections: std 0.02 / sqrt(2 L) vs 0.02 elsewhere
    big = GPT2(GPT2Config(vocab_size=101, n_positions=32, n_embd=256, n_layer=8, n_head=4))
    std_proj = torch.cat([b.attn.out.weight.flatten() for b in big.transformer.blocks]).std().item()
    std_fc = torch.cat([b.mlp.fc1.weight.flatten() for b in big.transformer.blocks]).std().item()
    assert abs(std_proj - 0.02 / math.sqrt(16)) < 5e-4
    assert abs(std_fc - 0.02) < 1e-3
    # GELU is the tanh approximation (as in GPT-2), not the exact erf form
    mlp = m.transformer.blocks[0].mlp.eval()
    x = torch.randn(3, 64)
    h = x @ mlp.fc1.weight.T + mlp.fc1.bias
    tanh_gelu = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(mlp(x), tanh_gelu @ mlp.fc2.weight.T + mlp.fc2.bias)
    assert GPT2().num_params() == 123_653_376  # GPT-2 small without position embeddings


def test_attention_is_injected_per_layer():
    calls, seen = [], []

    class Recording(StandardAttention):
        def forward(self, q, k, v, causal=False, key_padding_mask=None, packed=None):
            seen.append((tuple(q.shape), causal))
            return super().forward(q, k, v, causal=causal)

    def factory(dropout):
        calls.append(dropout)
        return Recording(dropout=dropout)

    m = GPT2(GPT2Config(**TINY, attn_pdrop=0.05), attention_factory=factory)
    m(torch.randint(0, 101, (2, 9)))
    assert calls == [0.05, 0.05]
    assert seen == [((2, 9, 4, 16), True)] * 2
    assert len({id(b.attn.core) for b in m.transformer.blocks}) == 2  # one core per layer


def test_standard_and_sdpa_agree_and_are_causal():
    torch.manual_seed(0)
    a = GPT2(GPT2Config(**TINY), attention_factory=StandardAttention).eval()
    b = GPT2(GPT2Config(**TINY), attention_factory=SDPAttention).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 101, (2, 20))
    with torch.no_grad():
        la = a(x)
        torch.testing.assert_close(b(x), la, rtol=1e-4, atol=1e-4)
        y = x.clone()
        y[:, 12:] = (y[:, 12:] + 1) % 101  # change the future: the past must not move
        torch.testing.assert_close(a(y)[:, :12], la[:, :12])
        assert not torch.allclose(a(y)[:, 12:], la[:, 12:])


def test_too_long_input_fails():
    with pytest.raises(ValueError, match="exceeds the 32 positions"):
        GPT2(**TINY)(torch.zeros(1, 33, dtype=torch.long))


def test_vocab_padding_is_invisible(tmp_path):
    """The padding rows (for an aligned LM-head matmul) change no logit, get no gradient, and never leave the model."""
    m = GPT2(**TINY)
    assert m.embed.word.weight.shape[0] == 128 and m.config.padded_vocab_size == 128
    x = torch.randint(0, TINY["vocab_size"], (2, 9))
    logits = m(x)
    assert logits.shape == (2, 9, TINY["vocab_size"])
    logits.float().logsumexp(-1).sum().backward()
    assert m.embed.word.weight.grad[TINY["vocab_size"]:].abs().sum() == 0
    assert m.embed.word.weight.grad[: TINY["vocab_size"]].abs().sum() > 0
    m.save_pretrained(str(tmp_path))
    unpadded = GPT2.from_pretrained(str(tmp_path), pad_vocab_multiple=1).eval()
    assert unpadded.embed.word.weight.shape[0] == TINY["vocab_size"]
    assert "pad_vocab_multiple" not in m.config.to_hf_dict()
    with torch.no_grad():
        torch.testing.assert_close(unpadded(x), m.eval()(x))
    assert m.num_params() == unpadded.num_params()
