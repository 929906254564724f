"""The plain-PyTorch baseline and the attention module interface (CPU, fast)."""
import math

import pytest
import torch

from kernels.attention import SDPAttention, StandardAttention
from kernels.standard import causal_mask, standard_attention


def naive(q, k, v, allowed):
    """Per-row loops, float64: an independent check of standard_attention's masking and GQA."""
    b, nq, h, d = q.shape
    group = h // k.shape[2]
    out = torch.zeros(b, nq, h, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(nq):
                keys = allowed[bi, hi, i].nonzero().flatten()
                if len(keys) == 0:
                    continue
                s = (k[bi, keys, hi // group].double() @ q[bi, i, hi].double()) / math.sqrt(d)
                out[bi, i, hi] = torch.softmax(s, 0) @ v[bi, keys, hi // group].double()
    return out


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 5), (3, 7), (7, 3)])
def test_causal_is_bottom_right_and_empty_rows_are_zero(seqlen_q, seqlen_k):
    torch.manual_seed(0)
    q = torch.randn(2, seqlen_q, 4, 8, dtype=torch.float64)
    k = torch.randn(2, seqlen_k, 2, 8, dtype=torch.float64)
    v = torch.randn(2, seqlen_k, 2, 8, dtype=torch.float64)
    out, lse = standard_attention(q, k, v, causal=True, return_lse=True)
    allowed = causal_mask(seqlen_q, seqlen_k).expand(2, 4, seqlen_q, seqlen_k)
    torch.testing.assert_close(out, naive(q, k, v, allowed))
    assert not torch.isnan(out).any()
    empty_rows = ~allowed[0, 0].any(-1)
    assert torch.isinf(lse[:, :, empty_rows]).all() and (out[:, empty_rows] == 0).all()
    assert empty_rows.any() == (seqlen_q > seqlen_k)


def test_explicit_mask_and_dropout_mask():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 6, 2, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(1, 2, 6, 6) > 0.4
    torch.testing.assert_close(standard_attention(q, k, v, mask=mask), naive(q, k, v, mask))
    keep = torch.ones(1, 2, 6, 6, dtype=torch.bool)
    torch.testing.assert_close(
        standard_attention(q, k, v, dropout_p=0.5, dropout_mask=keep), 2 * standard_attention(q, k, v)
    )


@pytest.mark.parametrize("causal", [False, True])
def test_standard_module_matches_sdpa_with_padding(causal):
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 9, 4, 16) for _ in range(3))
    key_padding_mask = torch.arange(9)[None, :] < torch.tensor([[9], [5], [1]])
    a = StandardAttention()(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
    b = SDPAttention()(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_dropout_only_in_training_and_bad_probability():
    core = StandardAttention(dropout=0.5)
    q = torch.randn(1, 8, 2, 4)
    core.eval()
    torch.testing.assert_close(core(q, q, q), StandardAttention()(q, q, q))
    core.train()
    assert not torch.allclose(core(q, q, q), StandardAttention()(q, q, q))
    with pytest.raises(ValueError, match="dropout"):
        StandardAttention(dropout=1.0)


def test_upcast_scores_keeps_the_kernels_precision_in_bfloat16():
    """upcast_scores forms and softmaxes the scores in float32 (as the fused kernels do): against the float64
    reference its bfloat16 output is closer than the plain path's, which rounds the scores to 8 bits; with float32
    inputs it changes nothing, and gradients reach q, k, v in their own dtype."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 64, 2, 32, dtype=torch.float64) * s for s in (3.0, 3.0, 1.0))
    ref = standard_attention(q, k, v, causal=True)
    lo = [x.bfloat16().requires_grad_() for x in (q, k, v)]
    plain = standard_attention(*lo, causal=True)
    upcast = standard_attention(*lo, causal=True, upcast_scores=True)
    assert upcast.dtype == torch.bfloat16
    err = lambda out: (out.double() - ref).abs().max().item()  # noqa: E731
    assert err(upcast) < 0.5 * err(plain), (err(upcast), err(plain))
    upcast.sum().backward()
    assert all(x.grad is not None and x.grad.dtype == torch.bfloat16 for x in lo)
    f32 = [x.float() for x in (q, k, v)]
    assert torch.equal(standard_attention(*f32, causal=True), standard_attention(*f32, causal=True, upcast_scores=True))
    assert "upcast_scores=True" in repr(StandardAttention(upcast_scores=True))
    # Under autocast (how training calls it) the scores must stay float32 too: autocast rounds an einsum's
    # output to 16 bits whatever its inputs, which once made upcast_scores a silent no-op in a GPU run.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for inputs in (f32, [x.detach() for x in lo]):
            plain = standard_attention(*inputs, causal=True)
            upcast = standard_attention(*inputs, causal=True, upcast_scores=True)
            assert upcast.dtype == plain.dtype == torch.bfloat16
            assert err(upcast) < 0.5 * err(plain), (err(upcast), err(plain))
