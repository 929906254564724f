"""Standard attention in plain PyTorch: the paper's baseline and the reference for every kernel test.

It materialises the (seqlen_q x seqlen_k) score matrix in HBM, applies the mask, softmax and dropout,
and multiplies by V, exactly as Algorithm 0 of Dao et al. (2022). Called on float64 inputs it is the
reference the Triton kernels are checked against; called on the training dtype it is `attn=standard`.

Conventions shared with `kernels.flash` and `kernels.blocksparse`:
- q (batch, seqlen_q, nheads, headdim); k, v (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0
  (grouped-query attention: query head h reads key/value head h // (nheads // nheads_k)).
- Causal masking is aligned bottom-right: query i sees key j iff j <= i + seqlen_k - seqlen_q.
- A query row that sees no key returns 0 (and its log-sum-exp is -inf), never NaN.
"""
from __future__ import annotations

import contextlib
import math

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """Bool (seqlen_q, seqlen_k), True where query i may see key j (bottom-right aligned)."""
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols <= rows + (seqlen_k - seqlen_q)


def repeat_kv(x: torch.Tensor, nheads: int) -> torch.Tensor:
    """Expand (batch, seqlen, nheads_k, headdim) to nheads heads for grouped-query attention."""
    nheads_k = x.shape[2]
    if nheads_k == nheads:
        return x
    if nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    return x.repeat_interleave(nheads // nheads_k, dim=2)


def standard_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    upcast_scores: bool = False,
):
    """Attention with the score matrix materialised.

    mask: optional bool tensor broadcastable to (batch, nheads, seqlen_q, seqlen_k), True = allowed;
        combined with `causal`.
    dropout_mask: optional bool keep-mask of shape (batch, nheads, seqlen_q, seqlen_k); when given it is
        used instead of drawing one (tests pass the kernel's own mask to compare exactly).
    upcast_scores: form the scores and softmax them in float32 when the inputs are narrower, as the fused
        kernels keep them on chip; the probabilities go back to v's dtype for the product with V, as the
        kernels' do. Off (the paper's baseline), a bfloat16 run rounds every score to 8 significant bits.
    Returns out (batch, seqlen_q, nheads, headdim), and with return_lse also the log-sum-exp of the
    scaled, masked scores, (batch, nheads, seqlen_q) in float32 or float64.
    """
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k = k.shape[1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    k, v = repeat_kv(k, nheads), repeat_kv(v, nheads)

    # Under autocast the einsum would round the scores to 16 bits again whatever q's dtype, so the upcast
    # turns autocast off for the scores and softmax; the product with V below stays under it, as in the kernels.
    upcast = upcast_scores and (q.element_size() < 4 or torch.is_autocast_enabled(q.device.type))
    with torch.autocast(q.device.type, enabled=False) if upcast else contextlib.nullcontext():
        if upcast:
            q, k = q.float(), k.float()  # the scale then applies in float32 too, as in the kernels
        # Scale q (N x d) rather than the scores (N x N): one pass over the big matrix fewer.
        scores = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
        allowed = None
        if causal:
            allowed = causal_mask(seqlen_q, seqlen_k, q.device)
        if mask is not None:
            allowed = mask if allowed is None else (allowed & mask)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))

        probs = torch.softmax(scores, dim=-1)
        # A fully masked row softmaxes to NaN; it must attend to nothing instead. Causal masking alone
        # empties rows only when seqlen_q > seqlen_k, so the common case pays no extra pass (and no sync).
        if mask is not None or (causal and seqlen_q > seqlen_k):
            probs = probs.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)

        if dropout_mask is not None:
            probs = probs * dropout_mask.to(probs.dtype) / (1.0 - dropout_p)
        elif dropout_p > 0.0:
            probs = torch.nn.functional.dropout(probs, p=dropout_p)

    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    if not return_lse:
        return out
    stat_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return out, torch.logsumexp(scores.to(stat_dtype), dim=-1)
