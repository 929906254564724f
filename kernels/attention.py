"""The one attention interface every model uses; `configs/attn/*.yaml` each name one of these classes.

A model builds its attention core with `attention_factory(dropout=p)` (a functools.partial that Hydra
makes from the attn config) and calls

    out = core(q, k, v, causal=..., key_padding_mask=None)

with q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim), and gets
(batch, seqlen_q, nheads, headdim) back. key_padding_mask, when given, is a bool (batch, seqlen_k) with
True at real tokens (self-attention on padded batches: BERT, LRA). Dropout is active only in training
mode. Models never branch on which class they hold.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.standard import causal_mask, standard_attention


class Attention(nn.Module):
    """Base class: holds the attention dropout probability and the softmax scale."""

    def __init__(self, dropout: float = 0.0, softmax_scale: float | None = None):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        self.dropout = dropout
        self.softmax_scale = softmax_scale

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def forward(self, q, k, v, causal: bool = False, key_padding_mask: torch.Tensor | None = None):
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, softmax_scale={self.softmax_scale}"


class StandardAttention(Attention):
    """The paper's baseline: scores materialised in HBM, then mask, softmax, dropout (plain PyTorch)."""

    def forward(self, q, k, v, causal=False, key_padding_mask=None):
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        return standard_attention(
            q, k, v, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale, causal=causal, mask=mask
        )


class SDPAttention(Attention):
    """torch.nn.functional.scaled_dot_product_attention: the peer we compare against.

    PyTorch picks its backend (FlashAttention-2, memory-efficient, cuDNN or math) per call.
    """

    def forward(self, q, k, v, causal=False, key_padding_mask=None):
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        attn_mask = None
        if key_padding_mask is not None:
            attn_mask = key_padding_mask[:, None, None, :]
        # SDPA's is_causal is top-left aligned; ours is bottom-right, so pass an explicit mask unless
        # the two agree (square) and no other mask is needed.
        use_is_causal = causal and attn_mask is None and seqlen_q == seqlen_k
        if causal and not use_is_causal:
            cm = causal_mask(seqlen_q, seqlen_k, q.device)
            attn_mask = cm if attn_mask is None else (attn_mask & cm)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attn_mask,
            dropout_p=self.dropout_p,
            is_causal=use_is_causal,
            scale=self.softmax_scale,
            enable_gqa=k.shape[2] != q.shape[2],
        )
        return out.transpose(1, 2)


def _unpad(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """(batch, seqlen, ...) -> (total_tokens, ...) keeping the rows named by flat `indices`."""
    return x.reshape(-1, *x.shape[2:]).index_select(0, indices)


class FlashAttention(Attention):
    """The fused Triton kernel (kernels.flash). Padded batches run through the varlen kernel."""

    def forward(self, q, k, v, causal=False, key_padding_mask=None):
        from kernels.flash import flash_attn_func, flash_attn_varlen_func

        if key_padding_mask is None:
            return flash_attn_func(
                q, k, v, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale, causal=causal
            )
        batch, seqlen = key_padding_mask.shape
        if q.shape[1] != seqlen or k.shape[1] != seqlen:
            raise ValueError("key_padding_mask with flash attention needs self-attention (seqlen_q == seqlen_k)")
        # Pack the real tokens (query padding = key padding) and run without padding at all.
        lengths = key_padding_mask.sum(dim=1, dtype=torch.int32)
        cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        indices = key_padding_mask.flatten().nonzero().squeeze(1)
        max_seqlen = int(lengths.max())
        out_packed = flash_attn_varlen_func(
            _unpad(q, indices), _unpad(k, indices), _unpad(v, indices), cu_seqlens, cu_seqlens,
            max_seqlen, max_seqlen, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
            causal=causal,
        )
        out = out_packed.new_zeros(batch * seqlen, *out_packed.shape[1:])
        out.index_copy_(0, indices, out_packed)
        return out.view(batch, seqlen, *out_packed.shape[1:])


class BlockSparseAttention(Attention):
    """Block-sparse FlashAttention (kernels.blocksparse) with the pattern chosen in the config.

    pattern: a name from kernels.sparsity.PATTERNS or a list of names (their union), e.g. "butterfly"
    or ["local", "global_local"]; block_size: 64 or 128 (any multiple of 16 runs); the other keyword
    arguments go to the pattern builders (window, n_global, stride, density, seed, nheads, n_factors).
    The layout is built once per (seqlen_q, seqlen_k, device) and kept, so its compressed index tables
    are reused by every step. `causal` comes from the model at call time and is applied token by token
    on top of the blocks.

    key_padding_mask (BERT/LRA padded batches) has no kernel path: such calls fall back to standard
    attention with the token-level block mask and the padding mask (correct, not IO-aware).
    """

    def __init__(self, dropout: float = 0.0, softmax_scale: float | None = None, pattern="butterfly",
                 block_size: int = 128, **pattern_kwargs):
        super().__init__(dropout, softmax_scale)
        from kernels.sparsity import make_layout

        self.pattern = pattern if isinstance(pattern, str) else list(pattern)
        self.block_size = int(block_size)
        self.pattern_kwargs = dict(pattern_kwargs)
        make_layout(self.pattern, self.block_size, self.block_size, self.block_size, **self.pattern_kwargs)
        self._layouts: dict = {}

    def layout(self, seqlen_q: int, seqlen_k: int, device):
        key = (seqlen_q, seqlen_k, str(device))
        if key not in self._layouts:
            from kernels.sparsity import make_layout

            self._layouts[key] = make_layout(self.pattern, seqlen_q, seqlen_k, self.block_size,
                                             device=device, **self.pattern_kwargs)
        return self._layouts[key]

    def forward(self, q, k, v, causal=False, key_padding_mask=None):
        lay = self.layout(q.shape[1], k.shape[1], q.device)
        if key_padding_mask is not None and not bool(key_padding_mask.all()):
            mask = lay.to_dense().unsqueeze(0) & key_padding_mask[:, None, None, :]
            return standard_attention(q, k, v, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
                                      causal=causal or lay.causal, mask=mask)
        from kernels.blocksparse import blocksparse_attn_func

        return blocksparse_attn_func(q, k, v, lay, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
                                     causal=causal)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, pattern={self.pattern}, block_size={self.block_size}, "
                f"{', '.join(f'{k}={v}' for k, v in self.pattern_kwargs.items())}").rstrip(", ")
