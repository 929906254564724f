"""Encoder models on the shared blocks: a padded batch gives each sequence's own result, for every
attention kind; masked-LM positions, pooling, the two-input form, FLOP accounting."""
import functools

import pytest
import torch

from kernels.attention import BlockSparseAttention, FlashAttention, SDPAttention, StandardAttention
from models.encoder import EncoderForMaskedLM, SequenceClassifier
from models.layers import transformer_flops

KINDS = {
    "standard": StandardAttention,
    "sdpa": SDPAttention,
    "flash": FlashAttention,
    # local windows: a sequence's top-left corner of the padded layout is its own layout
    "blocksparse": functools.partial(BlockSparseAttention, pattern="local", block_size=16, window=1),
}
LENGTHS, SEQLEN = [48, 7, 30], 48


def _batch(vocab, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(LENGTHS), SEQLEN), generator=g).to(device)
    mask = torch.arange(SEQLEN, device=device)[None] < torch.tensor(LENGTHS, device=device)[:, None]
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_classifier_padded_batch_equals_each_sequence_alone(kind, pooling, device):
    torch.manual_seed(0)
    model = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=SEQLEN, d_model=32, n_layer=2, n_head=2,
                               pooling=pooling, attention_factory=KINDS[kind]).to(device).eval()
    ids, mask = _batch(40, device)
    with torch.no_grad():
        batched = model(ids, mask)
        alone = torch.cat([model(ids[b:b + 1, :n]) for b, n in enumerate(LENGTHS)])
    torch.testing.assert_close(batched, alone, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["standard", "flash"])
def test_masked_lm_positions_and_padding(kind, device):
    torch.manual_seed(0)
    model = EncoderForMaskedLM(vocab_size=60, max_positions=SEQLEN, d_model=32, n_layer=2, n_head=2,
                               attention_factory=KINDS[kind]).to(device).eval()
    ids, mask = _batch(60, device)
    types = (torch.arange(SEQLEN, device=device) >= 5).long().expand(len(LENGTHS), -1)
    positions = torch.tensor([[0, 47, 3], [6, 2, 0], [29, 10, 0]], device=device)
    with torch.no_grad():
        full, nsp = model(ids, mask, types)
        at, nsp2 = model(ids, mask, types, masked_positions=positions)
        assert full.shape == (3, SEQLEN, 60) and at.shape == (3, 3, 60) and nsp.shape == (3, 2)
        torch.testing.assert_close(at, full.gather(1, positions[..., None].expand(-1, -1, 60)))
        torch.testing.assert_close(nsp, nsp2)
        for b, n in enumerate(LENGTHS):  # each sequence alone, no padding
            alone, nsp_alone = model(ids[b:b + 1, :n], None, types[b:b + 1, :n])
            torch.testing.assert_close(full[b, :n], alone[0], atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(nsp[b], nsp_alone[0], atol=2e-5, rtol=1e-4)
    assert model.mlm_decoder.weight is model.embed.word.weight


def test_two_input_classifier(device):
    torch.manual_seed(0)
    model = SequenceClassifier(vocab_size=40, num_classes=2, max_positions=SEQLEN, d_model=32, n_layer=1, n_head=2,
                               two_inputs=True, attention_factory=FlashAttention).to(device).eval()
    ids, mask = _batch(40, device)
    ids2, mask2 = _batch(40, device, seed=1)
    with torch.no_grad():
        logits = model(ids, mask, ids2, mask2)
        u = model.transformer(model.embed(ids[:1, :48]))[0].mean(1)
        v = model.transformer(model.embed(ids2[:1, :48]))[0].mean(1)
        torch.testing.assert_close(logits[:1], model.head(torch.cat([u, v, u * v, u - v], -1)), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="two_inputs"):
        model(ids, mask)
    with pytest.raises(ValueError, match="both attention masks"):
        model(ids, mask, ids2)


def test_flops_hand_computed():
    # 6 N per token + 12 L H Q per token per token of its sequence; causal halves the attention term.
    assert transformer_flops(1000, 2, 4, 16, tokens=30, sum_sq_len=500, causal=False) == 6 * 1000 * 30 + 12 * 2 * 4 * 16 * 500
    assert transformer_flops(1000, 2, 4, 16, tokens=30, sum_sq_len=500, causal=True) == 6 * 1000 * 30 + 6 * 2 * 4 * 16 * 500
    model = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=64, d_model=32, n_layer=2, n_head=4)
    n = sum(p.numel() for p in model.parameters()) - 64 * 32  # without the position table
    assert model.num_params() == n
    # Two sequences of 10 and 30 real tokens: 40 tokens, 10^2 + 30^2 = 1000.
    assert model.flops(40, 1000) == 6 * n * 40 + 12 * 2 * 4 * 8 * 1000
    from models.gpt2 import GPT2

    gpt = GPT2(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    assert gpt.flops(32, 2 * 16 * 16) == 6 * gpt.num_params() * 32 + 6 * 2 * 4 * 8 * 512


def test_too_long_input_names_the_limit():
    model = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=16, d_model=32, n_layer=1, n_head=2)
    with pytest.raises(ValueError, match="exceeds the 16 positions"):
        model(torch.zeros(1, 17, dtype=torch.long))
