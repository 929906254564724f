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
- Varlen (`blocksparse_attn_varlen_func`, padding removed): packed sequences of different lengths, the
  layout applied to each from its own first token. The tables are built once for the layout's (padded)
  length; a program of a shorter sequence counts how many of its listed tiles fit (one vector load of
  its row: indices ascend within each kind), runs those wholly inside unmasked, masks the one it ends
  in and skips the rest, so a padded batch costs what its real tokens cost, never dense attention.

The per-tile work (online-softmax step with optional masking and fused dropout, the dK/dV and dQ
recomputation steps, the dropout RNG, input checks, delta preprocessing) is kernels/flash.py's, shared
with the dense kernel; this module only adds the layout walk. So dropout masks equal the dense kernel's
for the same seed, and a full layout computes what flash_attn_func does (bit for bit in the forward
when the tiles match, as under the interpreter; on the GPU the two pick tiles independently).

Supports: fp16/bf16 (fp32 for tests), head dims that are multiples of 8 up to 256 (tuned: 64, 128),
per-head layouts, block_size any multiple of 16 (64 and 128 tuned), seqlen_q != seqlen_k, varlen,
dropout, grouped-query K/V (each K/V head loops over its query heads' layouts; no atomics).
Limits: tile sizes are fixed per kernel (the cached tables depend on them, so no autotuning); a very
unbalanced layout gives unbalanced programs (no persistent scheduling); the layout is the same for
every batch element (varlen: every sequence, from its start); causal varlen needs self-attention;
pass a BlockSparseLayout (not a bare tensor) to reuse its compressed tables.

Measured on an H100 (results/blocksparse/h100.md, bf16, non-causal, block_size 128): butterfly at 16K
tokens (density 1/16) runs forward+backward 13.6x (hd 64) / 13.7x (hd 128) faster than our dense
kernel; 64K tokens fits in about 1 GB of extra memory. Against FlexAttention with the same block mask:
1.06-1.31x faster at hd 64, 1.01-1.35x at hd 128 (device time alone, from CUDA graph replays: 1.14-1.28x
and 0.99-1.09x); results/blocksparse/README.md.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.flash import (
    TensorGeometry,
    _bwd_preprocess_launch,
    _drop_consts,
    _fresh_grads,
    _key_geometry,
    _lastdim_contig,
    _new_grads,
    _packed_lse_geometry,
    LOG2E,
    _block_d,
    _check_qkv,
    _interpreting,
    _PER_BATCH_INTS,
    _strides,
    _varlen_max,
    aligned_lse_strides,
    bwd_dkdv_block_step,
    bwd_dq_block_step,
    check_inputs,
    draw_dropout_seed,
    fwd_block_step,
    fwd_finalize,
    load_row_stats,
    load_tile,
    lse_aligned,
    lse_shape,
    lse_strides,
    _plan,
    problem_sizes,
    seq_bounds,
)
from kernels import ops
from kernels.launch import Prepared
from kernels.sparsity import BlockSparseLayout, cdiv, check_layout_tensor
from kernels.standard import standard_attention

__all__ = ["blocksparse_attn_func", "blocksparse_attn_varlen_func", "compress_layout", "blocksparse_reference", "CompressedLayout"]


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
def _next_tile(idx_ptr, t, nxt, n_total):
    """(index of listed tile t, index of tile t + 1 loaded ahead). The index used now was loaded one
    iteration earlier, so the tile loads' addresses depend only on a loop-carried value and the
    software pipeliner can issue them early (this closed the gap to FlexAttention; NOTES_blocksparse.md)."""
    cur = nxt
    nxt = tl.load(idx_ptr + t + 1, mask=t + 1 < n_total, other=0)
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
def _row_reach(idx_ptr, n_full, n_total, limit, TILE: tl.constexpr, WIDTH: tl.constexpr):
    """Varlen: the tables were built for the layout's length; this sequence ends at `limit` tokens.
    Listed indices ascend within each kind, so the tiles that fit form prefixes. Returns
    (n_fast, full_end, part_end): full tiles [0, n_fast) lie wholly inside the sequence (no element
    mask), [n_fast, full_end) straddle its end (at most one), and partial tiles [n_full, part_end)
    start inside it; the rest lie past the end and are skipped."""
    offs = tl.arange(0, WIDTH)
    idx = tl.load(idx_ptr + offs, mask=offs < n_total, other=0)
    is_full = offs < n_full
    is_part = (offs >= n_full) & (offs < n_total)
    starts_inside = idx * TILE < limit
    n_fast = tl.sum((is_full & ((idx + 1) * TILE <= limit)).to(tl.int32), 0)
    full_end = tl.sum((is_full & starts_inside).to(tl.int32), 0)
    part_end = n_full + tl.sum((is_part & starts_inside).to(tl.int32), 0)
    return n_fast, full_end, part_end


# One loop stage each: listed tiles t_lo .. t_hi of a row through one of kernels/flash.py's steps, with
# the stage's masking fixed at compile time. Each returns the index prefetched for the next stage.
@triton.jit
def _fwd_stage(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, idx_ptr, t_lo, t_hi, nxt, n_total, offs_m,
               offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_SEQ: tl.constexpr,
               HAS_DROPOUT: tl.constexpr):
    for t in range(t_lo, t_hi):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total)
        acc, m_i, l_i = fwd_block_step(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, cur * BLOCK_N, offs_m,
                                       offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh,
                                       HEAD_DIM, BLOCK_D, MASK_CAUSAL, MASK_SEQ, HAS_DROPOUT)
    return acc, m_i, l_i, nxt


@triton.jit
def _dkdv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, idx_ptr, t_lo, t_hi, nxt,
                n_total, offs_m, cols, offs_d, seqlen_q, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, MASK_ROWS: tl.constexpr):
    for t in range(t_lo, t_hi):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total)
        dk, dv = bwd_dkdv_block_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                     cur * BLOCK_M, offs_m, cols, offs_d, seqlen_q, diag, qk_scale, seed, bh,
                                     drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, MASK_CAUSAL, HAS_DROPOUT, MASK_ROWS)
    return dk, dv, nxt


@triton.jit
def _dq_stage(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, idx_ptr, t_lo, t_hi, nxt, n_total, rows,
              offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_SEQ: tl.constexpr,
              HAS_DROPOUT: tl.constexpr):
    for t in range(t_lo, t_hi):
        cur, nxt = _next_tile(idx_ptr, t, nxt, n_total)
        dq = bwd_dq_block_step(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, cur * BLOCK_N, rows,
                               offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                               HEAD_DIM, BLOCK_D, MASK_CAUSAL, MASK_SEQ, HAS_DROPOUT)
    return dq, nxt


@triton.jit(do_not_specialize=_PER_BATCH_INTS)  # the LSE strides: see kernels/flash.py
def _bs_fwd_kernel(Q, K, V, O, LSE, SEED, ROW_FULL, ROW_PART, ROW_IDX, CU_Q, CU_K,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                   stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k, qk_scale, drop_thresh,
                   drop_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   VARLEN: tl.constexpr, IDX_WIDTH: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    # Varlen: sequence b's own bounds; the layout applies from its first token.
    q_start, seqlen_q, k_start, seqlen_k = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, VARLEN)
    if pid_m * BLOCK_M >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b64 * stride_qb + h * stride_qh + q_start.to(tl.int64) * stride_qm, stride_qm, offs_m,
                  offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
    k_base = K + b64 * stride_kb + (h // group) * stride_kh + k_start.to(tl.int64) * stride_kn
    v_base = V + b64 * stride_vb + (h // group) * stride_vh + k_start.to(tl.int64) * stride_vn
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    diag = seqlen_k - seqlen_q

    n_full, n_total, idx_ptr, nxt = _layout_row(ROW_FULL, ROW_PART, ROW_IDX, h, pid_m, stride_lay_h, idx_width)
    n_fast, full_end, part_end = n_full, n_full, n_total
    if VARLEN:
        n_fast, full_end, part_end = _row_reach(idx_ptr, n_full, n_total, seqlen_k, BLOCK_N, IDX_WIDTH)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Full tiles first (in range and wholly below the diagonal: no per-element mask), then the one a
    # shorter varlen sequence ends in, then the partial tiles.
    acc, m_i, l_i, nxt = _fwd_stage(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, idx_ptr, 0, n_fast, nxt,
                                    n_total, offs_m, offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh,
                                    HEAD_DIM, BLOCK_D, BLOCK_N, False, False, HAS_DROPOUT)
    if VARLEN:
        acc, m_i, l_i, nxt = _fwd_stage(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, idx_ptr, n_fast,
                                        full_end, nxt, n_total, offs_m, offs_n, offs_d, seqlen_k, diag, qk_scale, seed,
                                        bh, drop_thresh, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, HAS_DROPOUT)
        nxt = tl.load(idx_ptr + n_full, mask=n_full < n_total, other=0)
    acc, m_i, l_i, nxt = _fwd_stage(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, idx_ptr, n_full, part_end,
                                    nxt, n_total, offs_m, offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh,
                                    drop_thresh, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, HAS_DROPOUT)
    acc, lse = fwd_finalize(acc, m_i, l_i, drop_scale, HAS_DROPOUT)  # lse in base 2, as flash.py keeps it
    row_ok = offs_m < seqlen_q
    tl.store(LSE + b64 * stride_lb + h * stride_lh + q_start + offs_m, lse, mask=row_ok)
    o_ptrs = (O + b64 * stride_ob + h * stride_oh + (q_start + offs_m)[:, None].to(tl.int64) * stride_om
              + offs_d[None, :])
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _bs_dkdv_program(pid_n, b, hk, q_start, k_start, Q, K, V, DO, DK, DV, LSE, DELTA, seed,
                     COL_FULL, COL_PART, COL_IDX,
                     stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                     stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                     stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                     stride_lb, stride_lh, stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k,
                     sm_scale, qk_scale, drop_thresh, drop_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                     VARLEN: tl.constexpr, IDX_WIDTH: tl.constexpr):
    """dK and dV of key tile `pid_n` of (batch b, key/value head hk): walk the transposed layout."""
    b64 = b.to(tl.int64)
    q_off = q_start.to(tl.int64)
    k_off = k_start.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + b64 * stride_kb + hk * stride_kh + k_off * stride_kn, stride_kn, cols, offs_d, seqlen_k,
                  HEAD_DIM, BLOCK_D, True)
    v = load_tile(V + b64 * stride_vb + hk * stride_vh + k_off * stride_vn, stride_vn, cols, offs_d, seqlen_k,
                  HEAD_DIM, BLOCK_D, True)
    diag = seqlen_k - seqlen_q
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # Grouped-query attention: this key/value head collects from each query head of its group, each
    # walking its own layout column, so dK/dV need no atomics.
    for g in range(0, group):
        h = hk * group + g
        bh = b * nheads + h
        q_base = Q + b64 * stride_qb + h * stride_qh + q_off * stride_qm
        do_base = DO + b64 * stride_dob + h * stride_doh + q_off * stride_dom
        lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start
        delta_base = DELTA + b64 * stride_lb + h * stride_lh + q_start
        n_full, n_total, idx_ptr, nxt = _layout_row(COL_FULL, COL_PART, COL_IDX, h, pid_n, stride_lay_h,
                                                    idx_width)
        n_fast, full_end, part_end = n_full, n_full, n_total
        if VARLEN:
            n_fast, full_end, part_end = _row_reach(idx_ptr, n_full, n_total, seqlen_q, BLOCK_M, IDX_WIDTH)
        # Full query tiles lie wholly inside the sequence: no row masks on their loads.
        dk, dv, nxt = _dkdv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, idx_ptr,
                                  0, n_fast, nxt, n_total, offs_m, cols, offs_d, seqlen_q, diag, qk_scale, seed, bh,
                                  drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False, HAS_DROPOUT, False)
        if VARLEN:
            dk, dv, nxt = _dkdv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                      idx_ptr, n_fast, full_end, nxt, n_total, offs_m, cols, offs_d, seqlen_q, diag,
                                      qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL,
                                      HAS_DROPOUT, True)
            nxt = tl.load(idx_ptr + n_full, mask=n_full < n_total, other=0)
        dk, dv, nxt = _dkdv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, idx_ptr,
                                  n_full, part_end, nxt, n_total, offs_m, cols, offs_d, seqlen_q, diag, qk_scale, seed,
                                  bh, drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, HAS_DROPOUT, True)
    dk = dk * sm_scale
    ok = (cols[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    rows64 = k_off + cols[:, None].to(tl.int64)
    tl.store(DK + b64 * stride_dkb + hk * stride_dkh + rows64 * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=ok)
    tl.store(DV + b64 * stride_dvb + hk * stride_dvh + rows64 * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=ok)


@triton.jit
def _bs_dq_program(pid_m, b, h, q_start, k_start, Q, K, V, DO, DQ, LSE, DELTA, seed, ROW_FULL, ROW_PART, ROW_IDX,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                   stride_dqb, stride_dqm, stride_dqh, stride_lb, stride_lh,
                   stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k, sm_scale, qk_scale,
                   drop_thresh, drop_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   VARLEN: tl.constexpr, IDX_WIDTH: tl.constexpr):
    """dQ of query tile `pid_m` of (batch b, query head h): walk the forward layout."""
    bh = b * nheads + h
    b64 = b.to(tl.int64)
    q_off = q_start.to(tl.int64)
    k_off = k_start.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b64 * stride_qb + h * stride_qh + q_off * stride_qm, stride_qm, rows, offs_d, seqlen_q,
                  HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + b64 * stride_dob + h * stride_doh + q_off * stride_dom, stride_dom, rows, offs_d, seqlen_q,
                   HEAD_DIM, BLOCK_D, True)
    lse, delta = load_row_stats(LSE + b64 * stride_lb + h * stride_lh + q_start,
                                DELTA + b64 * stride_lb + h * stride_lh + q_start, rows, seqlen_q)
    k_base = K + b64 * stride_kb + (h // group) * stride_kh + k_off * stride_kn
    v_base = V + b64 * stride_vb + (h // group) * stride_vh + k_off * stride_vn
    diag = seqlen_k - seqlen_q
    n_full, n_total, idx_ptr, nxt = _layout_row(ROW_FULL, ROW_PART, ROW_IDX, h, pid_m, stride_lay_h, idx_width)
    n_fast, full_end, part_end = n_full, n_full, n_total
    if VARLEN:
        n_fast, full_end, part_end = _row_reach(idx_ptr, n_full, n_total, seqlen_k, BLOCK_N, IDX_WIDTH)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq, nxt = _dq_stage(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, idx_ptr, 0, n_fast, nxt, n_total,
                        rows, offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                        HEAD_DIM, BLOCK_D, BLOCK_N, False, False, HAS_DROPOUT)
    if VARLEN:
        dq, nxt = _dq_stage(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, idx_ptr, n_fast, full_end, nxt,
                            n_total, rows, offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                            HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, HAS_DROPOUT)
        nxt = tl.load(idx_ptr + n_full, mask=n_full < n_total, other=0)
    dq, nxt = _dq_stage(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, idx_ptr, n_full, part_end, nxt,
                        n_total, rows, offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                        HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, HAS_DROPOUT)
    dq = dq * sm_scale
    ok = (rows[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DQ + b64 * stride_dqb + h * stride_dqh + (q_off + rows[:, None].to(tl.int64)) * stride_dqm
             + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=_PER_BATCH_INTS)
def _bs_bwd_kernel(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, SEED,
                   COL_FULL, COL_PART, COL_IDX, ROW_FULL, ROW_PART, ROW_IDX, CU_Q, CU_K,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                   stride_dqb, stride_dqm, stride_dqh, stride_dkb, stride_dkn, stride_dkh,
                   stride_dvb, stride_dvn, stride_dvh, stride_lb, stride_lh,
                   col_lay_h, col_width, row_lay_h, row_width, n_kv_tiles, n_q_tiles, nheads, group,
                   seqlen_q, seqlen_k, sm_scale, qk_scale, drop_thresh, drop_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                   BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, ROLE: tl.constexpr, VARLEN: tl.constexpr,
                   COL_WIDTH: tl.constexpr, ROW_WIDTH: tl.constexpr, LSE_ALIGNED: tl.constexpr):
    """Backward programs; axis 1 is batch * key/value heads. ROLE 1: program pid computes dK/dV of key
    tile pid (tiles BLOCK_M1 x BLOCK_N1). ROLE 2: program pid computes dQ of query tile pid % n_q_tiles
    of the group's query head pid // n_q_tiles (tiles BLOCK_M2 x BLOCK_N2). ROLE 0: both in one launch,
    the first n_kv_tiles programs as ROLE 1, the rest as ROLE 2. Varlen: programs past their
    sequence's end do nothing."""
    pid = tl.program_id(0)
    bhk = tl.program_id(1)
    nheads_k = nheads // group
    b = bhk // nheads_k
    hk = bhk % nheads_k
    q_start, seqlen_q, k_start, seqlen_k = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, VARLEN)
    stride_lb, stride_lh = aligned_lse_strides(stride_lb, stride_lh, LSE_ALIGNED)
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
        if pid * BLOCK_N1 < seqlen_k:
            _bs_dkdv_program(pid, b, hk, q_start, k_start, Q, K, V, DO, DK, DV, LSE, DELTA, seed,
                             COL_FULL, COL_PART, COL_IDX,
                             stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                             stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                             stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                             stride_lb, stride_lh, col_lay_h, col_width, nheads, group, seqlen_q, seqlen_k,
                             sm_scale, qk_scale, drop_thresh, drop_scale,
                             HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, HAS_DROPOUT, VARLEN, COL_WIDTH)
    else:
        pid_m = j % n_q_tiles
        if pid_m * BLOCK_M2 < seqlen_q:
            h = hk * group + j // n_q_tiles
            _bs_dq_program(pid_m, b, h, q_start, k_start, Q, K, V, DO, DQ, LSE, DELTA, seed,
                           ROW_FULL, ROW_PART, ROW_IDX,
                           stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                           stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                           stride_dqb, stride_dqm, stride_dqh, stride_lb, stride_lh,
                           row_lay_h, row_width, nheads, group, seqlen_q, seqlen_k, sm_scale, qk_scale,
                           drop_thresh, drop_scale, HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, HAS_DROPOUT,
                           VARLEN, ROW_WIDTH)


# ------------------------------------------------------------------------------------------------
# Launcher
# ------------------------------------------------------------------------------------------------
# Tiles per kernel and head-dim class (<= 64, > 64) on the GPU: "fwd" (BLOCK_M, BLOCK_N, num_warps,
# num_stages); "bwd" (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages): dK/dV tiles
# (query x key), then dQ tiles; "bwd_mode": "split" launches the dK/dV programs, then the dQ programs;
# "fused" launches both kinds in one grid (their shared memory then serves both, which costs occupancy
# with some tiles). Each tile is capped at block_size (tiles must divide it). Fixed rather than
# autotuned because the cached tables depend on them. Chosen from H100 measurements at 16K, butterfly,
# bf16 (kernels/NOTES_blocksparse.md: forward sweep, backward kernels alone, launch modes x tiles).
TILES = {
    64: {"fwd": (64, 64, 4, 3), "bwd": (64, 64, 64, 64, 4, 3), "bwd_mode": "split"},
    128: {"fwd": (128, 128, 8, 3), "bwd": (64, 128, 128, 64, 8, 3), "bwd_mode": "fused"},
}
_INTERP_TILE = 16


def _tiles(kind: str, block_size: int, head_dim: int) -> tuple[int, ...]:
    if _interpreting():
        t = math.gcd(block_size, _INTERP_TILE)
        return (t, t, 4, 1) if kind == "fwd" else (t, t, t, t, 4, 1)
    cfg = TILES[64 if head_dim <= 64 else 128][kind]
    *blocks, warps, stages = cfg
    if head_dim > 128:  # not tuned: keep register use in bounds
        blocks, warps, stages = [min(x, 64) for x in blocks], 4, 2
    return (*(math.gcd(block_size, x) for x in blocks), warps, stages)


def _bwd_mode(head_dim: int) -> str:
    return TILES[64 if head_dim <= 64 else 128]["bwd_mode"]


def _as_layout(layout, block_size, nheads, seqlen_q, seqlen_k, varlen: bool = False) -> BlockSparseLayout:
    """A BlockSparseLayout for these lengths. Varlen: the layout's own lengths are kept (at least the
    longest sequence); each sequence uses its top-left corner."""
    if isinstance(layout, BlockSparseLayout):
        if block_size is not None and block_size != layout.block_size:
            raise ValueError(f"block_size={block_size} differs from the layout's {layout.block_size}")
        blocks, block_size = layout.blocks, layout.block_size
    else:
        blocks = layout
        block_size = 128 if block_size is None else block_size
    if not isinstance(block_size, int) or block_size < 16 or block_size % 16:
        raise ValueError(f"block_size must be a multiple of 16 (64 and 128 are tuned), got {block_size}")
    if varlen:
        if not isinstance(layout, BlockSparseLayout):
            raise TypeError("the varlen block-sparse kernel takes a kernels.sparsity.BlockSparseLayout (it says "
                            "which sequence length the layout was built for)")
        if layout.seqlen_q < seqlen_q or layout.seqlen_k < seqlen_k:
            raise ValueError(f"the layout covers ({layout.seqlen_q}, {layout.seqlen_k}) tokens but the longest "
                             f"sequence has ({seqlen_q}, {seqlen_k}); build it for the padded length")
        check_layout_tensor(blocks, nheads, layout.nblocks_q, layout.nblocks_k)
        return layout
    check_layout_tensor(blocks, nheads, cdiv(seqlen_q, block_size), cdiv(seqlen_k, block_size))
    if isinstance(layout, BlockSparseLayout):
        if (layout.seqlen_q, layout.seqlen_k) == (seqlen_q, seqlen_k):
            return layout
        return BlockSparseLayout(blocks, block_size, seqlen_q, seqlen_k, layout.causal)
    return BlockSparseLayout(blocks, block_size, seqlen_q, seqlen_k)


def _lay_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else 0  # one layout shared by all heads


def _width(table: torch.Tensor) -> int:
    """Power-of-two vector width covering one row of an index table (varlen's _row_reach)."""
    return max(16, 1 << (table.shape[-1] - 1).bit_length())


def _kernel_tables(layout: BlockSparseLayout, causal: bool, head_dim: int, device, varlen: bool, seqlen_q: int,
                   seqlen_k: int) -> list[torch.Tensor]:
    """The nine index tables the kernels walk, at the tiles `_tiles` picks: forward rows, then the
    backward's dK/dV columns and dQ rows (cached on the layout). Varlen: built for the layout's own
    lengths; dense: for these."""
    lay_q, lay_k = (layout.seqlen_q, layout.seqlen_k) if varlen else (seqlen_q, seqlen_k)
    bm, bn, _, _ = _tiles("fwd", layout.block_size, head_dim)
    bm1, bn1, bm2, bn2, _, _ = _tiles("bwd", layout.block_size, head_dim)
    fwd = compress_layout(layout, lay_q, lay_k, causal, bm, bn, device)
    cols = compress_layout(layout, lay_q, lay_k, causal, bm1, bn1, device)
    rows = compress_layout(layout, lay_q, lay_k, causal, bm2, bn2, device)
    return [fwd.row_full, fwd.row_part, fwd.row_idx, cols.col_full, cols.col_part, cols.col_idx,
            rows.row_full, rows.row_part, rows.row_idx]


def _bs_forward(q, k, v, tables, block_size, causal, sm_scale, dropout_p, cu_q=None, cu_k=None, max_q=None,
                max_k=None):
    """Dense: q (batch, seqlen_q, nheads, d). Varlen (cu_q given): q (total_q, nheads, d), the tables
    built for the layout's own lengths and the grid sized by the longest sequence. Through a plan per call geometry
    (kernels/flash.py's `_plan`): the launch's arguments are worked out once per geometry, a call allocates and
    launches."""
    # varlen: keyed without the packed length, which changes every batch (kernels/flash.py `_key_geometry`)
    geometry, varlen_key = _key_geometry(cu_q, cu_k, max_q, max_k)
    plan = _plan(_bs_fwd_setup, (
        geometry(q), geometry(k), geometry(v), tuple(map(TensorGeometry, tables[:3])), *varlen_key, block_size,
        causal, sm_scale, dropout_p, _interpreting()))
    return plan(q, k, v, tables, cu_q, cu_k)


class _BlockSparseForward:
    """One call geometry's forward launch, worked out by `_bs_fwd_setup`."""

    __slots__ = ("device", "o_dtype", "dropout", "varlen", "kernel")

    def __call__(self, q, k, v, tables, cu_q, cu_k):
        device, varlen = self.device, self.varlen
        lse = torch.empty(lse_shape(q, varlen), dtype=torch.float32, device=device)
        o = torch.empty(q.shape, dtype=self.o_dtype, device=device)
        # a tensor of its own without dropout: the operator's outputs may not alias
        seed = draw_dropout_seed(device) if self.dropout else torch.zeros(1, dtype=torch.int64, device=device)
        if varlen:  # the LSE's head stride: this batch's packed length
            self.kernel.run((q, k, v, o, lse, seed, tables[0], tables[1], tables[2], cu_q, cu_k), (lse.stride(0),))
        else:
            self.kernel(q, k, v, o, lse, seed, tables[0], tables[1], tables[2], lse, lse)
        return o, lse, seed


def _bs_fwd_setup(q, k, v, fwd_tables, cu_q, cu_k, max_q, max_k, block_size, causal, sm_scale, dropout_p,
                  interpreting):
    """`_bs_forward`'s plan from the call's geometries (kernels.flash.TensorGeometry)."""
    varlen = cu_q is not None
    nheads, d = q.shape[-2], q.shape[-1]
    batch, max_q, max_k = problem_sizes(q, k, cu_q, max_q, max_k)
    if varlen:  # the maxima only size the grid: keep their divisibility by 16 fixed (see kernels/flash.py)
        max_q, max_k = _varlen_max(max_q), _varlen_max(max_k)
    plan = _BlockSparseForward()
    plan.device, plan.o_dtype, plan.varlen, plan.dropout = q.device, q.dtype, varlen, dropout_p > 0
    lse = TensorGeometry.fresh(lse_shape(q, varlen), torch.float32, q.device)
    o = TensorGeometry.fresh(q.shape, q.dtype, q.device)
    slb, slh = lse_strides(lse, varlen)
    bm, bn, warps, stages = _tiles("fwd", block_size, d)
    row_full, _, row_idx = fwd_tables
    thresh, drop_scale = _drop_consts(dropout_p)
    numbers = (*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(o, varlen), slb)
    plan.kernel = Prepared(
        _bs_fwd_kernel, (cdiv(max_q, bm), batch * nheads),
        (*numbers, slh, _lay_stride(row_full), row_idx.shape[-1], nheads, nheads // k.shape[-2], max_q, max_k,
         sm_scale * LOG2E, thresh, drop_scale),
        dict(HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, HAS_DROPOUT=dropout_p > 0,
             VARLEN=varlen, IDX_WIDTH=_width(row_idx) if varlen else 16, num_warps=warps, num_stages=stages),
        varying=(len(numbers),) if varlen else ())
    return plan


def _bs_backward(do, q, k, v, o, lse, seed, tables, block_size, causal, sm_scale, dropout_p, cu_q=None, cu_k=None,
                 max_q=None, max_k=None, out=None):
    """(dq, dk, dv); out: three tensors shaped like q, k, v to write them into (views of one packed dqkv). Through a
    plan per call geometry, as `_bs_forward`."""
    do = _lastdim_contig(do)
    geometry, varlen_key = _key_geometry(cu_q, cu_k, max_q, max_k)  # as `_bs_forward`'s
    plan = _plan(_bs_bwd_setup, (
        geometry(do), geometry(q), geometry(k), geometry(v), geometry(o),
        TensorGeometry(lse) if cu_q is None else _packed_lse_geometry(lse), TensorGeometry(seed),
        tuple(map(TensorGeometry, tables[3:])), *varlen_key, None if out is None else tuple(map(geometry, out)),
        block_size, causal, sm_scale, dropout_p, _interpreting()))
    return plan(do, q, k, v, o, lse, seed, tables, cu_q, cu_k, out)


class _BlockSparseBackward:
    """One call geometry's backward launches (delta, then dK/dV and dQ: one kernel or two), worked out by
    `_bs_bwd_setup`."""

    __slots__ = ("device", "grad_dtypes", "varlen", "preprocess", "launches")

    def __call__(self, do, q, k, v, o, lse, seed, tables, cu_q, cu_k, out):
        device, varlen = self.device, self.varlen
        delta = torch.empty(lse_shape(o, varlen), dtype=torch.float32, device=device)
        dq, dk, dv = _new_grads(q, k, v, self.grad_dtypes, device) if out is None else out
        if varlen:  # the packed length: delta's head stride, and the LSE's
            self.preprocess.run((o, do, delta, o, cu_q), (o.shape[0],))
            tensors, values = (q, k, v, do, dq, dk, dv, lse, delta, seed, *tables[3:], cu_q, cu_k), (lse.stride(0),)
        else:
            self.preprocess(o, do, delta, o, o)
            tensors, values = (q, k, v, do, dq, dk, dv, lse, delta, seed, *tables[3:], lse, lse), ()
        for kernel in self.launches:
            kernel.run(tensors, values)
        return dq, dk, dv


def _bs_bwd_setup(do, q, k, v, o, lse, seed, bwd_tables, cu_q, cu_k, max_q, max_k, grads, block_size, causal,
                  sm_scale, dropout_p, interpreting):
    """`_bs_backward`'s plan from the call's geometries (kernels.flash.TensorGeometry)."""
    varlen = cu_q is not None
    nheads, d = q.shape[-2], q.shape[-1]
    nheads_k = k.shape[-2]
    group = nheads // nheads_k
    batch, max_q, max_k = problem_sizes(q, k, cu_q, max_q, max_k)
    if varlen:
        max_q, max_k = _varlen_max(max_q), _varlen_max(max_k)
    slb, slh = lse_strides(lse, varlen)
    plan = _BlockSparseBackward()
    plan.device, plan.varlen = q.device, varlen
    delta = TensorGeometry.fresh(lse_shape(o, varlen), torch.float32, q.device)
    plan.preprocess = _bwd_preprocess_launch(o, do, delta, None, varlen, batch, max_q if varlen else o.shape[1])
    plan.grad_dtypes = (q.dtype, k.dtype, v.dtype)
    dq, dk, dv = _fresh_grads(q, k, v, device=q.device)[1] if grads is None else grads
    thresh, drop_scale = _drop_consts(dropout_p)
    bm1, bn1, bm2, bn2, warps, stages = _tiles("bwd", block_size, d)
    col_full, _, col_idx, row_full, _, row_idx = bwd_tables
    n_kv_tiles, n_q_tiles = cdiv(max_k, bn1), cdiv(max_q, bm2)
    numbers = (*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen),
               *_strides(dq, varlen), *_strides(dk, varlen), *_strides(dv, varlen), slb)
    varying = (len(numbers),) if varlen else ()  # slh
    numbers += (slh, _lay_stride(col_full), col_idx.shape[-1], _lay_stride(row_full), row_idx.shape[-1],
               n_kv_tiles, n_q_tiles, nheads, group, max_q, max_k, sm_scale, sm_scale * LOG2E, thresh, drop_scale)
    consts = dict(HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2, BLOCK_N2=bn2,
                  CAUSAL=causal, HAS_DROPOUT=dropout_p > 0, VARLEN=varlen,
                  COL_WIDTH=_width(col_idx) if varlen else 16, ROW_WIDTH=_width(row_idx) if varlen else 16,
                  LSE_ALIGNED=lse_aligned(slb, slh, varlen), num_warps=warps, num_stages=stages)
    bhk = batch * nheads_k
    if _bwd_mode(d) == "fused":
        plan.launches = (Prepared(_bs_bwd_kernel, (n_kv_tiles + group * n_q_tiles, bhk), numbers, dict(consts, ROLE=0),
                                  varying=varying),)
    else:
        plan.launches = (Prepared(_bs_bwd_kernel, (n_kv_tiles, bhk), numbers, dict(consts, ROLE=1), varying=varying),
                         Prepared(_bs_bwd_kernel, (group * n_q_tiles, bhk), numbers, dict(consts, ROLE=2),
                                  varying=varying))
    return plan


# ------------------------------------------------------------------------------------------------
# The operators torch.compile sees (kernels/ops.py, as kernels/flash.py's): opaque, with fake shapes. The layout
# travels as its nine index tables (tensors), built outside the operator and cached on the layout.
# ------------------------------------------------------------------------------------------------
def _bs_fwd_fake(q, k, v, tables, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale, dropout_p):
    return (q.new_empty(q.shape), q.new_empty(lse_shape(q, cu_q is not None), dtype=torch.float32),
            q.new_empty((1,), dtype=torch.int64))


def _bs_bwd_fake(do, q, k, v, o, lse, seed, tables, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale,
                 dropout_p):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bs_op_fwd(q, k, v, tables, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale, dropout_p):
    return _bs_forward(q, k, v, tables, block_size, causal, softmax_scale, dropout_p, cu_q, cu_k, max_q, max_k)


def _bs_op_bwd(do, q, k, v, o, lse, seed, tables, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale,
               dropout_p):
    return _bs_backward(do, q, k, v, o, lse, seed, tables, block_size, causal, softmax_scale, dropout_p, cu_q, cu_k,
                        max_q, max_k)


_bs_fwd_op = ops.define("blocksparse_fwd(Tensor q, Tensor k, Tensor v, Tensor[] tables, Tensor? cu_q, Tensor? cu_k, "
                        "SymInt max_q, SymInt max_k, SymInt block_size, bool causal, float softmax_scale, "
                        "float dropout_p) -> (Tensor, Tensor, Tensor)", _bs_op_fwd, _bs_fwd_fake)
_bs_bwd_op = ops.define("blocksparse_bwd(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor seed, "
                        "Tensor[] tables, Tensor? cu_q, Tensor? cu_k, SymInt max_q, SymInt max_k, SymInt block_size, "
                        "bool causal, float softmax_scale, float dropout_p) -> (Tensor, Tensor, Tensor)",
                        _bs_op_bwd, _bs_bwd_fake)


class _BlockSparse(torch.autograd.Function):
    """Block-sparse attention of q, k, v: the launchers in eager mode, the operators under torch.compile."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale, dropout_p, *tables):
        o, lse, seed = _bs_fwd_op(q, k, v, list(tables), cu_q, cu_k, max_q, max_k, block_size, causal,
                                  softmax_scale, dropout_p)
        ctx.save_for_backward(q, k, v, o, lse, seed, cu_q, cu_k, *tables)
        ctx.args = (max_q, max_k, block_size, causal, softmax_scale, dropout_p)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, seed, cu_q, cu_k, *tables = ctx.saved_tensors
        dq, dk, dv = _bs_bwd_op(do, q, k, v, o, lse, seed, list(tables), cu_q, cu_k, *ctx.args)
        return (dq, dk, dv) + (None,) * (8 + len(tables))


# Self-attention on a fused projection's output, qkv (..., 3, nheads, headdim): the backward writes one gradient
# shaped like qkv, so neither autograd nor a compiled graph stacks three (as kernels/flash.py's packed operators).
def _bs_fwd_qkv_fake(qkv, tables, cu, max_s, block_size, causal, softmax_scale, dropout_p):
    q = qkv.select(-3, 0)
    return (q.new_empty(q.shape), q.new_empty(lse_shape(q, cu is not None), dtype=torch.float32),
            q.new_empty((1,), dtype=torch.int64))


def _bs_bwd_qkv_fake(do, qkv, o, lse, seed, tables, cu, max_s, block_size, causal, softmax_scale, dropout_p):
    return qkv.new_empty(qkv.shape)


def _bs_forward_qkv(qkv, tables, cu, max_s, block_size, causal, softmax_scale, dropout_p):
    q, k, v = qkv.unbind(dim=-3)
    return _bs_forward(q, k, v, tables, block_size, causal, softmax_scale, dropout_p, cu, cu, max_s, max_s)


def _bs_backward_qkv(do, qkv, o, lse, seed, tables, cu, max_s, block_size, causal, softmax_scale, dropout_p):
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    q, k, v = qkv.unbind(dim=-3)
    _bs_backward(do, q, k, v, o, lse, seed, list(tables), block_size, causal, softmax_scale, dropout_p, cu, cu, max_s,
                 max_s, out=dqkv.unbind(dim=-3))
    return dqkv


_bs_fwd_qkv_op = ops.define("blocksparse_fwd_qkvpacked(Tensor qkv, Tensor[] tables, Tensor? cu, SymInt max_s, "
                            "SymInt block_size, bool causal, float softmax_scale, float dropout_p) "
                            "-> (Tensor, Tensor, Tensor)", _bs_forward_qkv, _bs_fwd_qkv_fake)
_bs_bwd_qkv_op = ops.define("blocksparse_bwd_qkvpacked(Tensor do, Tensor qkv, Tensor o, Tensor lse, Tensor seed, "
                            "Tensor[] tables, Tensor? cu, SymInt max_s, SymInt block_size, bool causal, "
                            "float softmax_scale, float dropout_p) -> Tensor", _bs_backward_qkv, _bs_bwd_qkv_fake)


class _BlockSparseQKV(torch.autograd.Function):
    """Block-sparse self-attention on packed projections (see _BlockSparse)."""

    @staticmethod
    def forward(ctx, qkv, cu, max_s, block_size, causal, softmax_scale, dropout_p, *tables):
        o, lse, seed = _bs_fwd_qkv_op(qkv, list(tables), cu, max_s, block_size, causal, softmax_scale, dropout_p)
        ctx.save_for_backward(qkv, o, lse, seed, cu, *tables)
        ctx.args = (max_s, block_size, causal, softmax_scale, dropout_p)
        return o

    @staticmethod
    def backward(ctx, do):
        qkv, o, lse, seed, cu, *tables = ctx.saved_tensors
        dqkv = _bs_bwd_qkv_op(do, qkv, o, lse, seed, list(tables), cu, *ctx.args)
        return (dqkv,) + (None,) * (6 + len(tables))


def _blocksparse(q, k, v, tables, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale, dropout_p):
    q, k, v, cu_q, cu_k, *tables = ops.distinct(q, k, v, cu_q, cu_k, *tables)
    return _BlockSparse.apply(q, k, v, cu_q, cu_k, max_q, max_k, block_size, causal, softmax_scale, dropout_p, *tables)


def _blocksparse_qkv(qkv, tables, cu, max_s, block_size, causal, softmax_scale, dropout_p):
    qkv, cu, *tables = ops.distinct(qkv, cu, *tables)
    return _BlockSparseQKV.apply(qkv, cu, max_s, block_size, causal, softmax_scale, dropout_p, *tables)


def _dense_setup(q, k, layout, block_size, softmax_scale, causal):
    """(layout, causal, softmax scale, kernel tables) of a dense (batch, seqlen, nheads, headdim) call."""
    seqlen_q, nheads, d = q.shape[1], q.shape[2], q.shape[3]
    lay = _as_layout(layout, block_size, nheads, seqlen_q, k.shape[1])
    causal = bool(causal) or lay.causal
    sm_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    return lay, causal, float(sm_scale), _kernel_tables(lay, causal, d, q.device, False, seqlen_q, k.shape[1])


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
    lay, causal, sm_scale, tables = _dense_setup(q, k, layout, block_size, softmax_scale, causal)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return _blocksparse(q, k, v, tables, None, None, q.shape[1], k.shape[1], lay.block_size, causal, sm_scale,
                        float(dropout_p))


def blocksparse_attn_qkvpacked_func(qkv, layout, block_size=None, dropout_p=0.0, softmax_scale=None, causal=False):
    """blocksparse_attn_func for self-attention on packed projections: qkv (batch, seqlen, 3, nheads, headdim)
    -> (batch, seqlen, nheads, headdim); its gradient is one tensor shaped like qkv (nothing stacked)."""
    _check_qkv(qkv, False)
    q, k, v = qkv.unbind(dim=2)
    check_inputs(q, k, v, dropout_p=dropout_p)
    lay, causal, sm_scale, tables = _dense_setup(q, k, layout, block_size, softmax_scale, causal)
    return _blocksparse_qkv(qkv, tables, None, q.shape[1], lay.block_size, causal, sm_scale, float(dropout_p))


def blocksparse_attn_varlen_func(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 dropout_p=0.0, softmax_scale=None, causal=False, check_seqlens=True):
    """Block-sparse attention over packed sequences of different lengths (padding removed).

    q (total_q, nheads, headdim); k, v (total_k, nheads_k, headdim); cu_seqlens_* int32 (batch + 1,)
    prefix sums of the lengths; max_seqlen_* the longest sequence (sizes the grid). layout: a
    BlockSparseLayout built for the padded length (at least the longest sequence); it applies to each
    sequence from that sequence's first token, i.e. sequence b uses the layout's top-left
    ceil(len_b / block_size) blocks, exactly as the same sequence padded to the layout's length would
    with its padding keys masked out. causal needs a square layout and, per sequence, as many queries
    as keys (self-attention). check_seqlens=False skips the host-side check of cu_seqlens (one sync),
    for callers that built them (kernels.padding.PackedBatch). Returns (total_q, nheads, headdim).
    """
    lay, causal, sm_scale, tables = _varlen_setup(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                  max_seqlen_k, dropout_p, softmax_scale, causal, check_seqlens)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return _blocksparse(q, k, v, tables, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                        lay.block_size, causal, sm_scale, float(dropout_p))


def blocksparse_attn_varlen_qkvpacked_func(qkv, layout, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                           causal=False, check_seqlens=True):
    """blocksparse_attn_varlen_func for self-attention on packed projections: qkv (total, 3, nheads, headdim)
    -> (total, nheads, headdim); its gradient is one tensor shaped like qkv (nothing stacked)."""
    _check_qkv(qkv, True)
    q, k, v = qkv.unbind(dim=1)
    lay, causal, sm_scale, tables = _varlen_setup(q, k, v, layout, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                  dropout_p, softmax_scale, causal, check_seqlens)
    return _blocksparse_qkv(qkv, tables, cu_seqlens, int(max_seqlen), lay.block_size, causal, sm_scale,
                            float(dropout_p))


def _varlen_setup(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                  causal, check_seqlens):
    """Checks, then (layout, causal, softmax scale, kernel tables) of a varlen call."""
    check_inputs(q, k, v, varlen=True, cu_seqlens_q=cu_seqlens_q if check_seqlens else None,
                 cu_seqlens_k=cu_seqlens_k if check_seqlens else None, max_seqlen_q=max_seqlen_q,
                 max_seqlen_k=max_seqlen_k, dropout_p=dropout_p)
    nheads, d = q.shape[-2], q.shape[-1]
    lay = _as_layout(layout, None, nheads, int(max_seqlen_q), int(max_seqlen_k), varlen=True)
    causal = bool(causal) or lay.causal
    if causal:
        if lay.seqlen_q != lay.seqlen_k:
            raise ValueError(f"causal varlen block-sparse attention needs a square layout, got "
                             f"({lay.seqlen_q}, {lay.seqlen_k}) tokens")
        if check_seqlens and cu_seqlens_q is not cu_seqlens_k and not torch.equal(cu_seqlens_q, cu_seqlens_k):
            raise ValueError("causal varlen block-sparse attention needs equal query and key lengths per "
                             "sequence (cu_seqlens_q == cu_seqlens_k)")
    sm_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    tables = _kernel_tables(lay, causal, d, q.device, True, int(max_seqlen_q), int(max_seqlen_k))
    return lay, causal, float(sm_scale), tables


def blocksparse_reference(q, k, v, layout, block_size=None, softmax_scale=None, causal=False, dropout_p=0.0,
                          dropout_mask=None):
    """Plain-PyTorch block-sparse attention: standard attention with the token-level mask."""
    batch, seqlen_q, nheads, _ = q.shape
    lay = _as_layout(layout, block_size, nheads, seqlen_q, k.shape[1])
    dense = lay.to_dense().to(q.device)  # (Hl, seqlen_q, seqlen_k)
    return standard_attention(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale,
                              causal=bool(causal) or lay.causal, mask=dense.unsqueeze(0),
                              dropout_mask=dropout_mask)
