"""The one attention interface every model uses; `configs/attn/*.yaml` each name one of these classes.

A model builds its attention core with `attention_factory(dropout=p)` (a functools.partial that Hydra
makes from the attn config) and calls it in one of two ways:

    out = core(q, k, v, causal=..., key_padding_mask=None)   # padded: (batch, seqlen, nheads, headdim)
    out = core(q, k, v, causal=..., packed=packed)           # packed: (total_tokens, nheads, headdim)

Padded: q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim);
key_padding_mask, when given, is a bool (batch, seqlen_k) with True at real tokens. Packed: the model
removed the padding once per forward (`kernels.padding.PackedBatch.from_mask`) and every layer passes
the same PackedBatch with q/k/v of its real tokens only (self-attention). Flash and block-sparse run
their varlen kernels on packed tokens; standard and SDPA re-pad, run their padded path and pack again.
Either way the result equals attention over each sequence alone. Dropout is active only in training
mode. Models never branch on which class they hold.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.padding import PackedBatch, pad, unpad
from kernels.standard import causal_mask, standard_attention


class Attention(nn.Module):
    """Base class: holds the attention dropout probability and the softmax scale, and dispatches.

    Subclasses implement `forward_padded` and/or `forward_packed`; each has a default that goes
    through the other (re-padding, or packing the padded batch), so both calls work for every kind.
    """

    def __init__(self, dropout: float = 0.0, softmax_scale: float | None = None):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        self.dropout = dropout
        self.softmax_scale = softmax_scale

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def forward(self, q, k, v, causal: bool = False, key_padding_mask: torch.Tensor | None = None,
                packed: PackedBatch | None = None):
        if packed is not None:
            if key_padding_mask is not None:
                raise ValueError("pass either packed tokens (packed=...) or a padded batch with "
                                 "key_padding_mask, not both")
            _check_packed(q, packed, "q", ("nheads", "headdim"))
            return self.forward_packed(q, k, v, packed, causal)
        return self.forward_padded(q, k, v, causal, key_padding_mask)

    def score_fraction(self, seqlen: int) -> float:
        """The part of a seqlen x seqlen score matrix this kind computes (before any causal mask): 1 for
        dense kinds; what a model's FLOP count (and so MFU) multiplies its attention term by."""
        return 1.0

    def forward_qkv(self, qkv: torch.Tensor, causal: bool = False, packed: PackedBatch | None = None):
        """Self-attention on a fused projection's output viewed per head: qkv (batch, seqlen, 3, nheads,
        headdim), or (total_tokens, 3, nheads, headdim) with `packed`. The same as
        self(*qkv.unbind(-3), causal=causal, packed=packed); kinds that take the three at once override it
        (flash, block-sparse: one gradient tensor for qkv, so the backward stacks nothing)."""
        q, k, v = qkv.unbind(dim=-3)
        return self(q, k, v, causal=causal, packed=packed)

    def forward_padded(self, q, k, v, causal, key_padding_mask):
        """Default: pack the padded batch (self-attention), run forward_packed, pad the result."""
        if key_padding_mask is None:
            raise NotImplementedError(f"{type(self).__name__} implements no padded path")
        batch, seqlen = key_padding_mask.shape
        if q.shape[1] != seqlen or k.shape[1] != seqlen:
            raise ValueError(f"key_padding_mask with {type(self).__name__} needs self-attention "
                             f"(seqlen_q == seqlen_k == {seqlen}), got {q.shape[1]} and {k.shape[1]}")
        packed = PackedBatch.from_mask(key_padding_mask)
        out = self.forward_packed(unpad(q, packed), unpad(k, packed), unpad(v, packed), packed, causal)
        return pad(out, packed)

    def forward_packed(self, q, k, v, packed: PackedBatch, causal):
        """Default: re-pad, run forward_padded with the padding mask, keep the real tokens."""
        out = self.forward_padded(pad(q, packed), pad(k, packed), pad(v, packed), causal, packed.mask)
        return unpad(out, packed)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, softmax_scale={self.softmax_scale}"


def _check_packed(x: torch.Tensor, packed: PackedBatch, name: str, dims: tuple[str, ...]) -> None:
    """x must be (packed.total, *dims): the packed tokens first, then `dims` (named in the error)."""
    if x.dim() != 1 + len(dims) or x.shape[0] != packed.total:
        raise ValueError(f"packed {name} must be (total_tokens={packed.total}, {', '.join(dims)}), got {tuple(x.shape)}")


class StandardAttention(Attention):
    """The paper's baseline: scores materialised in HBM, then mask, softmax, dropout (plain PyTorch).

    kernel_dropout_mask: draw the attention dropout mask as the Triton kernels do (one seed from torch's
    generator per call, then their Philox stream: kernels.flash.dropout_keep_mask) instead of with
    torch.nn.functional.dropout. A run with it and an attn=flash run from the same seed then drop the same
    attention scores and, as both take the same draws from torch's generator, the same hidden units, so
    their curves differ by rounding alone (quality parity, configs/attn/standard-matched.yaml). Off by
    default: the mask costs a kernel launch and seqlen^2 bytes a head.
    upcast_scores: scores and softmax in float32 under a 16-bit input dtype (standard_attention), the
    kernels' precision; twice the score matrix's memory. Off by default, as in the paper's baseline.
    """

    def __init__(self, dropout: float = 0.0, softmax_scale: float | None = None, kernel_dropout_mask: bool = False,
                 upcast_scores: bool = False):
        super().__init__(dropout, softmax_scale)
        self.kernel_dropout_mask = kernel_dropout_mask
        self.upcast_scores = upcast_scores

    def forward_padded(self, q, k, v, causal, key_padding_mask):
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        dropout_mask = None
        if self.kernel_dropout_mask and self.dropout_p > 0:
            from kernels.flash import draw_dropout_seed, dropout_keep_mask
            from kernels.launch import _interpreting

            if q.device.type != "cuda" and not _interpreting():
                raise ValueError("kernel_dropout_mask draws the mask with a Triton kernel: it needs CUDA tensors "
                                 f"(got {q.device}), or TRITON_INTERPRET=1 on the CPU")
            seed = draw_dropout_seed(q.device)
            dropout_mask = dropout_keep_mask(seed, q.shape[0], q.shape[2], q.shape[1], k.shape[1], self.dropout_p)
        return standard_attention(q, k, v, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale, causal=causal,
                                  mask=mask, dropout_mask=dropout_mask, upcast_scores=self.upcast_scores)

    def extra_repr(self) -> str:
        return (super().extra_repr() + (", kernel_dropout_mask=True" if self.kernel_dropout_mask else "")
                + (", upcast_scores=True" if self.upcast_scores else ""))


class SDPAttention(Attention):
    """torch.nn.functional.scaled_dot_product_attention: the peer we compare against.

    PyTorch picks its backend (FlashAttention-2, memory-efficient, cuDNN or math) per call.
    """

    def forward_padded(self, q, k, v, causal, key_padding_mask):
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


class FlashAttention(Attention):
    """The fused Triton kernel (kernels.flash); packed tokens run through its varlen kernel."""

    def forward_padded(self, q, k, v, causal, key_padding_mask):
        if key_padding_mask is not None:
            return super().forward_padded(q, k, v, causal, key_padding_mask)
        from kernels.flash import flash_attn_func

        return flash_attn_func(q, k, v, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale, causal=causal)

    def forward_qkv(self, qkv, causal=False, packed=None):
        from kernels.flash import flash_attn_qkvpacked_func, flash_attn_varlen_qkvpacked_func

        if packed is None:
            return flash_attn_qkvpacked_func(qkv, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
                                             causal=causal)
        _check_packed(qkv, packed, "qkv", ("3", "nheads", "headdim"))
        return flash_attn_varlen_qkvpacked_func(qkv, packed.cu_seqlens, packed.max_seqlen, dropout_p=self.dropout_p,
                                                softmax_scale=self.softmax_scale, causal=causal, check_seqlens=False)

    def forward_packed(self, q, k, v, packed, causal):
        from kernels.flash import flash_attn_varlen_func

        return flash_attn_varlen_func(q, k, v, packed.cu_seqlens, packed.cu_seqlens, packed.max_seqlen,
                                      packed.max_seqlen, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
                                      causal=causal, check_seqlens=False)


class BlockSparseAttention(Attention):
    """Block-sparse FlashAttention (kernels.blocksparse) with the pattern chosen in the config.

    pattern: a name from kernels.sparsity.PATTERNS or a list of names (their union), e.g. "butterfly"
    or ["local", "global_local"]; block_size: 64 or 128 (any multiple of 16 runs); the other keyword
    arguments go to the pattern builders (window, n_global, stride, density, seed, nheads, n_factors).
    `causal` comes from the model at call time and is applied token by token on top of the blocks.

    Layouts are built once per (pattern, lengths, device) in a cache shared by every instance, so all
    layers of a model (and their compressed index tables) share one. Packed tokens (a padded batch,
    its padding removed once by the model) run the varlen kernel with the layout of the padded length
    applied to each sequence from its own start: exact, and never dense attention.
    """

    _LAYOUTS: dict = {}

    def __init__(self, dropout: float = 0.0, softmax_scale: float | None = None, pattern="butterfly",
                 block_size: int = 128, **pattern_kwargs):
        super().__init__(dropout, softmax_scale)
        from kernels.sparsity import make_layout

        self.pattern = pattern if isinstance(pattern, str) else list(pattern)
        self.block_size = int(block_size)
        self.pattern_kwargs = dict(pattern_kwargs)
        make_layout(self.pattern, self.block_size, self.block_size, self.block_size, **self.pattern_kwargs)
        # What the layout is made from; the lengths and device complete the cache key per call.
        self._spec = (self.pattern if isinstance(self.pattern, str) else tuple(self.pattern), self.block_size,
                      repr(sorted(self.pattern_kwargs.items())))

    def layout(self, seqlen_q: int, seqlen_k: int, device):
        key = (*self._spec, seqlen_q, seqlen_k, str(device))
        if key not in self._LAYOUTS:
            from kernels.sparsity import make_layout

            self._LAYOUTS[key] = make_layout(self.pattern, seqlen_q, seqlen_k, self.block_size, device=device,
                                             **self.pattern_kwargs)
        return self._LAYOUTS[key]

    def score_fraction(self, seqlen: int) -> float:
        """The layout's density at seqlen: the blocks the kernel computes; skipped blocks are no FLOPs."""
        return self.layout(seqlen, seqlen, "cpu").density()

    def forward_padded(self, q, k, v, causal, key_padding_mask):
        if key_padding_mask is not None:
            return super().forward_padded(q, k, v, causal, key_padding_mask)
        from kernels.blocksparse import blocksparse_attn_func

        lay = self.layout(q.shape[1], k.shape[1], q.device)
        return blocksparse_attn_func(q, k, v, lay, dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
                                     causal=causal)

    def forward_qkv(self, qkv, causal=False, packed=None):
        from kernels.blocksparse import blocksparse_attn_qkvpacked_func, blocksparse_attn_varlen_qkvpacked_func

        if packed is None:
            lay = self.layout(qkv.shape[1], qkv.shape[1], qkv.device)
            return blocksparse_attn_qkvpacked_func(qkv, lay, dropout_p=self.dropout_p,
                                                   softmax_scale=self.softmax_scale, causal=causal)
        _check_packed(qkv, packed, "qkv", ("3", "nheads", "headdim"))
        lay = self.layout(packed.seqlen, packed.seqlen, qkv.device)
        return blocksparse_attn_varlen_qkvpacked_func(qkv, lay, packed.cu_seqlens, packed.max_seqlen,
                                                      dropout_p=self.dropout_p, softmax_scale=self.softmax_scale,
                                                      causal=causal, check_seqlens=False)

    def forward_packed(self, q, k, v, packed, causal):
        from kernels.blocksparse import blocksparse_attn_varlen_func

        lay = self.layout(packed.seqlen, packed.seqlen, q.device)
        return blocksparse_attn_varlen_func(q, k, v, lay, packed.cu_seqlens, packed.cu_seqlens, packed.max_seqlen,
                                            packed.max_seqlen, dropout_p=self.dropout_p,
                                            softmax_scale=self.softmax_scale, causal=causal, check_seqlens=False)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, pattern={self.pattern}, block_size={self.block_size}, "
                f"{', '.join(f'{k}={v}' for k, v in self.pattern_kwargs.items())}").rstrip(", ")
