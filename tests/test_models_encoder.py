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


@pytest.mark.parametrize("kind", ["standard", "flash"])
def test_narrow_attention_width(kind, device):
    """attn_dim (LRA's qkv_dim) narrower than d_model: q, k, v and the heads use it, the residual stream keeps
    d_model; a padded batch still equals each sequence alone, and the FLOP count uses the narrow head dim."""
    torch.manual_seed(0)
    model = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=SEQLEN, d_model=32, n_layer=2, n_head=2,
                               attn_dim=16, attention_factory=KINDS[kind]).to(device).eval()
    attn = model.transformer.blocks[0].attn
    assert attn.qkv.weight.shape == (3 * 16, 32) and attn.out.weight.shape == (32, 16)
    ids, mask = _batch(40, device)
    with torch.no_grad():
        batched = model(ids, mask)
        alone = torch.cat([model(ids[b:b + 1, :n]) for b, n in enumerate(LENGTHS)])
    torch.testing.assert_close(batched, alone, atol=2e-5, rtol=1e-4)
    assert model.flops(40, 1000) == 6 * model.num_params() * 40 + 12 * 2 * 2 * 8 * 1000  # 2 heads of 16 / 2 = 8
    with pytest.raises(ValueError, match="attention width 18 is not a multiple of the 4 heads"):
        SequenceClassifier(vocab_size=40, num_classes=3, d_model=32, n_head=4, attn_dim=18)


def test_flops_count_only_the_blocks_block_sparse_computes():
    # local window 1, 4 blocks of 16: blocks kept (i, j) with |i - j| <= 1, 10 of 16; MFU counts those.
    core = functools.partial(BlockSparseAttention, pattern="local", block_size=16, window=1)
    model = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=64, d_model=32, n_layer=2, n_head=4,
                               attention_factory=core)
    n = model.num_params()
    assert model.flops(2 * 64, 2 * 64 * 64) == 6 * n * 128 + 12 * 2 * 4 * 8 * 2 * 64 * 64 * 10 / 16
    dense = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=64, d_model=32, n_layer=2, n_head=4,
                               attention_factory=FlashAttention)
    assert dense.flops(2 * 64, 2 * 64 * 64) == 6 * n * 128 + 12 * 2 * 4 * 8 * 2 * 64 * 64


def test_too_long_input_names_the_limit():
    model = SequenceClassifier(vocab_size=40, num_classes=3, max_positions=16, d_model=32, n_layer=1, n_head=2)
    with pytest.raises(ValueError, match="exceeds the 16 positions"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---- activation checkpointing ----------------------------------------------------------------------
def _loss_and_grads(model, ids, mask, labels):
    torch.manual_seed(7)  # the dropout masks; the recompute must draw the same ones
    loss = torch.nn.functional.cross_entropy(model(ids, mask), labels)
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return loss.detach(), grads


@pytest.mark.parametrize("kind,padded", [
    ("standard", False), ("standard", True),
    # the Triton kernels take about a minute here under the CPU interpreter
    pytest.param("flash", False, marks=pytest.mark.slow), pytest.param("flash", True, marks=pytest.mark.slow)])
def test_activation_checkpointing_same_loss_and_gradients(kind, padded, device):
    """Recomputing each block in the backward changes nothing: same loss, same gradients, dropout on
    (torch's in the blocks and, for flash, the kernel's own mask drawn from torch's generator)."""
    torch.manual_seed(0)
    kw = dict(vocab_size=40, num_classes=3, max_positions=SEQLEN, d_model=32, n_layer=2, n_head=2, dropout=0.1,
              attn_dropout=0.1, attention_factory=KINDS[kind])
    plain = SequenceClassifier(**kw).to(device).train()
    ckpt = SequenceClassifier(**kw, activation_checkpointing=True).to(device).train()
    ckpt.load_state_dict(plain.state_dict())
    ids, mask = _batch(40, device)
    mask = mask if padded else None
    labels = torch.tensor([0, 2, 1], device=device)
    loss_a, grads_a = _loss_and_grads(plain, ids, mask, labels)
    loss_b, grads_b = _loss_and_grads(ckpt, ids, mask, labels)
    assert loss_a > 0
    torch.testing.assert_close(loss_b, loss_a, rtol=0, atol=0)
    for (name, _), ga, gb in zip(plain.named_parameters(), grads_a, grads_b):
        torch.testing.assert_close(gb, ga, rtol=1e-6, atol=1e-7, msg=name)


def test_activation_checkpointing_keeps_fewer_tensors_for_the_backward():
    """What the option is for: standard attention's seqlen^2 probabilities are no longer saved per layer."""
    def saved_bytes(model, ids):
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids).sum()
        return total[0]

    torch.manual_seed(0)
    kw = dict(vocab_size=40, num_classes=3, max_positions=256, d_model=32, n_layer=4, n_head=2)
    ids = torch.randint(0, 40, (2, 256))
    plain, ckpt = SequenceClassifier(**kw).train(), SequenceClassifier(**kw, activation_checkpointing=True).train()
    scores = 2 * 2 * 256 * 256 * 4  # batch x heads x seqlen^2 float32, one layer's probabilities
    assert saved_bytes(plain, ids) > 4 * scores > saved_bytes(ckpt, ids)


def test_lra_classifiers_draw_the_token_table_from_a_unit_normal():
    """LRA's encoders (nn.Embed, normal(stddev=1.0)): every LRA model config builds its classifier so, and
    the default stays BERT's 0.02 for the other encoders."""
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    torch.manual_seed(0)
    for task in ("listops", "text", "retrieval", "image", "pathfinder"):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment=lra/{task}", "output_dir=outputs/compose-only"])
        assert cfg.model.embedding_std == 1.0
    model = SequenceClassifier(vocab_size=256, num_classes=2, max_positions=16, d_model=64, n_layer=1, n_head=2,
                               embedding_std=1.0)
    assert 0.9 < model.embed.word.weight.std().item() < 1.1
    assert model.head[0].weight.std().item() < 0.03  # the rest keeps the 0.02 init
    default = SequenceClassifier(vocab_size=256, num_classes=2, max_positions=16, d_model=64, n_layer=1, n_head=2)
    assert default.embed.word.weight.std().item() < 0.03
