"""Block-sparse FlashAttention (Dao et al., 2022, Section 3.3), forward and backward, in Triton.

The dense IO-aware kernel, except that each program visits only the tiles its layout lists, so work
and time scale with the fraction of blocks kept. A layout (kernels.sparsity) is a bool tensor
(nheads or 1, ceil(seqlen_q / block_size), ceil(seqlen_k / block_size)); token (i, j) is allowed iff
its block is True and, when causal, j <= i + seqlen_k - seqlen_q. Rows with no allowed key return 0
and pass no gradient.

How it works:
- Compression (`compress_layout`): the block layout is expanded to kernel-tile granularity (the tile
  divides block_size), tiles entirely above the causal diagonal are dropped, and each remaining tile
  is classified "full" (no per-element mask: in range and wholly below the diagonal) or "partial".
  Per query tile: the number of full and partial key tiles and their indices, full ones first (BCSR,
  like FlexAttention's BlockMask); the transpose (per key tile, its query tiles) for dK/dV. The tables
  are cached on the BlockSparseLayout object, keyed by tile sizes, sequence lengths, causal and device.
- Forward: grid (query tiles, batch * heads); online softmax over the listed key tiles, fused dropout;
  stores O and the log2-domain LSE.
- Backward (FA2 split, no atomics, so reruns are bit-identical): delta = rowsum(dO * O); a dK/dV kernel
  over key tiles walking the transposed list, and a dQ kernel over query tiles walking the forward list,
  both recomputing P from Q, K and LSE.

Supports: fp16/bf16 (fp32 under the CPU interpreter), head dims that are multiples of 8 up to 128,
per-head layouts, block_size any multiple of 16 (64 and 128 are the tuned ones), seqlen_q != seqlen_k,
dropout, grouped-query K/V (expanded before the kernel).
Limits: the tile sizes are fixed per block size (no autotuning, since the cached tables depend on
them); a very unbalanced layout gives unbalanced programs (no persistent scheduling).
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from kernels.sparsity import BlockSparseLayout, check_layout_tensor
from kernels.standard import repeat_kv, standard_attention

LOG2E = 1.4426950408889634

__all__ = ["blocksparse_attn_func", "compress_layout", "blocksparse_reference", "CompressedLayout"]


# ------------------------------------------------------------------------------------------------
# Compression
# ------------------------------------------------------------------------------------------------
class CompressedLayout:
    """Index tables the kernels walk. For the forward/dQ direction (row = query tile):
    row_full (Hl, Mt) int32, row_part (Hl, Mt) int32, row_idx (Hl, Mt, W) int32 with the full tiles
    first; for dK/dV (row = key tile) the same, col_*, over (Hl, Nt)."""

    def __init__(self, row_full, row_part, row_idx, col_full, col_part, col_idx, block_m, block_n):
        self.row_full, self.row_part, self.row_idx = row_full, row_part, row_idx
        self.col_full, self.col_part, self.col_idx = col_full, col_part, col_idx
        self.block_m, self.block_n = block_m, block_n

    @property
    def nnz_tiles(self) -> int:
        return int((self.row_full + self.row_part).sum())


def _table(cat: torch.Tensor):
    """cat (Hl, R, C) int8 in {0 full, 1 partial, 2 skipped} -> counts and indices, full first."""
    order = torch.sort(cat, dim=-1, stable=True).indices
    n_full = (cat == 0).sum(-1, dtype=torch.int32)
    n_part = (cat == 1).sum(-1, dtype=torch.int32)
    width = max(1, int((n_full + n_part).max()) if cat.numel() else 1)
    idx = order[..., :width].to(torch.int32).contiguous()
    return n_full.contiguous(), n_part.contiguous(), idx


def tile_categories(blocks: torch.Tensor, block_size: int, seqlen_q: int, seqlen_k: int, causal: bool,
                    block_m: int, block_n: int) -> torch.Tensor:
    """(Hl, Mt, Nt) int8: 0 = tile computed without element mask, 1 = computed with mask, 2 = skipped."""
    if block_size % block_m or block_size % block_n:
        raise ValueError(f"kernel tiles ({block_m}, {block_n}) must divide block_size {block_size}")
    n_mt, n_nt = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
    tiles = blocks.repeat_interleave(block_size // block_m, 1).repeat_interleave(block_size // block_n, 2)
    tiles = tiles[:, :n_mt, :n_nt]
    dev = blocks.device
    m = torch.arange(n_mt, device=dev).unsqueeze(1)
    n = torch.arange(n_nt, device=dev).unsqueeze(0)
    full = ((m + 1) * block_m <= seqlen_q) & ((n + 1) * block_n <= seqlen_k)
    if causal:
        off = seqlen_k - seqlen_q
        last_q = torch.clamp((m + 1) * block_m, max=seqlen_q) - 1
        tiles = tiles & (n * block_n <= last_q + off)  # drop tiles wholly above the diagonal
        full = full & ((n + 1) * block_n - 1 <= m * block_m + off)
    cat = torch.full(tiles.shape, 2, dtype=torch.int8, device=dev)
    cat[tiles] = 1
    cat[tiles & full] = 0
    return cat


def compress_layout(layout: BlockSparseLayout, seqlen_q: int, seqlen_k: int, causal: bool, block_m: int,
                    block_n: int, device) -> CompressedLayout:
    """Compressed tables for `layout` at these sizes, cached on the layout object."""
    key = (block_m, block_n, seqlen_q, seqlen_k, bool(causal), str(device))
    hit = layout._cache.get(key)
    if hit is not None:
        return hit
    blocks = layout.blocks.to(device)
    cat = tile_categories(blocks, layout.block_size, seqlen_q, seqlen_k, causal, block_m, block_n)
    rf, rp, ri = _table(cat)
    cf, cp, ci = _table(cat.transpose(1, 2))
    out = CompressedLayout(rf, rp, ri, cf, cp, ci, block_m, block_n)
    layout._cache[key] = out
    return out


# ------------------------------------------------------------------------------------------------
# Triton building blocks (provisional local copies until kernels/flash.py publishes shared ones)
# ------------------------------------------------------------------------------------------------
@triton.jit
def _dropout_keep(seed, offsets, dropout_p):
    return tl.rand(seed, offsets) >= dropout_p


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n, offs_m, offs_n, offs_d,
              seqlen_q, seqlen_k, qk_scale, dropout_p, seed, rng_row,
              HEAD_DIM: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
              EVEN_D: tl.constexpr, DROPOUT: tl.constexpr):
    """One K/V tile into the running (acc, m_i, l_i); scores in the log2 domain."""
    cols = start_n + offs_n
    kv_mask = (cols[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
    if MASK or not EVEN_D:
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASK:
        ok = cols[None, :] < seqlen_k
        if CAUSAL:
            ok = ok & (cols[None, :] <= offs_m[:, None] + (seqlen_k - seqlen_q))
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DROPOUT:
        keep = _dropout_keep(seed, rng_row[:, None] + cols[None, :], dropout_p)
        p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _bwd_dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, start_m,
                   offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p, seed, rng_base,
                   seqlen_k_rng, HEAD_DIM: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                   EVEN_D: tl.constexpr, DROPOUT: tl.constexpr):
    """One query tile's contribution to this key tile's dK, dV (P recomputed transposed)."""
    rows = start_m + offs_m
    q_ptrs = q_base + rows[:, None] * stride_qm + offs_d[None, :]
    do_ptrs = do_base + rows[:, None] * stride_dom + offs_d[None, :]
    if MASK or not EVEN_D:
        ld = (rows[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
        q = tl.load(q_ptrs, mask=ld, other=0.0)
        do = tl.load(do_ptrs, mask=ld, other=0.0)
    else:
        q = tl.load(q_ptrs)
        do = tl.load(do_ptrs)
    if MASK:
        lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
        delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
    else:
        lse = tl.load(lse_base + rows)
        delta = tl.load(delta_base + rows)
    s_t = tl.dot(k, tl.trans(q)) * qk_scale  # (BLOCK_N, BLOCK_M)
    p_t = tl.exp2(s_t - lse[None, :])
    if MASK:
        ok = (offs_n[:, None] < seqlen_k) & (rows[None, :] < seqlen_q)
        if CAUSAL:
            ok = ok & (offs_n[:, None] <= rows[None, :] + (seqlen_k - seqlen_q))
        p_t = tl.where(ok, p_t, 0.0)
    dp_t = tl.dot(v, tl.trans(do))
    if DROPOUT:
        keep = _dropout_keep(seed, rng_base + rows[None, :] * seqlen_k_rng + offs_n[:, None], dropout_p)
        scale_keep = tl.where(keep, 1.0 / (1.0 - dropout_p), 0.0)
        dv = tl.dot((p_t * scale_keep).to(do.dtype), do, dv)
        dp_t = dp_t * scale_keep
    else:
        dv = tl.dot(p_t.to(do.dtype), do, dv)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _bwd_dq_tile(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, offs_m, offs_n,
                 offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p, seed, rng_row,
                 HEAD_DIM: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                 EVEN_D: tl.constexpr, DROPOUT: tl.constexpr):
    """One key tile's contribution to this query tile's dQ."""
    cols = start_n + offs_n
    k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
    if MASK or not EVEN_D:
        ld = (cols[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_ptrs, mask=ld, other=0.0)
        v = tl.load(v_ptrs, mask=ld, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    p = tl.exp2(s - lse[:, None])
    if MASK:
        ok = cols[None, :] < seqlen_k
        if CAUSAL:
            ok = ok & (cols[None, :] <= offs_m[:, None] + (seqlen_k - seqlen_q))
        p = tl.where(ok, p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    if DROPOUT:
        keep = _dropout_keep(seed, rng_row[:, None] + cols[None, :], dropout_p)
        dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


# ------------------------------------------------------------------------------------------------
# Top-level kernels: walk the compressed layout
# ------------------------------------------------------------------------------------------------
@triton.jit
def _bs_fwd_kernel(Q, K, V, O, LSE, ROW_FULL, ROW_PART, ROW_IDX,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh,
                   stride_lay_h, stride_lay_m, idx_width, nheads, seqlen_q, seqlen_k, qk_scale,
                   dropout_p, seed,
                   HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    EVEN_D: tl.constexpr = HEAD_DIM == D_PAD
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    rng_row = (bh * seqlen_q + offs_m) * seqlen_k

    lay = h * stride_lay_h + pid_m * stride_lay_m
    n_full = tl.load(ROW_FULL + lay)
    n_part = tl.load(ROW_PART + lay)
    idx_ptr = ROW_IDX + lay * idx_width

    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for t in range(0, n_full):
        start_n = tl.load(idx_ptr + t) * BLOCK_N
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n,
                                  offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p, seed,
                                  rng_row, HEAD_DIM, False, CAUSAL, EVEN_D, DROPOUT)
    for t in range(n_full, n_full + n_part):
        start_n = tl.load(idx_ptr + t) * BLOCK_N
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n,
                                  offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p, seed,
                                  rng_row, HEAD_DIM, True, CAUSAL, EVEN_D, DROPOUT)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    # log2-domain LSE; +inf for rows that see nothing, so the backward's exp2(s - lse) is 0 there.
    lse = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + bh * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)


@triton.jit
def _bs_bwd_preprocess(O, DO, DELTA, stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh,
                       nheads, seqlen_q, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    msk = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], mask=msk, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :], mask=msk, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _bs_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, COL_FULL, COL_PART, COL_IDX,
                        stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                        stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                        stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                        stride_lay_h, stride_lay_n, idx_width, nheads, seqlen_q, seqlen_k, qk_scale,
                        sm_scale, dropout_p, seed,
                        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    EVEN_D: tl.constexpr = HEAD_DIM == D_PAD
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    kv_msk = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_msk, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_msk, other=0.0)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_dob + h * stride_doh
    lse_base = LSE + bh * seqlen_q
    delta_base = DELTA + bh * seqlen_q
    rng_base = bh * seqlen_q * seqlen_k

    lay = h * stride_lay_h + pid_n * stride_lay_n
    n_full = tl.load(COL_FULL + lay)
    n_part = tl.load(COL_PART + lay)
    idx_ptr = COL_IDX + lay * idx_width
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    for t in range(0, n_full):
        start_m = tl.load(idx_ptr + t) * BLOCK_M
        dk, dv = _bwd_dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                start_m, offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p,
                                seed, rng_base, seqlen_k, HEAD_DIM, False, CAUSAL, EVEN_D, DROPOUT)
    for t in range(n_full, n_full + n_part):
        start_m = tl.load(idx_ptr + t) * BLOCK_M
        dk, dv = _bwd_dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                start_m, offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p,
                                seed, rng_base, seqlen_k, HEAD_DIM, True, CAUSAL, EVEN_D, DROPOUT)
    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_msk)
    tl.store(DV + b * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_msk)


@triton.jit
def _bs_bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, ROW_FULL, ROW_PART, ROW_IDX,
                      stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                      stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                      stride_dqb, stride_dqm, stride_dqh,
                      stride_lay_h, stride_lay_m, idx_width, nheads, seqlen_q, seqlen_k, qk_scale,
                      sm_scale, dropout_p, seed,
                      HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    EVEN_D: tl.constexpr = HEAD_DIM == D_PAD
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    q_msk = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_msk, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :], mask=q_msk, other=0.0)
    lse = tl.load(LSE + bh * seqlen_q + offs_m, mask=offs_m < seqlen_q, other=float("inf"))
    delta = tl.load(DELTA + bh * seqlen_q + offs_m, mask=offs_m < seqlen_q, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    rng_row = (bh * seqlen_q + offs_m) * seqlen_k

    lay = h * stride_lay_h + pid_m * stride_lay_m
    n_full = tl.load(ROW_FULL + lay)
    n_part = tl.load(ROW_PART + lay)
    idx_ptr = ROW_IDX + lay * idx_width
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    for t in range(0, n_full):
        start_n = tl.load(idx_ptr + t) * BLOCK_N
        dq = _bwd_dq_tile(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, offs_m,
                          offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p, seed, rng_row,
                          HEAD_DIM, False, CAUSAL, EVEN_D, DROPOUT)
    for t in range(n_full, n_full + n_part):
        start_n = tl.load(idx_ptr + t) * BLOCK_N
        dq = _bwd_dq_tile(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, offs_m,
                          offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, dropout_p, seed, rng_row,
                          HEAD_DIM, True, CAUSAL, EVEN_D, DROPOUT)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=q_msk)


# ------------------------------------------------------------------------------------------------
# Launcher
# ------------------------------------------------------------------------------------------------
def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _tiles(block_size: int, head_dim: int, backward: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); tiles divide block_size."""
    cap = 32 if _interpreting() else (64 if backward else 128)
    bm = math.gcd(block_size, cap)
    bn = math.gcd(block_size, 64 if not _interpreting() else 16)
    if not backward and head_dim > 64 and bm > 64:
        bm, bn = 128, min(bn, 64)
    warps = 8 if bm * bn >= 128 * 64 else 4
    stages = 1 if _interpreting() else (2 if head_dim > 64 else 3)
    return bm, bn, warps, stages


def _as_layout(layout, block_size, nheads, seqlen_q, seqlen_k) -> BlockSparseLayout:
    if isinstance(layout, BlockSparseLayout):
        if block_size is not None and block_size != layout.block_size:
            raise ValueError(f"block_size={block_size} differs from the layout's {layout.block_size}")
        blocks = layout.blocks
        block_size = layout.block_size
    else:
        blocks = layout
        block_size = 128 if block_size is None else block_size
    if not isinstance(block_size, int) or block_size < 16 or block_size % 16:
        raise ValueError(f"block_size must be a multiple of 16 (64 or 128 are tuned), got {block_size}")
    nq, nk = -(-seqlen_q // block_size), -(-seqlen_k // block_size)
    check_layout_tensor(blocks, nheads, nq, nk)
    if isinstance(layout, BlockSparseLayout):
        if (layout.seqlen_q, layout.seqlen_k) == (seqlen_q, seqlen_k):
            return layout
        return BlockSparseLayout(blocks, block_size, seqlen_q, seqlen_k, layout.causal)
    return BlockSparseLayout(blocks, block_size, seqlen_q, seqlen_k)


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (batch, seqlen, nheads, headdim)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on the same device")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError("CPU tensors need TRITON_INTERPRET=1 (the Triton interpreter)")
    b, _, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be (batch, seqlen_k, nheads_k, {d}); got {tuple(k.shape)}, {tuple(v.shape)}")
    if h % k.shape[2]:
        raise ValueError(f"nheads ({h}) must be a multiple of nheads_k ({k.shape[2]})")
    if d % 8 or d > 128:
        raise ValueError(f"head dim must be a multiple of 8 and at most 128, got {d}")


def _draw_seed(device) -> int:
    gen = torch.cuda.default_generators[device.index or 0] if device.type == "cuda" else torch.default_generator
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device="cpu" if device.type != "cuda" else device).item())


def _bs_forward(q, k, v, layout, causal, sm_scale, dropout_p, seed):
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    d_pad = max(16, triton.next_power_of_2(d))
    bm, bn, warps, stages = _tiles(layout.block_size, d, backward=False)
    tab = compress_layout(layout, seqlen_q, seqlen_k, causal, bm, bn, q.device)
    o = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    lay_h = tab.row_full.stride(0) if tab.row_full.shape[0] > 1 else 0
    grid = (triton.cdiv(seqlen_q, bm), batch * nheads)
    _bs_fwd_kernel[grid](
        q, k, v, o, lse, tab.row_full, tab.row_part, tab.row_idx,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        lay_h, tab.row_full.stride(1), tab.row_idx.shape[-1], nheads, seqlen_q, seqlen_k,
        sm_scale * LOG2E, dropout_p, seed,
        HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, DROPOUT=dropout_p > 0,
        num_warps=warps, num_stages=stages,
    )
    return o, lse


def _bs_backward(do, q, k, v, o, lse, layout, causal, sm_scale, dropout_p, seed):
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    d_pad = max(16, triton.next_power_of_2(d))
    if do.stride(-1) != 1:
        do = do.contiguous()
    delta = torch.empty_like(lse)
    pre_m = 64
    _bs_bwd_preprocess[(triton.cdiv(seqlen_q, pre_m), batch * nheads)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        nheads, seqlen_q, HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=pre_m,
    )
    bm, bn, warps, stages = _tiles(layout.block_size, d, backward=True)
    tab = compress_layout(layout, seqlen_q, seqlen_k, causal, bm, bn, q.device)
    lay_h_col = tab.col_full.stride(0) if tab.col_full.shape[0] > 1 else 0
    lay_h_row = tab.row_full.stride(0) if tab.row_full.shape[0] > 1 else 0
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, DROPOUT=dropout_p > 0,
                  num_warps=warps, num_stages=stages)
    _bs_bwd_dkdv_kernel[(triton.cdiv(seqlen_k, bn), batch * nheads)](
        q, k, v, do, dk, dv, lse, delta, tab.col_full, tab.col_part, tab.col_idx,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        lay_h_col, tab.col_full.stride(1), tab.col_idx.shape[-1], nheads, seqlen_q, seqlen_k,
        sm_scale * LOG2E, sm_scale, dropout_p, seed, **common,
    )
    _bs_bwd_dq_kernel[(triton.cdiv(seqlen_q, bm), batch * nheads)](
        q, k, v, do, dq, lse, delta, tab.row_full, tab.row_part, tab.row_idx,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        lay_h_row, tab.row_full.stride(1), tab.row_idx.shape[-1], nheads, seqlen_q, seqlen_k,
        sm_scale * LOG2E, sm_scale, dropout_p, seed, **common,
    )
    return dq, dk, dv


class _BlockSparseAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, causal, sm_scale, dropout_p):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        seed = _draw_seed(q.device) if dropout_p > 0 else 0
        o, lse = _bs_forward(q, k, v, layout, causal, sm_scale, dropout_p, seed)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.layout, ctx.causal, ctx.sm_scale, ctx.dropout_p, ctx.seed = layout, causal, sm_scale, dropout_p, seed
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _bs_backward(do, q, k, v, o, lse, ctx.layout, ctx.causal, ctx.sm_scale, ctx.dropout_p,
                                  ctx.seed)
        return dq, dk, dv, None, None, None, None


def blocksparse_attn_func(q, k, v, layout, block_size=None, dropout_p=0.0, softmax_scale=None, causal=False):
    """Block-sparse attention.

    q (batch, seqlen_q, nheads, headdim); k, v (batch, seqlen_k, nheads_k, headdim), nheads_k dividing
    nheads. layout: a bool tensor (nheads or 1, ceil(seqlen_q / block_size), ceil(seqlen_k /
    block_size)) or a kernels.sparsity.BlockSparseLayout (reusing one object reuses its compressed
    tables). block_size defaults to 128 for a tensor and to the layout's own for a BlockSparseLayout.
    causal: bottom-right token-level causal mask on top of the blocks (also on when the layout is
    causal). Returns (batch, seqlen_q, nheads, headdim) in q's dtype.
    """
    _check_inputs(q, k, v)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    lay = _as_layout(layout, block_size, nheads, seqlen_q, seqlen_k)
    causal = bool(causal) or lay.causal
    if k.shape[2] != nheads:
        k, v = repeat_kv(k, nheads), repeat_kv(v, nheads)
    sm_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    return _BlockSparseAttnFunc.apply(q, k, v, lay, causal, sm_scale, float(dropout_p))


def blocksparse_reference(q, k, v, layout, block_size=None, softmax_scale=None, causal=False, dropout_p=0.0,
                          dropout_mask=None):
    """Plain-PyTorch block-sparse attention: standard attention with the token-level mask."""
    batch, seqlen_q, nheads, _ = q.shape
    lay = _as_layout(layout, block_size, nheads, seqlen_q, k.shape[1])
    dense = lay.to_dense().to(q.device)  # (Hl, seqlen_q, seqlen_k)
    return standard_attention(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale,
                              causal=bool(causal) or lay.causal, mask=dense.unsqueeze(0),
                              dropout_mask=dropout_mask)
