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
- Forward: grid (query tiles, batch * heads); online softmax over the listed key tiles (full ones
  without element masks, then partial ones), fused dropout; stores O and the base-2 LSE.
- Backward (FA2 split, no atomics, so reruns are bit-identical): delta = rowsum(dO * O), then one launch
  whose programs are of two kinds: dK/dV of a key tile, walking the transposed list, and dQ of a query
  tile, walking the forward list; both recompute P from Q, K and LSE. Full query tiles are loaded
  without row masks.

The per-tile work (online-softmax step with optional masking and fused dropout, the dK/dV and dQ
recomputation steps, the dropout RNG, input checks, delta preprocessing) is kernels/flash.py's, shared
with the dense kernel; this module only adds the layout walk. So dropout masks equal the dense kernel's
for the same seed, and a full layout computes what flash_attn_func does (bit for bit in the forward
when the tiles match, as under the interpreter; on the GPU the two pick tiles independently).

Supports: fp16/bf16 (fp32 for tests), head dims that are multiples of 8 up to 256 (tuned: 64, 128),
per-head layouts, block_size any multiple of 16 (64 and 128 tuned), seqlen_q != seqlen_k, dropout,
grouped-query K/V (each K/V head loops over its query heads' layouts; no atomics).
Limits: tile sizes are fixed per kernel (the cached tables depend on them, so no autotuning); a very
unbalanced layout gives unbalanced programs (no persistent scheduling); the layout is the same for
every batch element; pass a BlockSparseLayout (not a bare tensor) to reuse its compressed tables.

Measured on an H100 (results/blocksparse/h100.md, bf16, non-causal, block_size 128): butterfly at 16K
tokens (density 1/16) runs forward+backward 13.6x (hd 64) / 13.7x (hd 128) faster than our dense
kernel; 64K tokens fits in about 1 GB of extra memory. Against FlexAttention with the same block mask:
1.06-1.31x faster at hd 64, 1.01-1.35x at hd 128 (device time alone, from CUDA graph replays: 1.14-1.28x
and 0.99-1.09x); results/blocksparse/README.md.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from kernels.flash import (
    LOG2E,
    _block_d,
    _interpreting,
    bwd_dkdv_block_step,
    bwd_dq_block_step,
    bwd_preprocess,
    check_inputs,
    draw_dropout_seed,
    fwd_block_step,
    fwd_finalize,
    load_row_stats,
    load_tile,
)
from kernels.sparsity import BlockSparseLayout, cdiv, check_layout_tensor
from kernels.standard import standard_attention

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
    n_mt, n_nt = cdiv(seqlen_q, block_m), cdiv(seqlen_k, block_n)
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
# Top-level kernels: walk the compressed layout, call the shared steps of kernels/flash.py
# ------------------------------------------------------------------------------------------------
@triton.jit
def _next_tile(idx_ptr, t, nxt, n_total, PREFETCH: tl.constexpr):
    """(index of listed tile t, prefetched index of tile t + 1). With PREFETCH the index used now was
    loaded one iteration earlier, so the tile loads' addresses depend only on a loop-carried value
    (the software pipeliner can issue them ahead) instead of on a load in the same iteration."""
    if PREFETCH:
        cur = nxt
        nxt = tl.load(idx_ptr + t + 1, mask=t + 1 < n_total, other=0)
    else:
        cur = tl.load(idx_ptr + t)
    return cur, nxt


@triton.jit
def _layout_row(FULL, PART, IDX, h, pid, stride_lay_h, idx_width):
    """This program's row of a compressed table: (n_full, n_total, pointer to its tile indices, the
    first index, loaded ahead for _next_tile). Counts are (Hl, rows) contiguous; stride_lay_h is 0
    when one layout serves every head."""
    lay = h * stride_lay_h + pid
    n_full = tl.load(FULL + lay)
    n_total = n_full + tl.load(PART + lay)
    idx_ptr = IDX + lay.to(tl.int64) * idx_width
    first = tl.load(idx_ptr, mask=n_total > 0, other=0)
    return n_full, n_total, idx_ptr, first


@triton.jit
def _bs_fwd_kernel(Q, K, V, O, LSE, SEED, ROW_FULL, ROW_PART, ROW_IDX,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                   stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k, qk_scale, drop_thresh,
                   drop_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   PREFETCH: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    b64 = b.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b64 * stride_qb + h * stride_qh, stride_qm, offs_m, offs_d, seqlen_q, HEAD_DIM, BLOCK_D,
                  True)
    k_base = K + b64 * stride_kb + (h // group) * stride_kh
    v_base = V + b64 * stride_vb + (h // group) * stride_vh
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    diag = seqlen_k - seqlen_q

    n_full, n_total, idx_ptr, nxt = _layout_row(ROW_FULL, ROW_PART, ROW_IDX, h, pid_m, stride_lay_h, idx_width)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Full tiles first: in range and wholly below the diagonal, so no per-element mask.
    for t in range(0, n_full):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total, PREFETCH)
        start_n = cur * BLOCK_N
        acc, m_i, l_i = fwd_block_step(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n, offs_m,
                                       offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh,
                                       HEAD_DIM, BLOCK_D, False, False, HAS_DROPOUT)
    for t in range(n_full, n_total):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total, PREFETCH)
        start_n = cur * BLOCK_N
        acc, m_i, l_i = fwd_block_step(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n, offs_m,
                                       offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh,
                                       HEAD_DIM, BLOCK_D, CAUSAL, True, HAS_DROPOUT)
    acc, lse = fwd_finalize(acc, m_i, l_i, drop_scale, HAS_DROPOUT)  # lse in base 2, as flash.py keeps it
    row_ok = offs_m < seqlen_q
    tl.store(LSE + b64 * stride_lb + h * stride_lh + offs_m, lse, mask=row_ok)
    o_ptrs = O + b64 * stride_ob + h * stride_oh + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _bs_dkdv_program(pid_n, b, hk, Q, K, V, DO, DK, DV, LSE, DELTA, seed, COL_FULL, COL_PART, COL_IDX,
                     stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                     stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                     stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                     stride_lb, stride_lh, stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k,
                     sm_scale, qk_scale, drop_thresh, drop_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                     PREFETCH: tl.constexpr):
    """dK and dV of key tile `pid_n` of (batch b, key/value head hk): walk the transposed layout."""
    b64 = b.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + b64 * stride_kb + hk * stride_kh, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, True)
    v = load_tile(V + b64 * stride_vb + hk * stride_vh, stride_vn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, True)
    diag = seqlen_k - seqlen_q
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # Grouped-query attention: this key/value head collects from each query head of its group, each
    # walking its own layout column, so dK/dV need no atomics.
    for g in range(0, group):
        h = hk * group + g
        bh = b * nheads + h
        q_base = Q + b64 * stride_qb + h * stride_qh
        do_base = DO + b64 * stride_dob + h * stride_doh
        lse_base = LSE + b64 * stride_lb + h * stride_lh
        delta_base = DELTA + b64 * stride_lb + h * stride_lh
        n_full, n_total, idx_ptr, nxt = _layout_row(COL_FULL, COL_PART, COL_IDX, h, pid_n, stride_lay_h,
                                                    idx_width)
        # Full query tiles lie wholly inside the sequence: no row masks on their loads.
        for t in range(0, n_full):
            cur, nxt = _next_tile(idx_ptr, t, nxt, n_total, PREFETCH)
            start_m = cur * BLOCK_M
            dk, dv = bwd_dkdv_block_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm,
                                         stride_dom, start_m, offs_m, cols, offs_d, seqlen_q, diag, qk_scale,
                                         seed, bh, drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, False, HAS_DROPOUT,
                                         False)
        for t in range(n_full, n_total):
            cur, nxt = _next_tile(idx_ptr, t, nxt, n_total, PREFETCH)
            start_m = cur * BLOCK_M
            dk, dv = bwd_dkdv_block_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm,
                                         stride_dom, start_m, offs_m, cols, offs_d, seqlen_q, diag, qk_scale,
                                         seed, bh, drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, CAUSAL,
                                         HAS_DROPOUT, True)
    dk = dk * sm_scale
    ok = (cols[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    rows64 = cols[:, None].to(tl.int64)
    tl.store(DK + b64 * stride_dkb + hk * stride_dkh + rows64 * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=ok)
    tl.store(DV + b64 * stride_dvb + hk * stride_dvh + rows64 * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=ok)


@triton.jit
def _bs_dq_program(pid_m, b, h, Q, K, V, DO, DQ, LSE, DELTA, seed, ROW_FULL, ROW_PART, ROW_IDX,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                   stride_dqb, stride_dqm, stride_dqh, stride_lb, stride_lh,
                   stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k, sm_scale, qk_scale,
                   drop_thresh, drop_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   PREFETCH: tl.constexpr):
    """dQ of query tile `pid_m` of (batch b, query head h): walk the forward layout."""
    bh = b * nheads + h
    b64 = b.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b64 * stride_qb + h * stride_qh, stride_qm, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + b64 * stride_dob + h * stride_doh, stride_dom, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D,
                   True)
    lse, delta = load_row_stats(LSE + b64 * stride_lb + h * stride_lh, DELTA + b64 * stride_lb + h * stride_lh,
                                rows, seqlen_q)
    k_base = K + b64 * stride_kb + (h // group) * stride_kh
    v_base = V + b64 * stride_vb + (h // group) * stride_vh
    diag = seqlen_k - seqlen_q
    n_full, n_total, idx_ptr, nxt = _layout_row(ROW_FULL, ROW_PART, ROW_IDX, h, pid_m, stride_lay_h, idx_width)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for t in range(0, n_full):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total, PREFETCH)
        start_n = cur * BLOCK_N
        dq = bwd_dq_block_step(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, rows, offs_n,
                               offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                               HEAD_DIM, BLOCK_D, False, False, HAS_DROPOUT)
    for t in range(n_full, n_total):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total, PREFETCH)
        start_n = cur * BLOCK_N
        dq = bwd_dq_block_step(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, rows, offs_n,
                               offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                               HEAD_DIM, BLOCK_D, CAUSAL, True, HAS_DROPOUT)
    dq = dq * sm_scale
    ok = (rows[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DQ + b64 * stride_dqb + h * stride_dqh + rows[:, None].to(tl.int64) * stride_dqm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=ok)


@triton.jit
def _bs_bwd_kernel(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, SEED,
                   COL_FULL, COL_PART, COL_IDX, ROW_FULL, ROW_PART, ROW_IDX,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                   stride_dqb, stride_dqm, stride_dqh, stride_dkb, stride_dkn, stride_dkh,
                   stride_dvb, stride_dvn, stride_dvh, stride_lb, stride_lh,
                   col_lay_h, col_width, row_lay_h, row_width, n_kv_tiles, n_q_tiles, nheads, group,
                   seqlen_q, seqlen_k, sm_scale, qk_scale, drop_thresh, drop_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                   BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, ROLE: tl.constexpr, PREFETCH: tl.constexpr):
    """Backward programs; axis 1 is batch * key/value heads. ROLE 1: program pid computes dK/dV of key
    tile pid (tiles BLOCK_M1 x BLOCK_N1). ROLE 2: program pid computes dQ of query tile pid % n_q_tiles
    of the group's query head pid // n_q_tiles (tiles BLOCK_M2 x BLOCK_N2). ROLE 0: both in one launch,
    the first n_kv_tiles programs as ROLE 1, the rest as ROLE 2."""
    pid = tl.program_id(0)
    bhk = tl.program_id(1)
    nheads_k = nheads // group
    b = bhk // nheads_k
    hk = bhk % nheads_k
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    if ROLE == 0:
        is_dkdv = pid < n_kv_tiles
        j = pid - n_kv_tiles
    else:
        is_dkdv = ROLE == 1
        j = pid
    if is_dkdv:
        _bs_dkdv_program(pid, b, hk, Q, K, V, DO, DK, DV, LSE, DELTA, seed, COL_FULL, COL_PART, COL_IDX,
                         stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                         stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                         stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                         stride_lb, stride_lh, col_lay_h, col_width, nheads, group, seqlen_q, seqlen_k,
                         sm_scale, qk_scale, drop_thresh, drop_scale,
                         HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, HAS_DROPOUT, PREFETCH)
    else:
        h = hk * group + j // n_q_tiles
        _bs_dq_program(j % n_q_tiles, b, h, Q, K, V, DO, DQ, LSE, DELTA, seed, ROW_FULL, ROW_PART, ROW_IDX,
                       stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                       stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                       stride_dqb, stride_dqm, stride_dqh, stride_lb, stride_lh,
                       row_lay_h, row_width, nheads, group, seqlen_q, seqlen_k, sm_scale, qk_scale,
                       drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, HAS_DROPOUT,
                       PREFETCH)


# ------------------------------------------------------------------------------------------------
# Launcher
# ------------------------------------------------------------------------------------------------
# Tiles per kernel and head-dim class (<= 64, > 64) on the GPU: "fwd" (BLOCK_M, BLOCK_N, num_warps,
# num_stages); "bwd" (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages): dK/dV tiles
# (query x key), then dQ tiles; "bwd_mode": how the backward launches (see BWD_MODE). Each tile is capped
# at block_size (tiles must divide it). Fixed rather than autotuned because the cached tables depend on
# them. Chosen from H100 measurements at 16K, butterfly, bf16: results/blocksparse/sweep.md (forward),
# bwd_variants.log (backward kernels alone) and bwd_modes.log (launch modes x tiles, end to end).
TILES = {
    64: {"fwd": (64, 64, 4, 3), "bwd": (64, 64, 64, 64, 4, 3), "bwd_mode": "split"},
    128: {"fwd": (128, 128, 8, 3), "bwd": (64, 128, 128, 64, 8, 3), "bwd_mode": "fused"},
}
_INTERP_TILE = 16
# How the backward's two kinds of program are launched: "split" (two launches, one after the other),
# "streams" (dQ on a side stream, concurrent with dK/dV) or "fused" (one launch holding both kinds; the
# kernel's shared memory then serves both, which costs occupancy with some tiles). None: the per-head-dim
# choice in TILES. FLASH_BS_BWD=split|streams|fused overrides it (for A/B timing).
BWD_MODE = os.environ.get("FLASH_BS_BWD") or None
# Load each listed tile's index one loop iteration ahead (see _next_tile); FLASH_BS_PREFETCH=0 for A/B.
PREFETCH_INDEX = os.environ.get("FLASH_BS_PREFETCH", "1") == "1"
_SIDE_STREAMS: dict = {}


def _side_stream(device):
    key = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[key]


def _tiles(kind: str, block_size: int, head_dim: int) -> tuple[int, ...]:
    if _interpreting():
        t = math.gcd(block_size, _INTERP_TILE)
        return (t, t, 4, 1) if kind == "fwd" else (t, t, t, t, 4, 1)
    cfg = TILES[64 if head_dim <= 64 else 128][kind]
    *blocks, warps, stages = cfg
    if head_dim > 128:  # not tuned: keep register use in bounds
        blocks, warps, stages = [min(x, 64) for x in blocks], 4, 2
    return (*(math.gcd(block_size, x) for x in blocks), warps, stages)


def _as_layout(layout, block_size, nheads, seqlen_q, seqlen_k) -> BlockSparseLayout:
    if isinstance(layout, BlockSparseLayout):
        if block_size is not None and block_size != layout.block_size:
            raise ValueError(f"block_size={block_size} differs from the layout's {layout.block_size}")
        blocks, block_size = layout.blocks, layout.block_size
    else:
        blocks = layout
        block_size = 128 if block_size is None else block_size
    if not isinstance(block_size, int) or block_size < 16 or block_size % 16:
        raise ValueError(f"block_size must be a multiple of 16 (64 and 128 are tuned), got {block_size}")
    check_layout_tensor(blocks, nheads, cdiv(seqlen_q, block_size), cdiv(seqlen_k, block_size))
    if isinstance(layout, BlockSparseLayout):
        if (layout.seqlen_q, layout.seqlen_k) == (seqlen_q, seqlen_k):
            return layout
        return BlockSparseLayout(blocks, block_size, seqlen_q, seqlen_k, layout.causal)
    return BlockSparseLayout(blocks, block_size, seqlen_q, seqlen_k)


def _lay_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else 0  # one layout shared by all heads


def _drop_consts(dropout_p: float):
    # The encoding kernels.flash.dropout_keep documents: keep iff 24 random bits >= round(p * 2^24).
    return int(round(dropout_p * (1 << 24))), 1.0 / (1.0 - dropout_p)


def _bs_forward(q, k, v, layout, causal, sm_scale, dropout_p):
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    bm, bn, warps, stages = _tiles("fwd", layout.block_size, d)
    tab = compress_layout(layout, seqlen_q, seqlen_k, causal, bm, bn, q.device)
    o = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    seed = draw_dropout_seed(q.device) if dropout_p > 0 else lse  # any pointer when unused
    thresh, drop_scale = _drop_consts(dropout_p)
    _bs_fwd_kernel[(cdiv(seqlen_q, bm), batch * nheads)](
        q, k, v, o, lse, seed, tab.row_full, tab.row_part, tab.row_idx,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], *lse.stride()[:2],
        _lay_stride(tab.row_full), tab.row_idx.shape[-1], nheads, nheads // k.shape[2], seqlen_q, seqlen_k,
        sm_scale * LOG2E, thresh, drop_scale,
        HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, HAS_DROPOUT=dropout_p > 0,
        PREFETCH=PREFETCH_INDEX, num_warps=warps, num_stages=stages,
    )
    return o, lse, seed


def _bs_backward(do, q, k, v, o, lse, seed, layout, causal, sm_scale, dropout_p):
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    if do.stride(-1) != 1:
        do = do.contiguous()
    delta = bwd_preprocess(o, do)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    thresh, drop_scale = _drop_consts(dropout_p)
    bm1, bn1, bm2, bn2, warps, stages = _tiles("bwd", layout.block_size, d)
    cols = compress_layout(layout, seqlen_q, seqlen_k, causal, bm1, bn1, q.device)
    rows = compress_layout(layout, seqlen_q, seqlen_k, causal, bm2, bn2, q.device)
    n_kv_tiles, n_q_tiles = cdiv(seqlen_k, bn1), cdiv(seqlen_q, bm2)
    args = (q, k, v, do, dq, dk, dv, lse, delta, seed,
            cols.col_full, cols.col_part, cols.col_idx, rows.row_full, rows.row_part, rows.row_idx,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],  # (batch, seq, head)
            *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], *lse.stride()[:2],
            _lay_stride(cols.col_full), cols.col_idx.shape[-1], _lay_stride(rows.row_full), rows.row_idx.shape[-1],
            n_kv_tiles, n_q_tiles, nheads, group, seqlen_q, seqlen_k, sm_scale, sm_scale * LOG2E, thresh,
            drop_scale)
    consts = dict(HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2, BLOCK_N2=bn2,
                  CAUSAL=causal, HAS_DROPOUT=dropout_p > 0, PREFETCH=PREFETCH_INDEX, num_warps=warps,
                  num_stages=stages)
    bhk = batch * nheads_k
    mode = BWD_MODE or TILES[64 if d <= 64 else 128]["bwd_mode"]
    if mode == "streams" and not q.is_cuda:
        mode = "split"

    def launch(role, n_programs):
        _bs_bwd_kernel[(n_programs, bhk)](*args, ROLE=role, **consts)

    if mode == "fused":
        launch(0, n_kv_tiles + group * n_q_tiles)
    elif mode == "streams":
        # dQ on a side stream, concurrent with dK/dV: neither kernel leaves its own tail wave.
        main = torch.cuda.current_stream(q.device)
        side = _side_stream(q.device)
        side.wait_stream(main)
        launch(1, n_kv_tiles)
        with torch.cuda.stream(side):
            launch(2, group * n_q_tiles)
        main.wait_stream(side)
    else:
        launch(1, n_kv_tiles)
        launch(2, group * n_q_tiles)
    return dq, dk, dv


class _BlockSparseAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, causal, sm_scale, dropout_p):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        o, lse, seed = _bs_forward(q, k, v, layout, causal, sm_scale, dropout_p)
        ctx.save_for_backward(q, k, v, o, lse, seed)
        ctx.layout, ctx.causal, ctx.sm_scale, ctx.dropout_p = layout, causal, sm_scale, dropout_p
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, seed = ctx.saved_tensors
        dq, dk, dv = _bs_backward(do, q, k, v, o, lse, seed, ctx.layout, ctx.causal, ctx.sm_scale, ctx.dropout_p)
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
    check_inputs(q, k, v, dropout_p=dropout_p)
    batch, seqlen_q, nheads, d = q.shape
    lay = _as_layout(layout, block_size, nheads, seqlen_q, k.shape[1])
    causal = bool(causal) or lay.causal
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
