"""FlashAttention in Triton: fused, exact, IO-aware attention (Dao et al., 2022) with the
FlashAttention-2 work partitioning (Dao, 2023).

Algorithm
- Forward: one program per (query block, batch x head). Q stays in registers; K/V tiles stream
  through SRAM; an online softmax in base 2 (log2(e) folded into the scale) keeps the running max
  m_i, the normaliser l_i and the unnormalised output acc. Only O and the log-sum-exp are written:
  the N x N score matrix never reaches HBM.
- Backward: delta = rowsum(dO * O) (a small kernel), then two kernels that recompute the scores
  blockwise: dK/dV (one program per key block; loops over the query blocks and, for grouped-query
  attention, over the query heads of the group) and dQ (one program per query block; loops over key
  blocks). No atomics, so reruns are bit-identical. With dropout at head dims up to 32 on Hopper a fused form
  (`_fused_bwd`) adds dQ from the dK/dV kernel through the TMA reduce instead, drawing a dropout mask once; its
  dQ summation order varies, as the Gluon backward's does (below), so deterministic mode
  (torch.use_deterministic_algorithms) keeps the two kernels.
- Causal masking is bottom-right aligned (query i sees key j <= i + seqlen_k - seqlen_q). Tiles that
  are fully masked are skipped; only the tiles on the diagonal and at the sequence end pay for masking
  (two loop stages per kernel). A query row that sees no key gets O = 0, LSE = -inf, zero gradient.
- Dropout is fused: a counter-based Philox4x32-7 stream keyed on a seed drawn from torch's generator on
  the inputs' device; one Philox call's four 32-bit outputs give eight 16-bit values (p quantised to
  1/65536) for a 2 x 4 set of scores: queries r, r + 8 and keys c, c + 1, c + 8, c + 9 (r % 16 < 8,
  c % 16 < 8, c even), the set one thread holds in the tensor-core accumulator layout, so the mask is
  drawn where the scores already are (see `dropout_keep`). Backward
  regenerates the same mask; no mask is stored. `dropout_keep_mask` returns the kernel's mask for tests.
- Varlen (packed sequences, cu_seqlens) runs through the same kernels with the VARLEN constexpr.
- Warp specialisation (Hopper): with the WARP_SPEC constexpr the forward runs one key loop over TMA
  descriptors of q, k, v, `tl.range(..., warp_specialize=True)` (producer warps load, consumer warps compute;
  Triton >= 3.6), masking every tile element-wise, since Triton 3.6's Hopper specialiser takes no second loop
  (see `_fwd_ws`). The launcher chooses it (`_fwd_kind`) on sm_90 at head dim 128 without dropout, for
  16-byte aligned inputs whose heads and batches lie side by side; elsewhere, and always under the
  interpreter, the forward is the two-stage loop. The backward does not use it.
- Gluon (Hopper, `kernels/flash_gluon.py`), on sm_90 with Triton 3.6, fp16/bf16, seqlen_q == seqlen_k a multiple
  of 128, no varlen, dropout only at head dim 64 (the forward non-causal from 1K and causal from 4K, the backward
  from 1K; the mask is this module's, kernels/gluon_dropout.py). Forward at head dims 128 and 64 (from 1K
  tokens) and 256 (from 512):
  FlashAttention-3's ping-pong of two consumer warpgroups and a loader warp (1.07-1.29x / 1.2-1.9x /
  1.03-1.12x the forward here); same outputs and LSE. Backward at head dim 128 without GQA (from 1K), outside
  deterministic mode: one kernel with a loader warp and a dQ warp beside 8 compute warps, dQ added by TMA reduces (1.14-1.39x the
  two kernels here, before its descriptors moved to the host: 1.0-1.2x more). `_gluon_unsupported` /
  `_gluon_bwd_unsupported` say why not elsewhere; FLASH_GLUON=0 turns both off.

Supports float16 and bfloat16 (float32 too, through tf32 dots on the GPU, exact under the
interpreter), head dims that are multiples of 8 up to 256 (padded to a power of two with masked
loads), any sequence lengths, GQA/MQA, strided inputs (last dim must be contiguous; otherwise copied).

Launch configs: autotuned on the GPU over a small list per kernel, keyed on (power-of-two seqlen bucket,
head dim, causal, varlen, dropout), each result persisted in Triton's cache directory for later processes
(first call in a new process, BERT's varlen shape, H100: 44.9 s with an empty cache, 0.7 s with a warm one;
results/attention/host_overhead.md); FLASH_AUTOTUNE=0 uses one fixed
config (GPU tests; at head dim 128 on sm_90 the warp-specialised one for non-causal attention); under
TRITON_INTERPRET=1 one 16x16 config. Causal grids run the heaviest query blocks first. Every launch goes through
kernels/launch.py, which calls a compiled specialisation's launcher directly after its first launch.

Known limits: head dim 256 runs (tested with the fixed config) but is not tuned; varlen input checks
read cu_seqlens on the host (one device sync per call); no attention bias / alibi / sliding window; the
backward recomputes QK^T and dO V^T in both backward kernels (7 matmuls instead of 5) as the price
of having no atomics; FlashAttention-2's one-kernel backward (dQ added atomically, 5 matmuls) measured
11-123% slower than these two kernels at head dim 64 on an H100 (results/attention/atomic_ab/).

Layout of this module (the parts marked SHARED are the building blocks kernels/blocksparse.py is meant to reuse):
@triton.jit building blocks -> @triton.jit kernels -> host launchers with input checks ->
operators `flashattn::fwd` / `flashattn::bwd` (kernels/ops.py; fake implementations) and the autograd Function
that launches the kernels in eager mode and calls the operators under torch.compile(fullgraph=True) -> public
`flash_attn_func` / `flash_attn_varlen_func`.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from kernels import ops
from kernels.launch import Prepared, _env_is, _interpreting, launch
from kernels.sparsity import cdiv

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ---------------------------------------------------------------------------------------------------
# Shared @triton.jit building blocks
# ---------------------------------------------------------------------------------------------------


# Philox rounds of the dropout stream: 7, as FlashAttention-2 draws its masks (csrc/flash_attn/src/philox.cuh: six
# rounds and a final one). Salmon et al. (SC'11, "Parallel Random Numbers: As Easy as 1, 2, 3") find Philox4x32
# Crush-resistant from 7 rounds and default to 10 as a safety margin; 7 instead of 10 took 17% off what
# dropout adds to our forward+backward at the GPT-2 shape and 18% at Path-X's (results/attention/dropout_variants/).
PHILOX_ROUNDS = tl.constexpr(7)


@triton.jit
def dropout_keep(seed, bh, rows, cols, drop_thresh):
    """Dropout keep-mask for query indices `rows` and key indices `cols` of head `bh` (any shapes).

    SHARED with kernels/blocksparse.py: keep the signature stable.
    seed: int64 scalar (the value loaded from the seed tensor); bh: batch * nheads + query head;
    rows, cols: int32 index tensors that broadcast against each other (rows[:, None], cols[None, :]
    gives an (M, N) mask; rows[None, :], cols[:, None] its transpose); drop_thresh: int in [0, 2^16),
    round(dropout_p * 2^16). The stream: (x0, x1, x2, x3) = Philox4x32-7(key = seed; counter =
    (4 (col // 16) + (col % 8) // 2, 8 (row // 16) + row % 8, bh, 0)); element (row, col) takes the
    16-bit half col % 2 (0: low bits, 1: high bits) of x_(2 ((row // 8) % 2) + (col // 8) % 2) and is
    kept iff that value is >= drop_thresh, so P(keep) = 1 - p with p quantised to 1/65536. One call
    covers queries r, r + 8 x keys c, c + 1, c + 8, c + 9: in the tensor cores' accumulator layout
    (m16n8 fragments: each thread holds rows t / 4 and t / 4 + 8, columns 2 (t % 4) and + 1 of every
    8-column group) those eight scores sit in one thread's registers, so `dropout_keep_tile` draws the
    mask without moving it between threads (an earlier stream, eight consecutive keys per call, spent
    about a third of dropout's instructions on that move: results/attention/kernel_resources/).
    Positions are absolute within a sequence, so any tiling, the varlen path and the block-sparse kernel
    draw the same mask. This element-wise form is the reference (dropout_keep_mask).
    """
    c0 = ((cols >> 4) << 2) + ((cols >> 1) & 3) + rows * 0
    c1 = ((rows >> 4) << 3) + (rows & 7) + cols * 0
    c2 = c0 * 0 + bh
    x0, x1, x2, x3 = tl.philox(seed, c0, c1, c2, c0 * 0, PHILOX_ROUNDS)
    lane = ((rows >> 3) & 1) * 2 + ((cols >> 3) & 1)
    r = tl.where(lane == 0, x0, tl.where(lane == 1, x1, tl.where(lane == 2, x2, x3)))
    r16 = tl.where((cols & 1) == 0, r & 0xFFFF, r >> 16).to(tl.int32)
    return r16 >= drop_thresh


@triton.jit
def dropout_keep_tile(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    """The (len(rows), BLOCK_N) tile of the `dropout_keep` mask for keys start_col .. start_col + BLOCK_N.

    SHARED with kernels/blocksparse.py (through the block steps). rows: consecutive absolute query indices
    starting at a multiple of 16, len(rows) a multiple of 16; start_col a multiple of 16 and BLOCK_N a
    multiple of 16 (every tile is: tiles are >= 16 wide and aligned). One Philox call per (query pair
    r, r + 8; key group c, c + 1, c + 8, c + 9); the joins, reshape and permute below only rename which
    register holds which score, so the result is in the scores' own layout, equal to
    dropout_keep(seed, bh, rows[:, None], cols[None, :]).
    """
    BLOCK_M: tl.constexpr = rows.shape[0]
    tl.static_assert(BLOCK_M % 16 == 0 and BLOCK_N % 16 == 0, "dropout tiles are multiples of 16")
    pair = tl.min(rows, 0) // 2 + tl.arange(0, BLOCK_M // 2)  # 8 (row // 16) + row % 8 of the tile's rows
    group = start_col // 4 + tl.arange(0, BLOCK_N // 4)       # 4 (col // 16) + (col % 8) // 2
    c0 = group[None, :] + pair[:, None] * 0
    c1 = pair[:, None] + group[None, :] * 0
    x0, x1, x2, x3 = tl.philox(seed, c0, c1, c0 * 0 + bh, c0 * 0, PHILOX_ROUNDS)
    # Lane x_(2 rb + j), half b: join to (pair, group, b, rb, j), split pair = (row block a, i) and group =
    # (col block h, q), then order as row = 16 a + 8 rb + i, col = 16 h + 8 j + 2 q + b.
    k = tl.join(tl.join(_keep_halves(x0, drop_thresh), _keep_halves(x2, drop_thresh)),
                tl.join(_keep_halves(x1, drop_thresh), _keep_halves(x3, drop_thresh)))
    k = tl.reshape(k, (BLOCK_M // 16, 8, BLOCK_N // 16, 4, 2, 2, 2))  # (a, i, h, q, b, rb, j)
    k = tl.permute(k, (0, 5, 1, 2, 6, 3, 4))                          # (a, rb, i, h, j, q, b)
    return tl.reshape(k, (BLOCK_M, BLOCK_N)) != 0


@triton.jit
def _keep_halves(x, drop_thresh):
    """int8 keep flags of a Philox output's low and high 16-bit halves, joined on a new last axis."""
    lo = ((x & 0xFFFF).to(tl.int32) >= drop_thresh).to(tl.int8)
    hi = ((x >> 16).to(tl.int32) >= drop_thresh).to(tl.int8)
    return tl.join(lo, hi)


@triton.jit
def load_tile(ptr_base, stride_row, rows, offs_d, row_limit, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASK_ROWS: tl.constexpr):
    """Load a (len(rows), BLOCK_D) tile; rows >= row_limit and columns >= HEAD_DIM read as 0.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    """
    ptrs = ptr_base + rows[:, None].to(tl.int64) * stride_row + offs_d[None, :]
    if MASK_ROWS:
        if HEAD_DIM == BLOCK_D:
            t = tl.load(ptrs, mask=rows[:, None] < row_limit, other=0.0)
        else:
            t = tl.load(ptrs, mask=(rows[:, None] < row_limit) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            t = tl.load(ptrs)
        else:
            t = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return t


@triton.jit
def softmax_update(acc, m_i, l_i, qk, qk_scale, ROWS_MAY_BE_EMPTY: tl.constexpr):
    """One online-softmax step on a tile of raw scores qk (-inf where masked), in base-2 units.

    Returns (p, acc, l_i, m_new): the tile's unnormalised probabilities exp2(qk * qk_scale - m_new), and the
    running acc and l_i rescaled to the new row max m_new (p @ V is the caller's to add). ROWS_MAY_BE_EMPTY:
    a row may have seen no visible key yet (masked tiles); it subtracts 0 instead of -inf, so exp2 gives 0,
    not NaN, and m_new stays -inf.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if ROWS_MAY_BE_EMPTY:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    return p, acc * alpha[:, None], l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def fwd_block_step(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n, offs_m, offs_n, offs_d,
                   seqlen_k, diag_offset, qk_scale, seed, bh, drop_thresh,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                   MASK_SEQ: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    """One online-softmax step of the forward pass over the key/value tile starting at `start_n`.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    acc (BLOCK_M, BLOCK_D) fp32, m_i / l_i (BLOCK_M,) fp32 in base-2 units: running state.
    q: the loaded query tile (BLOCK_M, BLOCK_D); k_base / v_base: pointers to this (batch, kv head)'s
    row 0; offs_m: absolute query indices of the tile; offs_n: tl.arange(0, BLOCK_N); offs_d:
    tl.arange(0, BLOCK_D). qk_scale = softmax_scale * log2(e). diag_offset = seqlen_k - seqlen_q.
    MASK_CAUSAL applies the bottom-right causal mask, MASK_SEQ masks keys >= seqlen_k; leave both off
    for tiles that are fully visible (the fast path). With HAS_DROPOUT, dropped probabilities are left
    out of acc but kept in l_i; the caller multiplies the final output by 1 / (1 - p).
    A row whose keys are all masked so far keeps m_i = -inf and contributes nothing (no NaN).
    Returns the new (acc, m_i, l_i).
    """
    cols = start_n + offs_n
    k = load_tile(k_base, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, MASK_SEQ)
    qk = tl.dot(q, tl.trans(k))
    if MASK_CAUSAL or MASK_SEQ:
        if MASK_CAUSAL and MASK_SEQ:
            allowed = (cols[None, :] <= offs_m[:, None] + diag_offset) & (cols[None, :] < seqlen_k)
        elif MASK_CAUSAL:
            allowed = cols[None, :] <= offs_m[:, None] + diag_offset
        else:
            allowed = (cols[None, :] < seqlen_k) & (offs_m[:, None] >= 0)
        qk = tl.where(allowed, qk, float("-inf"))
    p, acc, l_i, m_new = softmax_update(acc, m_i, l_i, qk, qk_scale, MASK_CAUSAL or MASK_SEQ)
    v = load_tile(v_base, stride_vn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, MASK_SEQ)
    if HAS_DROPOUT:
        keep = dropout_keep_tile(seed, bh, offs_m, start_n, drop_thresh, offs_n.shape[0])
        p = tl.where(keep, p, 0.0)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def fwd_finalize(acc, m_i, l_i, drop_scale, HAS_DROPOUT: tl.constexpr):
    """Normalise the forward accumulator and form the base-2 log-sum-exp after the last block step.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    Rows that saw no key (l_i == 0) get output 0 and LSE -inf. With HAS_DROPOUT the kept
    probabilities are rescaled by drop_scale = 1 / (1 - p). Returns (out fp32, lse).
    """
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if HAS_DROPOUT:
        acc = acc * (drop_scale / l_safe)[:, None]
    else:
        acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(l_safe))
    return acc, lse


@triton.jit
def bwd_dkdv_block_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, start_m,
                        offs_m, cols, offs_d, seqlen_q, diag_offset, qk_scale, seed, bh, drop_thresh, drop_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                        HAS_DROPOUT: tl.constexpr, MASK_ROWS: tl.constexpr = True):
    """Accumulate one query tile's contribution to dK and dV of a fixed key tile.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    dk, dv (BLOCK_N, BLOCK_D) fp32 accumulators (dk without the softmax scale: multiply at the end);
    k, v: the loaded key/value tile; cols: absolute key indices of the tile (BLOCK_N,);
    q_base / do_base: pointers to row 0 of this (batch, query head); lse_base / delta_base: pointers
    to this head's LSE (base-2 units, as the forward stores it) and delta rows; offs_m:
    tl.arange(0, BLOCK_M); with MASK_ROWS, rows >= seqlen_q are masked on load (they contribute
    zero); pass MASK_ROWS=False for tiles wholly inside the sequence: the unmasked loads made the
    block-sparse dK/dV kernel 4-9% faster on an H100 (results/archive/blocksparse/bwd_variants.log), while
    the dense kernel showed no difference (results/archive/attention/even_rows_ab/), so it masks always. Keys
    >= seqlen_k need no mask: their dK/dV rows are not stored. MASK_CAUSAL applies the bottom-right
    causal mask. Returns the new (dk, dv).
    """
    dk, dv, _ = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, start_m, offs_m,
                           cols, offs_d, seqlen_q, diag_offset, qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM,
                           BLOCK_D, MASK_CAUSAL, HAS_DROPOUT, MASK_ROWS)
    return dk, dv


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, start_m, offs_m, cols,
               offs_d, seqlen_q, diag_offset, qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASK_ROWS: tl.constexpr):
    """`bwd_dkdv_block_step`'s work; also returns dS (BLOCK_M, BLOCK_N) in the inputs' dtype, for the fused
    backward's dQ. Rows past seqlen_q and causally masked scores give exact zeros in it.

    The orientation follows the tile's shape (sm_90 compiles, results/attention/dkdv_natural/probe.txt and
    probe_hd.txt). With at least as many queries as keys, the tile is S = Q K^T (queries as rows): it spills less
    and takes fewer instructions there, and the dropout mask is used in the layout it is drawn in. With fewer
    queries than keys, S^T = K Q^T does better, and its mask moves through shared memory as int8. Above head dim
    128, both forms spill, and S^T is kept. On the H100 at GPT-2's attention shape, the first form's (64, 64) tile
    takes 0.78x the second's best time with dropout (results/attention/dkdv_natural/README.md)."""
    rows = start_m + offs_m
    q = load_tile(q_base, stride_qm, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, MASK_ROWS)
    do = load_tile(do_base, stride_dom, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, MASK_ROWS)
    if MASK_ROWS:
        lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
        delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
    else:
        lse = tl.load(lse_base + rows)
        delta = tl.load(delta_base + rows)
    # Rows that saw no key have LSE = -inf; +inf makes their probabilities exp2(-inf) = 0.
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    if (offs_m.shape[0] >= cols.shape[0]) and (BLOCK_D <= 128):
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if MASK_CAUSAL:
            p = tl.where(cols[None, :] <= rows[:, None] + diag_offset, p, 0.0)
        dp = tl.dot(do, tl.trans(v)).to(tl.float32)
        if HAS_DROPOUT:
            keep = dropout_keep_tile(seed, bh, rows, tl.min(cols, 0), drop_thresh, cols.shape[0])
            dv = tl.dot(tl.trans(tl.where(keep, p * drop_scale, 0.0).to(do.dtype)), do, dv)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        else:
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
        ds = (p * (dp - delta[:, None])).to(q.dtype)
        dk = tl.dot(tl.trans(ds), q, dk)
    else:
        pT = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        if MASK_CAUSAL:
            pT = tl.where(cols[:, None] <= rows[None, :] + diag_offset, pT, 0.0)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        if HAS_DROPOUT:
            # Draw in the (query, key) orientation, then transpose (as int8: a layout shuffle through shared
            # memory, cheaper than drawing in this orientation, where one call's eight scores span threads).
            keep = dropout_keep_tile(seed, bh, rows, tl.min(cols, 0), drop_thresh, cols.shape[0])
            keepT = tl.trans(keep.to(tl.int8)) != 0
            dv = tl.dot(tl.where(keepT, pT * drop_scale, 0.0).to(do.dtype), do, dv)
            dpT = tl.where(keepT, dpT * drop_scale, 0.0)
        else:
            dv = tl.dot(pT.to(do.dtype), do, dv)
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
        ds = tl.trans(dsT)
    return dk, dv, ds


@triton.jit
def _add_dq(DQA, dq_desc, ds, k, row0, start_m, h, offs_m, offs_d, seqlen_q, nheads, HEAD_DIM: tl.constexpr,
            DQ_TMA: tl.constexpr):
    """The fused backward's dQ: dS K of one (query tile, key tile) pair added to the float32 buffer DQA, laid out
    (rows, nheads * HEAD_DIM), rows = this sequence's from row0. With DQ_TMA one bulk reduce (sm_90); else element-
    wise atomics (the interpreter, which has no descriptor reduce). The TMA tile may reach into the next sequence's
    rows or the next head's columns (padded head dims): what it adds there is exactly zero."""
    dq = tl.dot(ds, k)
    if DQ_TMA:
        dq_desc.atomic_add([row0 + start_m, h * HEAD_DIM], dq)
    else:
        rows = start_m + offs_m
        ptrs = DQA + (row0 + rows[:, None]).to(tl.int64) * (nheads * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
        tl.atomic_add(ptrs, dq, mask=(rows[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def bwd_dq_block_step(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, rows, offs_n, offs_d,
                      seqlen_k, diag_offset, qk_scale, seed, bh, drop_thresh, drop_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                      MASK_SEQ: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    """Accumulate one key tile's contribution to dQ of a fixed query tile.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    dq (BLOCK_M, BLOCK_D) fp32 (without the softmax scale: multiply at the end); q, do: loaded tiles;
    lse: (BLOCK_M,) base-2 LSE with -inf already replaced by +inf (see `load_row_stats`); delta:
    (BLOCK_M,); rows: absolute query indices; offs_n: tl.arange(0, BLOCK_N). MASK_SEQ masks keys
    >= seqlen_k (needed here: dQ sums over keys). Returns the new dq.
    """
    cols = start_n + offs_n
    k = load_tile(k_base, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, MASK_SEQ)
    v = load_tile(v_base, stride_vn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, MASK_SEQ)
    qk = tl.dot(q, tl.trans(k))
    p = tl.math.exp2(qk * qk_scale - lse[:, None])
    if MASK_CAUSAL or MASK_SEQ:
        if MASK_CAUSAL and MASK_SEQ:
            allowed = (cols[None, :] <= rows[:, None] + diag_offset) & (cols[None, :] < seqlen_k)
        elif MASK_CAUSAL:
            allowed = cols[None, :] <= rows[:, None] + diag_offset
        else:
            allowed = (cols[None, :] < seqlen_k) & (rows[:, None] >= 0)
        p = tl.where(allowed, p, 0.0)
    dp = tl.dot(do, tl.trans(v)).to(tl.float32)
    if HAS_DROPOUT:
        keep = dropout_keep_tile(seed, bh, rows, start_n, drop_thresh, offs_n.shape[0])
        dp = tl.where(keep, dp * drop_scale, 0.0)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def load_row_stats(lse_base, delta_base, rows, seqlen_q):
    """Load (lse, delta) for query rows, ready for `bwd_dq_block_step` (-inf LSE -> +inf).

    SHARED with kernels/blocksparse.py: keep the signature stable.
    """
    lse = load_lse(lse_base, rows, seqlen_q)
    delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
    return lse, delta


@triton.jit
def load_lse(lse_base, rows, seqlen_q):
    """The LSE of query rows as `bwd_dq_block_step` takes it: -inf (a row that sees no key) and rows past the end
    -> +inf, so that their probabilities come out 0."""
    lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse)


@triton.jit
def seq_bounds(cu_seqlens_q, cu_seqlens_k, b, seqlen_q, seqlen_k, VARLEN: tl.constexpr):
    """(q_start, seqlen_q, k_start, seqlen_k) of sequence b; without VARLEN starts are 0.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    """
    if VARLEN:
        q_start = tl.load(cu_seqlens_q + b)
        seqlen_q = tl.load(cu_seqlens_q + b + 1) - q_start
        k_start = tl.load(cu_seqlens_k + b)
        seqlen_k = tl.load(cu_seqlens_k + b + 1) - k_start
    else:
        q_start = tl.program_id(0) * 0  # a tensor, so callers can .to(tl.int64) it
        k_start = q_start
    return q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def _query_program(cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, BLOCK_M: tl.constexpr,
                   VARLEN: tl.constexpr, REVERSE: tl.constexpr):
    """This program's query tile (start_m), batch x head (bh, b, h) and its sequence's bounds. REVERSE
    (causal): the heaviest query tiles (the last ones) launch first, so the tail is short."""
    start_m = ((tl.num_programs(0) - 1 - tl.program_id(0)) if REVERSE else tl.program_id(0)) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    q_start, seqlen_q, k_start, seqlen_k = seq_bounds(cu_seqlens_q, cu_seqlens_k, b, seqlen_q, seqlen_k, VARLEN)
    return start_m, bh, b, h, q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def _key_stages(start_m, seqlen_k, diag, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key range of a query tile in two loop stages: [0, mid) visible to every row (no mask), [mid, hi)
    straddling the causal diagonal or the sequence end (masked)."""
    if IS_CAUSAL:
        hi = tl.minimum(seqlen_k, start_m + BLOCK_M + diag)
        mid = tl.minimum(tl.maximum(start_m + diag + 1, 0) // BLOCK_N, seqlen_k // BLOCK_N) * BLOCK_N
    else:
        hi = seqlen_k
        mid = (seqlen_k // BLOCK_N) * BLOCK_N
    return mid, hi


@triton.jit
def _fwd_ws(Q, K, V, cu_seqlens_q, cu_seqlens_k, b, h, group, nheads, q_start, seqlen_q, k_start, seqlen_k, start_m,
            stride_qm, stride_kn, stride_vn, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr):
    """(acc, m_i, l_i) of one query tile over all its key tiles, as one warp-specialised loop (Hopper).

    Q, K and V are read through TMA descriptors made on the device over the 2-D views the launcher checked
    (`_ws_unsupported`): rows (batch, token) or packed tokens, columns head x head dim, so the compiler can
    give the loads to a producer warp group while the consumer warps run the dots and the softmax
    (Triton 3.6, `tl.range(..., warp_specialize=True)`; results/attention/ws_fwd_ab/). Rows past the end of
    the tensor read as 0; rows of the next sequence are masked like keys past seqlen_k.

    Why one loop with masks on every tile, not fwd_block_step's split into unmasked and masked stages:
    compiled for sm_90, Triton 3.6's Hopper warp specialiser fails (compiler assertions) when the kernel has
    a second key loop before or after the specialised one, an early exit, or a Q tile loaded through
    pointers, and quietly does not specialise when the loop body holds an `if` or a dot sits outside the
    loop. Non-causal: keys >= seqlen_k get a -inf bias (every tile keeps a visible key, so no row's max stays
    -inf). Causal: the element-wise diagonal mask on every tile; it also hides keys >= seqlen_k from every
    row that is stored, and rows that see no key keep m_i = -inf (handled as in fwd_block_step).
    """
    nbatch = tl.num_programs(1) // nheads
    if VARLEN:
        q_row = q_start + start_m
        k_row = k_start
        rows_q = tl.load(cu_seqlens_q + nbatch)
        rows_k = tl.load(cu_seqlens_k + nbatch)
    else:
        q_row = b * seqlen_q + start_m
        k_row = b * seqlen_k
        rows_q = nbatch * seqlen_q
        rows_k = nbatch * seqlen_k
    k_col = (h // group) * HEAD_DIM
    width_k = (nheads // group) * HEAD_DIM
    q_desc = tl.make_tensor_descriptor(Q, shape=[rows_q, nheads * HEAD_DIM], strides=[stride_qm, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, shape=[rows_k, width_k], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V, shape=[rows_k, width_k], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    q = q_desc.load([q_row, h * HEAD_DIM])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    if IS_CAUSAL:
        hi = tl.minimum(seqlen_k, start_m + BLOCK_M + diag)
    else:
        hi = seqlen_k
    hi = tl.where(start_m < seqlen_q, hi, 0)  # (varlen) a query tile past its sequence: no keys, nothing stored
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        k = k_desc.load([k_row + start_n, k_col])
        qk = tl.dot(q, tl.trans(k))
        cols = start_n + offs_n
        if IS_CAUSAL:
            qk = tl.where(cols[None, :] <= offs_m[:, None] + diag, qk, float("-inf"))
        else:
            qk = qk + tl.where(cols < seqlen_k, 0.0, float("-inf"))[None, :]
        p, acc, l_i, m_new = softmax_update(acc, m_i, l_i, qk, qk_scale, IS_CAUSAL)
        v = v_desc.load([k_row + start_n, k_col])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, m_i, l_i


# ---------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------

# Triton compiles one variant per divisibility-by-16 class of each integer argument. For packed
# (varlen) batches the LSE and delta strides are the batch's token count, which changes every batch,
# so specialising on them compiled a second variant of every kernel in the middle of training (seconds
# each). The dK/dV loops, which load LSE / delta rows every iteration, get the hint back as a constexpr where
# the LSE is dense (`aligned_lse_strides`). The varlen maxima are rounded up to a multiple of 16 by the
# launchers instead (see `_varlen_max`).
_PER_BATCH_INTS = ["stride_lb", "stride_lh"]


@triton.jit
def aligned_lse_strides(stride_lb, stride_lh, LSE_ALIGNED: tl.constexpr):
    """The LSE / delta strides, with their alignment restored as a compile-time fact where the host found them
    multiples of 16 (`lse_aligned`). Not specialising them (above) cost the dK/dV loops, which load LSE and delta
    rows every iteration, their 8-byte copies: 4-byte ones instead, twice as many (sm_90 compile as launched,
    block-sparse head dim 128: 24 -> 40 copies a loop iteration, forward+backward ~5% slower than before)."""
    if LSE_ALIGNED:
        stride_lb = (stride_lb // 16) * 16
        stride_lh = (stride_lh // 16) * 16
    return stride_lb, stride_lh


@triton.jit(do_not_specialize=_PER_BATCH_INTS)
def _fwd_kernel(Q, K, V, O, LSE, SEED, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, group,
                qk_scale, drop_thresh, drop_scale,
                stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                TUNE_Q, TUNE_K,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                REVERSE: tl.constexpr = False, WARP_SPEC: tl.constexpr = False):
    start_m, bh, b, h, q_start, seqlen_q, k_start, seqlen_k = _query_program(
        cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, BLOCK_M, VARLEN, REVERSE)
    # `is True` is decided when the kernel is traced, also where a compile-only tool makes WARP_SPEC a runtime
    # argument (scripts/kernel_resources.py types the parameters it is not given as i32): that compile then
    # builds the two-stage loop, as before, instead of both loops behind a runtime branch.
    if WARP_SPEC is not True:  # no early exit before a warp-specialised loop (see _fwd_ws)
        if start_m >= seqlen_q:
            return
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h * stride_qh + q_start.to(tl.int64) * stride_qm
    k_base = K + b64 * stride_kb + (h // group) * stride_kh + k_start.to(tl.int64) * stride_kn
    v_base = V + b64 * stride_vb + (h // group) * stride_vh + k_start.to(tl.int64) * stride_vn
    o_base = O + b64 * stride_ob + h * stride_oh + q_start.to(tl.int64) * stride_om
    lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    if WARP_SPEC is True:
        tl.static_assert(HEAD_DIM == BLOCK_D and not HAS_DROPOUT, "WARP_SPEC needs HEAD_DIM == BLOCK_D and no dropout")
        acc, m_i, l_i = _fwd_ws(Q, K, V, cu_seqlens_q, cu_seqlens_k, b, h, group, nheads, q_start, seqlen_q, k_start,
                                seqlen_k, start_m, stride_qm, stride_kn, stride_vn, qk_scale, HEAD_DIM, BLOCK_M,
                                BLOCK_N, IS_CAUSAL, VARLEN)
    else:
        q = load_tile(q_base, stride_qm, offs_m, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

        diag = seqlen_k - seqlen_q
        mid, hi = _key_stages(start_m, seqlen_k, diag, IS_CAUSAL, BLOCK_M, BLOCK_N)
        for start_n in range(0, mid, BLOCK_N):
            acc, m_i, l_i = fwd_block_step(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n, offs_m,
                                           offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh,
                                           HEAD_DIM, BLOCK_D, False, False, HAS_DROPOUT)
        for start_n in range(mid, hi, BLOCK_N):
            acc, m_i, l_i = fwd_block_step(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_n, offs_m,
                                           offs_n, offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh,
                                           HEAD_DIM, BLOCK_D, IS_CAUSAL, True, HAS_DROPOUT)
    acc, lse = fwd_finalize(acc, m_i, l_i, drop_scale, HAS_DROPOUT)
    row_ok = offs_m < seqlen_q
    tl.store(lse_base + offs_m, lse, mask=row_ok)
    o_ptrs = o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit(do_not_specialize=["stride_db", "stride_dh"])
def _bwd_preprocess_kernel(O, DO, DELTA, ZERO, cu_seqlens_q, seqlen_q, nheads,
                           stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh,
                           stride_db, stride_dh, stride_zb, stride_zm, stride_zh,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                           VARLEN: tl.constexpr, ZERO_FILL: tl.constexpr = False):
    # ZERO_FILL: also zero ZERO's rows of these queries (float32, q's layout): the Gluon backward's dQ buffer, which
    # it adds into, filled here instead of by a separate memset launch
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    q_start, seqlen_q, _, _ = seq_bounds(cu_seqlens_q, cu_seqlens_q, b, seqlen_q, seqlen_q, VARLEN)
    if start_m >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_tile(O + b64 * stride_ob + h * stride_oh + q_start.to(tl.int64) * stride_om, stride_om, rows, offs_d,
                  seqlen_q, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + b64 * stride_dob + h * stride_doh + q_start.to(tl.int64) * stride_dom, stride_dom, rows,
                   offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + b64 * stride_db + h * stride_dh + q_start + rows, delta, mask=rows < seqlen_q)
    if ZERO_FILL:
        z_ptrs = (ZERO + b64 * stride_zb + h * stride_zh + (q_start + rows)[:, None].to(tl.int64) * stride_zm
                  + offs_d[None, :])
        tl.store(z_ptrs, tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
                 mask=(rows[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit(do_not_specialize=_PER_BATCH_INTS)
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV, DQA, LSE, DELTA, SEED, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k,
                     nheads, group, sm_scale, qk_scale, drop_thresh, drop_scale,
                     stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                     stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                     stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, stride_lb, stride_lh,
                     dqa_rows, TUNE_Q, TUNE_K,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                     FUSED_DQ: tl.constexpr = False, DQ_TMA: tl.constexpr = False, GQA: tl.constexpr = True,
                     LSE_ALIGNED: tl.constexpr = False):
    # FUSED_DQ: also add each tile pair's dQ to DQA (float32, (dqa_rows, nheads * HEAD_DIM)), so no dQ kernel runs
    # and the dropout mask is drawn once (see `_fused_bwd`); without it DQA and dqa_rows are unused.
    # GQA: several query heads share this key/value head (group > 1), so loop over them. Without it the loop has a
    # constant single trip: the runtime-bounded outer loop alone cost up to ~440 bytes of spills per thread
    # (head dim 128, (64, 128, 8, 3), causal: 448 -> 8; GPT-2's shape with dropout, (32, 64, 4, 4): 40 -> 0;
    # sm_90 compile, results/attention/kernel_resources/sm90_gqa_loop.md).
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    nheads_k = nheads // group
    b = bhk // nheads_k
    hk = bhk % nheads_k
    q_start, seqlen_q, k_start, seqlen_k = seq_bounds(cu_seqlens_q, cu_seqlens_k, b, seqlen_q, seqlen_k, VARLEN)
    if start_n >= seqlen_k:
        return
    stride_lb, stride_lh = aligned_lse_strides(stride_lb, stride_lh, LSE_ALIGNED)
    b64 = b.to(tl.int64)
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + b64 * stride_kb + hk * stride_kh + k_start.to(tl.int64) * stride_kn, stride_kn, cols, offs_d,
                  seqlen_k, HEAD_DIM, BLOCK_D, True)
    v = load_tile(V + b64 * stride_vb + hk * stride_vh + k_start.to(tl.int64) * stride_vn, stride_vn, cols, offs_d,
                  seqlen_k, HEAD_DIM, BLOCK_D, True)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    if IS_CAUSAL:
        # Query tiles before `lo` see none of these keys; [lo, mid) straddle the diagonal.
        lo = (tl.maximum(start_n - diag, 0) // BLOCK_M) * BLOCK_M
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.maximum(mid, lo), tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M)
    else:
        lo = 0
        mid = 0
    dq_desc = 0
    if DQ_TMA:
        dq_desc = tl.make_tensor_descriptor(DQA, shape=[dqa_rows, nheads * HEAD_DIM], strides=[nheads * HEAD_DIM, 1],
                                            block_shape=[BLOCK_M, BLOCK_D])
    row0 = q_start if VARLEN else b * seqlen_q  # this sequence's first row in DQA
    for g in range(0, group if GQA else 1):
        h = hk * group + g
        bh = b * nheads + h
        q_base = Q + b64 * stride_qb + h * stride_qh + q_start.to(tl.int64) * stride_qm
        do_base = DO + b64 * stride_dob + h * stride_doh + q_start.to(tl.int64) * stride_dom
        lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start
        delta_base = DELTA + b64 * stride_lb + h * stride_lh + q_start
        for start_m in range(lo, mid, BLOCK_M):
            dk, dv, ds = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                     start_m, offs_m, cols, offs_d, seqlen_q, diag, qk_scale, seed, bh, drop_thresh,
                                     drop_scale, HEAD_DIM, BLOCK_D, True, HAS_DROPOUT, True)
            if FUSED_DQ:
                _add_dq(DQA, dq_desc, ds, k, row0, start_m, h, offs_m, offs_d, seqlen_q, nheads, HEAD_DIM, DQ_TMA)
        for start_m in range(mid, seqlen_q, BLOCK_M):
            dk, dv, ds = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                     start_m, offs_m, cols, offs_d, seqlen_q, diag, qk_scale, seed, bh, drop_thresh,
                                     drop_scale, HEAD_DIM, BLOCK_D, False, HAS_DROPOUT, True)
            if FUSED_DQ:
                _add_dq(DQA, dq_desc, ds, k, row0, start_m, h, offs_m, offs_d, seqlen_q, nheads, HEAD_DIM, DQ_TMA)
    dk = dk * sm_scale
    row_ok = cols[:, None] < seqlen_k
    if HEAD_DIM != BLOCK_D:
        row_ok = row_ok & (offs_d[None, :] < HEAD_DIM)
    dk_ptrs = DK + b64 * stride_dkb + hk * stride_dkh + (k_start + cols[:, None]).to(tl.int64) * stride_dkn + offs_d[None, :]
    dv_ptrs = DV + b64 * stride_dvb + hk * stride_dvh + (k_start + cols[:, None]).to(tl.int64) * stride_dvn + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=row_ok)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=row_ok)


@triton.jit(do_not_specialize=_PER_BATCH_INTS)
def _bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, SEED, O, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k,
                   nheads, group, sm_scale, qk_scale, drop_thresh, drop_scale,
                   stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
                   stride_dqb, stride_dqm, stride_dqh, stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                   TUNE_Q, TUNE_K,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   REVERSE: tl.constexpr = False, COMPUTE_DELTA: tl.constexpr = False):
    # COMPUTE_DELTA: this kernel computes delta = rowsum(dO * O) of its own query rows and stores it for the dK/dV
    # kernel, which then runs after it: the backward needs no `bwd_preprocess` launch (O is read only then).
    start_m, bh, b, h, q_start, seqlen_q, k_start, seqlen_k = _query_program(
        cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, BLOCK_M, VARLEN, REVERSE)
    if start_m >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b64 * stride_qb + h * stride_qh + q_start.to(tl.int64) * stride_qm, stride_qm, rows, offs_d,
                  seqlen_q, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + b64 * stride_dob + h * stride_doh + q_start.to(tl.int64) * stride_dom, stride_dom, rows,
                   offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
    lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start
    delta_base = DELTA + b64 * stride_lb + h * stride_lh + q_start
    if COMPUTE_DELTA:  # used from registers: a load back could read another thread's store before it lands
        o = load_tile(O + b64 * stride_ob + h * stride_oh + q_start.to(tl.int64) * stride_om, stride_om, rows, offs_d,
                      seqlen_q, HEAD_DIM, BLOCK_D, True)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(delta_base + rows, delta, mask=rows < seqlen_q)
        lse = load_lse(lse_base, rows, seqlen_q)
    else:
        lse, delta = load_row_stats(lse_base, delta_base, rows, seqlen_q)
    k_base = K + b64 * stride_kb + (h // group) * stride_kh + k_start.to(tl.int64) * stride_kn
    v_base = V + b64 * stride_vb + (h // group) * stride_vh + k_start.to(tl.int64) * stride_vn
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    mid, hi = _key_stages(start_m, seqlen_k, diag, IS_CAUSAL, BLOCK_M, BLOCK_N)
    for start_n in range(0, mid, BLOCK_N):
        dq = bwd_dq_block_step(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, rows, offs_n,
                               offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                               HEAD_DIM, BLOCK_D, False, False, HAS_DROPOUT)
    for start_n in range(mid, hi, BLOCK_N):
        dq = bwd_dq_block_step(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, start_n, rows, offs_n,
                               offs_d, seqlen_k, diag, qk_scale, seed, bh, drop_thresh, drop_scale,
                               HEAD_DIM, BLOCK_D, IS_CAUSAL, True, HAS_DROPOUT)
    dq = dq * sm_scale
    dq_ptrs = DQ + b64 * stride_dqb + h * stride_dqh + (q_start + rows[:, None]).to(tl.int64) * stride_dqm + offs_d[None, :]
    row_ok = rows[:, None] < seqlen_q
    if HEAD_DIM != BLOCK_D:
        row_ok = row_ok & (offs_d[None, :] < HEAD_DIM)
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok)


@triton.jit
def _dropout_mask_kernel(OUT, SEED, seqlen_q, seqlen_k, drop_thresh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    bh = tl.program_id(2)
    seed = tl.load(SEED)
    keep = dropout_keep(seed, bh, rows[:, None], cols[None, :], drop_thresh)
    ptrs = OUT + bh.to(tl.int64) * seqlen_q * seqlen_k + rows[:, None].to(tl.int64) * seqlen_k + cols[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(rows[:, None] < seqlen_q) & (cols[None, :] < seqlen_k))


# ---------------------------------------------------------------------------------------------------
# Launch configurations (autotuned on the GPU, one small fixed config under the interpreter)
# ---------------------------------------------------------------------------------------------------


class _WideOnlyConfig(triton.Config):
    """A config `_prune` keeps above head dim 128 only. A subclass rather than an attribute: Triton's tuning cache
    writes each config's __dict__ and rebuilds it as `Config(**d)` in the next process, so any extra attribute
    breaks every cached launch (it did: TypeError on the second run of a shape)."""


def _configs(shapes, wide_only: bool = False, **consts):
    kind = _WideOnlyConfig if wide_only else triton.Config
    return [kind({"BLOCK_M": m, "BLOCK_N": n, **consts}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


_FWD_SHAPES = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 32, 4, 4), (64, 64, 4, 3),
               (64, 32, 4, 4)]
_DKDV_SHAPES = [(32, 128, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2), (128, 128, 8, 2), (32, 64, 4, 4), (64, 64, 4, 3),
                (16, 64, 4, 4), (32, 128, 8, 2), (64, 64, 8, 2)]  # the last two: no / least spills at hd 128
# (64, 64, 4, 3) is the queries-as-rows pick at GPT-2's shape (0.78x the keys-as-rows tile's dK/dV time with dropout,
# results/attention/dkdv_natural/ab_h100.txt); (128, 64, 8, 2), spill-free in that form, lost there to it at every
# shape measured (1.5-1.6x its time), so only the fused kernel's list has it.
_DQ_SHAPES = [(128, 32, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3), (64, 32, 4, 4),
              (64, 16, 4, 4)]
# The warp-specialised forward (WARP_SPEC, head dim 128, sm_90): 2 stages only, since every 3-stage WS config
# that compiled returned NaN in the A/B (results/attention/ws_fwd_ab/); with 8 warps the compiler does not
# specialise. Candidates only where `_ws_unsupported` finds nothing against it (see `_fwd_kind`).
_FWD_WS_SHAPES = [(128, 128, 4, 2)]
# Forward candidates for head dims above 128 only (_prune drops them below): 8 warps over small tiles, which
# compile without spilling at head dim 256 on sm_90 where all forward configs above but (64, 32, 4, 4) spill (up
# to 1,360 bytes per thread; results/attention/kernel_resources/sm90_hd256.md). On the H100 the autotuner picked
# (128, 32, 8, 2) at 512 and 1K non-causal (forward 1.02-1.04x the run before them). The backward's spill-free
# 8-warp candidates were never picked at any of 8 head-dim-256 shapes and left the lists
# (results/attention/tune/h100_hd256_wide/).
_FWD_WIDE_SHAPES = [(64, 64, 8, 2), (64, 64, 8, 3), (128, 32, 8, 2), (64, 32, 8, 3)]


def tuning_shapes(kind: str, block_d: int) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, warps, stages) the autotuner of `kind` ("fwd", "dkdv", "dq", "fused") holds for a padded
    head dim, before `_prune` drops the tiles too large for it: the forward's wide-only candidates join above 128. A new
    list (scripts/tune_flash.py and kernel_resources.py add their own candidates to it)."""
    base = {"fwd": _FWD_SHAPES, "dkdv": _DKDV_SHAPES, "dq": _DQ_SHAPES, "fused": _FUSED_SHAPES}[kind]
    return [*base, *(_FWD_WIDE_SHAPES if kind == "fwd" and block_d > 128 else [])]


_TUNE_KEY = ["TUNE_Q", "TUNE_K", "HEAD_DIM", "IS_CAUSAL", "VARLEN", "HAS_DROPOUT"]
_INTERP_BLOCK = {"BLOCK_M": 16, "BLOCK_N": 16}


def _prune(configs, named_args, **kwargs):
    """Keep the configs meant for the problem's head dim: above 128, tiles of at most 64 x 64 elements; the
    wide-only configs only there."""
    d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 64))
    keep = []
    for c in configs:
        m, n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if (d > 128 and m * n > 64 * 64) or (d <= 128 and isinstance(c, _WideOnlyConfig)):
            continue
        keep.append(c)
    return keep or configs[-1:]


def _autotuned(kernel, configs, reset_to_zero=None):
    # cache_results: each tuning result is kept in Triton's cache directory (~/.triton/cache, or
    # TRITON_CACHE_DIR), keyed by the Triton version, the GPU target, the kernel source, the tuning key
    # (sequence-length buckets, head dim, causal, varlen, dropout, dtypes) and the config list, so a new
    # process reuses it instead of timing every config again.
    return triton.autotune(configs, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune},
                           cache_results=True, reset_to_zero=reset_to_zero)(kernel)


def _fwd_configs():
    return _configs(_FWD_SHAPES) + _configs(_FWD_WIDE_SHAPES, wide_only=True)


_fwd_tuned = _autotuned(_fwd_kernel, _fwd_configs())
# A second tuner for launches that may warp-specialise: its own cache, so that a choice made for inputs
# the WS loop can read never reaches inputs it cannot (the tuning key does not see strides or the GPU).
_fwd_ws_tuned = _autotuned(_fwd_kernel, _fwd_configs() + _configs(_FWD_WS_SHAPES, WARP_SPEC=True))
_dkdv_tuned = _autotuned(_bwd_dkdv_kernel, _configs(_DKDV_SHAPES))
# The fused backward's dK/dV(+dQ) kernel: the configs of the one-kernel A/B (results/attention/tma_dq/, head dims
# 16-64), then three that spill least in this integrated form (sm_90 compile, results/attention/fused_bwd/; the
# two non-spilling 16-row tiles at head dim 64 were never picked there), and (128, 64, 8, 2), spill-free in the
# queries-as-rows form with ~45 thread-instructions a score at head dim 64 (results/attention/dkdv_natural/
# probe.txt); its tuning runs must start from a zero dQ buffer each time.
_FUSED_SHAPES = [(64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (64, 128, 8, 3), (128, 128, 8, 2), (64, 64, 8, 2),
                 (64, 64, 8, 3), (32, 64, 4, 3), (128, 64, 8, 2)]
_fused_tuned = _autotuned(_bwd_dkdv_kernel, _configs(_FUSED_SHAPES), reset_to_zero=["DQA"])
_dq_tuned = _autotuned(_bwd_dq_kernel, _configs(_DQ_SHAPES))


# Fixed configs for FLASH_AUTOTUNE=0 (e.g. GPU tests, which would otherwise tune every shape they touch),
# per head-dim class. Head dims 65-128 take 8 warps: with 4, every kernel spills registers at head dim
# 128 (dK/dV 0.9-1.3 KB of stack per thread, sm_90; scripts/kernel_resources.py, kernels/NOTES_flash.md).
# Head dims up to 64: each within 2% of the fastest candidate at the GPT-2 shape with dropout 0 and 0.1
# (results/attention/tune/), where the earlier (128, 64) / (32, 128) / (128, 32) tiles took 25% longer with
# dropout.
# "fwd_ws" (head dim 128 only): the warp-specialised forward's config, used where `_fwd_kind` picks it: non-
# causal only, where the A/B measured 1.18x / 1.20x the autotuned forward at 4K / 1K tokens. Causal keeps
# "fwd": its WS loop masks every tile element-wise (see _fwd_ws), which no measurement has priced yet.
# "dkdv" at head dims up to 64 since the queries-as-rows dK/dV form: (64, 64, 4, 3), the fastest fixed tile of the
# A/B at GPT-2's shape, dropout 0 and 0.1 (results/attention/dkdv_natural/ab_h100.txt; 0.78x the keys-as-rows
# (32, 64, 4, 4) with dropout); the GPU tests at this default run that form, head dim 128's run the other.
# "fused" (on by default for head dims up to 32): the autotuner's pick at both such shapes of the H100 A/B
# (results/attention/fused_bwd/README.md).
_DEFAULT = {"fwd": (64, 64, 4, 3), "dkdv": (64, 64, 4, 3), "dq": (64, 32, 4, 4), "fused": (128, 64, 4, 3)}
_DEFAULT_128 = {"fwd": (128, 64, 8, 3), "dkdv": (32, 128, 8, 2), "dq": (128, 64, 8, 3), "fwd_ws": _FWD_WS_SHAPES[0]}
_DEFAULT_WIDE = {"fwd": (64, 64, 4, 2), "dkdv": (32, 64, 4, 2), "dq": (64, 32, 4, 2)}  # head dim 256


def fallback_configs(block_d: int) -> dict:
    """The FLASH_AUTOTUNE=0 configs for a padded head dim: {kernel: (BLOCK_M, BLOCK_N, warps, stages)}; kernel
    "fwd_ws" (head dim 128) is the forward with WARP_SPEC."""
    return _DEFAULT_WIDE if block_d > 128 else _DEFAULT_128 if block_d > 64 else _DEFAULT


# (kind, sequence buckets, constexprs, dtypes) -> the tuned Config's launch kwargs. Triton's Autotuner.run
# rebuilds dicts of all ~45 arguments and their dtypes on every call to find its cached choice; once a
# key is tuned, the launch goes straight to the kernel with the kept config.
_TUNED_CONFIGS: dict = {}


# Constexprs a kind adds to its fixed (and interpreter) config; tuned configs carry their own.
_KIND_CONSTS = {"fwd_ws": {"WARP_SPEC": True}}


def _autotuning() -> bool:
    return not _env_is("FLASH_AUTOTUNE", "0")


def _tuning_key(kind, consts: dict, tune: tuple, dtypes: tuple) -> tuple:
    """`_TUNED_CONFIGS`' key of a launch: the kind, the two sequence buckets, the constexprs, the dtypes."""
    return kind, *tune, *consts.values(), *dtypes


def _launch_config(kind, tuned, consts: dict, tune: tuple, dtypes: tuple) -> dict | None:
    """The block sizes and launch options of one launch: the interpreter's small blocks; the fixed config with
    FLASH_AUTOTUNE=0 or tuned=None; else the autotuner's choice for the key, None while it has not been tuned."""
    if _interpreting():
        return {**_INTERP_BLOCK, **_KIND_CONSTS.get(kind, {})}
    if tuned is None or not _autotuning():
        m, n, w, s = fallback_configs(consts["BLOCK_D"])[kind]
        return {"BLOCK_M": m, "BLOCK_N": n, **_KIND_CONSTS.get(kind, {}), "num_warps": w, "num_stages": s}
    return _TUNED_CONFIGS.get(_tuning_key(kind, consts, tune, dtypes))


def _launch(kind, raw, tuned, grid_of, args, consts, dtypes=()):
    """Autotuned launch on the GPU; a fixed config with FLASH_AUTOTUNE=0 or tuned=None; a small one under the
    interpreter. args end with the two tuning buckets; dtypes: those of the tensors whose dtype can vary
    independently."""
    config = _launch_config(kind, tuned, consts, args[-2:], dtypes)
    if config is None:  # the key's first call: tune, keep the choice
        tuned[lambda meta: grid_of(meta)](*args, **consts)
        _TUNED_CONFIGS[_tuning_key(kind, consts, args[-2:], dtypes)] = tuned.best_config.all_kwargs()
    elif _interpreting():
        raw[grid_of(config)](*args, **consts, **config)
    else:
        launch(raw, grid_of(config), args, {**consts, **config})


def _varlen_max(n: int) -> int:
    """A varlen batch's longest sequence, rounded up to a multiple of 16, as the kernels get it: it only
    sizes the grid (each program reads its own sequence's bounds), and a value whose divisibility by 16
    changed from batch to batch made Triton compile another variant of each kernel mid-training."""
    return -(-n // 16) * 16


def _bucket(n: int) -> int:
    """Autotune key for a sequence length: next power of two (so varlen batches do not retune)."""
    return 1 << max(n - 1, 1).bit_length()


# ---------------------------------------------------------------------------------------------------
# Host side: checks, preprocessing, launchers (SHARED parts marked)
# ---------------------------------------------------------------------------------------------------

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_inputs(q, k, v, varlen: bool = False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                 max_seqlen_k=None, dropout_p: float = 0.0):
    """Validate attention inputs; raise TypeError/ValueError saying what is wrong and what is supported.

    SHARED with kernels/blocksparse.py: keep the signature stable.
    Dense: q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim).
    Varlen: q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim), cu_seqlens int32 (batch+1,).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; supported: float16, bfloat16 (float32 for testing)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"flash attention needs CUDA tensors (got {q.device}); CPU tensors run only under "
                         "the Triton interpreter (set TRITON_INTERPRET=1 before importing triton)")
    rank = 3 if varlen else 4
    layout = "(total, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not varlen and k.shape[0] != q.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    nheads, headdim = q.shape[-2], q.shape[-1]
    nheads_k = k.shape[-2]
    if k.shape[-1] != headdim:
        raise ValueError(f"q and k must have the same head dim, got {headdim} and {k.shape[-1]}")
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k}) (MQA/GQA)")
    if headdim % 8 != 0 or not 8 <= headdim <= 256:
        raise ValueError(f"head dim {headdim} is not supported: use a multiple of 8 between 8 and 256")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if varlen and cu_seqlens_q is not None:  # None: the caller built them (kernels.padding.PackedBatch)
        for name, cu, total, mx in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                    ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
            if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32:
                raise TypeError(f"{name} must be an int32 tensor, got "
                                f"{cu.dtype if isinstance(cu, torch.Tensor) else type(cu).__name__}")
            if cu.dim() != 1 or cu.numel() < 2:
                raise ValueError(f"{name} must be 1-D of length batch + 1 >= 2, got shape {tuple(cu.shape)}")
            if cu.device != q.device:
                raise ValueError(f"{name} must be on {q.device}, got {cu.device}")
            c = cu.detach().cpu()
            lens = c[1:] - c[:-1]
            if int(c[0]) != 0 or bool((lens < 0).any()):
                raise ValueError(f"{name} must start at 0 and be non-decreasing, got {c.tolist()[:8]}...")
            if int(c[-1]) != total:
                raise ValueError(f"{name}[-1] = {int(c[-1])} must equal the packed length {total}")
            if int(lens.max()) > int(mx):
                raise ValueError(f"max_seqlen ({mx}) is smaller than the longest sequence in {name} ({int(lens.max())})")
        if cu_seqlens_q.numel() != cu_seqlens_k.numel():
            raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1)")


def _lastdim_contig(x: torch.Tensor) -> torch.Tensor:
    # The kernels take any strides for batch/seq/head; the head dim must be contiguous for wide loads.
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(x: torch.Tensor, varlen: bool):
    """(batch, seq, head) strides; varlen tensors have no batch dim (its stride is unused: 0)."""
    s = x.stride()  # one call: each stride(i) is a separate trip into C++
    return (0, s[0], s[1]) if varlen else s[:3]


class TensorGeometry(tuple):
    """What the launchers' checks and arguments read of a tensor, as one hashable value: shape, strides, dtype, device
    and its address modulo 16 (TMA and Triton's pointer specialisation ask only whether an address is 16-byte
    aligned). It answers the Tensor methods they call as the tensor does (`data_ptr()` with that remainder), so a
    check run on it gives the tensor's verdict, and a plan worked out from a call's geometries (`_plan`) fits every
    call with the same ones."""

    __slots__ = ()

    def __new__(cls, t):
        return tuple.__new__(cls, (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16))

    @classmethod
    def fresh(cls, shape, dtype, device) -> "TensorGeometry":
        """A new contiguous tensor's: torch's allocators return memory aligned to far more than 16 bytes (CUDA's
        caching allocator to 512)."""
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= max(size, 1)
        return tuple.__new__(cls, (torch.Size(shape), tuple(reversed(strides)), dtype, device, 0))

    shape = property(lambda self: self[0])
    dtype = property(lambda self: self[2])
    device = property(lambda self: self[3])
    is_cuda = property(lambda self: self[3].type == "cuda")

    def stride(self, dim: int | None = None):
        return self[1] if dim is None else self[1][dim]

    def data_ptr(self) -> int:
        return self[4]

    def element_size(self) -> int:
        return self[2].itemsize

    def numel(self) -> int:
        return math.prod(self[0])

    def dim(self) -> int:
        return len(self[0])

    def is_contiguous(self) -> bool:
        if self.numel() == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self[0]), reversed(self[1])):
            if size != 1:
                if stride != expected:
                    return False
                expected *= size
        return True


# A plan: what one call geometry's launches need, worked out once (`_gluon_bwd_setup`), keyed by the call's geometries
# and the switches its checks read. Module settings (GLUON_KERNELS, flash_gluon's minimum lengths, ...) are read when
# a plan is made: code that changes them after a first call calls `clear_plans()`.
_PLANS: dict = {}
_MAX_PLANS = 1024  # a long run with ever new geometries must not grow without bound
_NO_PLAN = object()


def clear_plans() -> None:
    """Forget every plan (tests, and A/Bs that change module settings between calls)."""
    _PLANS.clear()


def _plan(setup, key: tuple):
    """setup(*key), made once per key: a plan, or None where the call takes another path."""
    plan = _PLANS.get((setup, key), _NO_PLAN)
    if plan is _NO_PLAN:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[setup, key] = setup(*key)
    return plan


def _new_grads(q, k, v, dtypes: tuple, device) -> tuple:
    """Fresh dQ, dK, dV shaped like q, k, v in these dtypes: what a plan allocates per call where the shapes are not
    part of its key (varlen: the packed length)."""
    return tuple(torch.empty(t.shape, dtype=dtype, device=device) for t, dtype in zip((q, k, v), dtypes))


def _fresh_grads(q, k, v, dtype=None, device=None) -> tuple:
    """((shape, dtype) of the dQ, dK, dV a launcher allocates, in dtype or the inputs'), and their TensorGeometry:
    what a plan allocates per call and what its setup reads in their place."""
    specs = tuple((t.shape, dtype or t.dtype) for t in (q, k, v))
    return specs, tuple(TensorGeometry.fresh(shape, dt, device) for shape, dt in specs)


def _block_d(headdim: int) -> int:
    # Plain Python, not triton.next_power_of_2: that constexpr wrapper costs microseconds per launch.
    return max(16, 1 << (headdim - 1).bit_length())


def draw_dropout_seed(device) -> torch.Tensor:
    """The dropout seed: one int64 drawn from torch's default generator of `device` (no host sync).

    SHARED with kernels/blocksparse.py. torch.manual_seed(s) makes it reproducible; each call advances
    the generator, so consecutive calls draw different masks. Tests replay it to get the kernel's mask.
    """
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def _drop_consts(dropout_p: float):
    """(the kernels' 16-bit threshold, the 1 / (1 - p) scale of kept values)."""
    thresh = int(round(dropout_p * (1 << 16)))
    if thresh >= 1 << 16:
        raise ValueError(f"dropout_p {dropout_p} rounds to 1 at the kernels' 16-bit resolution (every score "
                         "dropped); use p <= 1 - 2^-16")
    return thresh, 1.0 / (1.0 - dropout_p)


def dropout_keep_mask(seed: torch.Tensor, batch: int, nheads: int, seqlen_q: int, seqlen_k: int,
                      dropout_p: float) -> torch.Tensor:
    """The kernel's dropout keep-mask, bool (batch, nheads, seqlen_q, seqlen_k), for a given seed tensor.

    For tests: `kernels.standard.standard_attention(..., dropout_mask=mask)` then computes exactly what
    the kernel computes. For varlen, sequence b of the pack uses batch index b.
    """
    thresh, _ = _drop_consts(dropout_p)
    out = torch.empty(batch * nheads, seqlen_q, seqlen_k, dtype=torch.int8, device=seed.device)
    grid = (cdiv(seqlen_q, 32), cdiv(seqlen_k, 32), batch * nheads)
    _dropout_mask_kernel[grid](out, seed, seqlen_q, seqlen_k, thresh, BLOCK_M=32, BLOCK_N=32)
    return out.view(batch, nheads, seqlen_q, seqlen_k).bool()


def bwd_preprocess(o: torch.Tensor, do: torch.Tensor, varlen: bool = False, cu_seqlens_q=None,
                   max_seqlen_q: int | None = None, out: torch.Tensor | None = None,
                   zero: torch.Tensor | None = None) -> torch.Tensor:
    """delta = rowsum(dO * O) in float32: (batch, nheads, seqlen_q), or (nheads, total_q) for varlen; into `out`
    (contiguous, that shape) when given. zero: a float32 tensor of o's shape, unit last stride, set to 0 in the same
    launch (the Gluon backward's dQ buffer).

    o and do share the layout of q. kernels/blocksparse.py's plans launch it through `_bwd_preprocess_launch`.
    """
    delta = torch.empty(lse_shape(o, varlen), dtype=torch.float32, device=o.device) if out is None else out
    batch, seqlen = (cu_seqlens_q.numel() - 1, max_seqlen_q) if varlen else (o.shape[0], o.shape[1])
    _bwd_preprocess_launch(o, do, delta, zero, varlen, batch, seqlen)(o, do, delta, o if zero is None else zero,
                                                                      cu_seqlens_q if varlen else o)
    return delta


def _bwd_preprocess_launch(o, do, delta, zero, varlen: bool, batch: int, seqlen: int) -> Prepared:
    """bwd_preprocess's launch for tensors of these geometries (tensors or TensorGeometry; zero may be None), to be
    called with (o, do, delta, zero or o, cu_seqlens_q or o): the unused pointers are o's."""
    nheads, headdim = o.shape[-2], o.shape[-1]
    if zero is not None and (zero.shape != o.shape or zero.dtype != torch.float32 or zero.stride(-1) != 1):
        raise ValueError(f"bwd_preprocess: zero must be float32 of o's shape {tuple(o.shape)} with unit last stride, "
                         f"got {zero.dtype} {tuple(zero.shape)} strides {zero.stride()}")
    sdb, sdh = (0, o.shape[0]) if varlen else delta.stride()[:2]
    block_m = 16 if _interpreting() else 64
    o_strides = _strides(o, varlen)
    zero_strides = o_strides if zero is None else _strides(zero, varlen)
    numbers = (seqlen, nheads, *o_strides, *_strides(do, varlen), sdb)
    return Prepared(_bwd_preprocess_kernel, (cdiv(seqlen, block_m), batch * nheads),
                    (*numbers, sdh, *zero_strides),
                    dict(HEAD_DIM=headdim, BLOCK_D=_block_d(headdim), BLOCK_M=block_m, VARLEN=varlen,
                         ZERO_FILL=zero is not None),
                    varying=(len(numbers),) if varlen else ())  # varlen: sdh, the packed length (`_jit_bwd_plan`)


@triton.jit
def _scale_cast_kernel(SRC, DST, n_rows, dst_row_stride, scale, ROW: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    keep = rows < n_rows
    x = tl.load(SRC + rows.to(tl.int64) * ROW + cols, mask=keep)
    tl.store(DST + rows.to(tl.int64) * dst_row_stride + cols, (x * scale).to(DST.dtype.element_ty), mask=keep)


def scale_cast(src: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """out = src * scale in out's dtype, as `torch.mul(src, scale, out=out)` computes it (float32 product, one
    rounding), for a contiguous float32 src and an out of its shape whose rows (all but the last two dims) are one
    stride apart with heads and head dim dense (dq of the Gluon backward: a fresh tensor or a view of a packed
    dqkv). PyTorch runs a dtype-changing mul through its unrolled, unvectorised kernel: on the H100 1.5 TB/s at GPT-2's
    dQ as a view of packed dqkv, 2.2 contiguous, against 2.25-2.3 here (results/attention/scale_cast/)."""
    _scale_cast_launch(src, scale, out)(src, out)


def _scale_cast_launch(src, scale: float, out) -> Prepared:
    """scale_cast's launch for tensors of these geometries (tensors or TensorGeometry), called with (src, out)."""
    shape, strides = out.shape, out.stride()  # one call into C++ each
    heads, head_dim = shape[-2], shape[-1]
    dense_rows = all(strides[i] == shape[i + 1] * strides[i + 1] for i in range(len(shape) - 3))
    if not (src.is_contiguous() and src.dtype == torch.float32 and src.shape == shape and dense_rows
            and strides[-1] == 1 and strides[-2] == head_dim and head_dim >= 16 and head_dim & (head_dim - 1) == 0):
        raise ValueError(f"scale_cast: src must be contiguous float32 of out's shape, out's heads and rows dense, the "
                         f"head dim a power of 2 from 16; got "
                         f"src {src.dtype} {tuple(src.shape)}, out {tuple(out.shape)} strides {out.stride()}")
    n_rows = math.prod(shape) // (heads * head_dim)
    block_c = min(128, head_dim)
    block_r = 4 if _interpreting() else 32
    return Prepared(_scale_cast_kernel, (cdiv(n_rows, block_r), heads * head_dim // block_c),
                    (n_rows, strides[-3], float(scale)), dict(ROW=heads * head_dim, BLOCK_R=block_r, BLOCK_C=block_c))


def problem_sizes(q, k, cu_q, max_q, max_k) -> tuple[int, int, int]:
    """(batch, max_seqlen_q, max_seqlen_k): from the shapes, or for varlen (cu_q given) from cu_seqlens and
    the maxima the caller passed. SHARED with kernels/blocksparse.py."""
    if cu_q is not None:
        return cu_q.numel() - 1, max_q, max_k
    return q.shape[0], q.shape[1], k.shape[1]


def lse_shape(q, varlen: bool) -> tuple[int, ...]:
    """The log-sum-exp the forward stores: (nheads, total_q) for varlen, else (batch, nheads, seqlen_q)."""
    return (q.shape[-2], q.shape[0]) if varlen else (q.shape[0], q.shape[-2], q.shape[1])


def lse_strides(lse, varlen: bool) -> tuple[int, int]:
    """(batch, head) strides of the LSE as the kernels take them (varlen has no batch dimension: 0)."""
    return (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))


def lse_aligned(slb: int, slh: int, varlen: bool) -> bool:
    """LSE_ALIGNED of the backward kernels (`aligned_lse_strides`): a dense LSE whose strides are multiples of 16.
    Never for varlen, whose head stride is the batch's token count: a new packed batch must compile nothing."""
    return not varlen and slb % 16 == 0 and slh % 16 == 0


# Warp specialisation (the forward's `_fwd_ws`): Triton 3.6's `tl.range(..., warp_specialize=True)` on sm_90.
_WS_TRITON = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 6)


@functools.lru_cache(maxsize=None)
def _is_sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def _ws_layout_problem(t: torch.Tensor, varlen: bool) -> str | None:
    """Why `_fwd_ws` cannot read t through its 2-D TMA view (rows: (batch, token) or packed tokens; columns:
    head x head dim), or None. TMA needs a 16-byte aligned base and row stride and a contiguous last dim."""
    shape, stride = t.shape, t.stride()  # one call into C++ each: a backward checks six tensors
    nheads, headdim = shape[-2], shape[-1]
    row = stride[0 if varlen else 1]
    if stride[-1] != 1 or (nheads > 1 and stride[-2] != headdim):
        return "heads not side by side in memory"
    if not varlen and shape[0] > 1 and stride[0] != shape[1] * row:
        return "batches not side by side in memory"
    if t.data_ptr() % 16 or row * t.element_size() % 16 or row < nheads * headdim:
        return "base or row stride not 16-byte aligned"
    numel = t.numel()
    if numel == 0 or numel // (nheads * headdim) >= 2**31:
        return "no rows, or more than 2^31"
    return None


def _ws_unsupported(q, k, v, dropout_p: float, varlen: bool) -> str | None:
    """Why the warp-specialised forward cannot take these inputs on any platform, or None."""
    if q.shape[-1] != 128:
        return "head dim is not 128 (the A/B found no gain at 64)"
    if dropout_p > 0:
        return "dropout (the warp-specialised loop has none)"
    return _tma_layout_unsupported(varlen, q=q, k=k, v=v)


def _ws_platform_unsupported(q) -> str | None:
    """Why this platform does not run the warp-specialised forward, or None."""
    if _interpreting():
        return "the Triton interpreter"
    if not _WS_TRITON:
        return f"Triton {triton.__version__} (built and tested with 3.6)"
    if q.device.type != "cuda" or not _is_sm90(q.device.index):
        return "not an sm_90 (Hopper) GPU"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return "float32 (tf32 dots, not tried with warp specialisation)"
    return None


def _fwd_kind(q, k, v, causal: bool, dropout_p: float, varlen: bool, warp_spec: bool | None):
    """(kind, tuner) of one forward launch: "fwd" (the two-stage key loop) or "fwd_ws" (`_fwd_ws`).

    warp_spec None (every caller but tests and A/Bs): "fwd_ws" where neither `_ws_unsupported` nor
    `_ws_platform_unsupported` finds a reason against it; when autotuning, its tuner times the WS config beside
    the plain ones; with FLASH_AUTOTUNE=0, the fixed WS config for non-causal attention only (see _DEFAULT_128).
    False: never. True: always, in its fixed config; raises ValueError where it cannot run; under the
    interpreter it runs `_fwd_ws`'s arithmetic (the interpreter ignores warp_specialize). Both paths compute
    the same function of the inputs, so this chooses code, not results.
    """
    if warp_spec is False:
        return "fwd", _fwd_tuned
    reason = _ws_unsupported(q, k, v, dropout_p, varlen)
    if reason is None and not (warp_spec and _interpreting()):
        reason = _ws_platform_unsupported(q)
    if reason is not None:
        if warp_spec:
            raise ValueError(f"warp_spec=True, but the warp-specialised forward cannot run here: {reason}")
        return "fwd", _fwd_tuned
    if warp_spec:
        return "fwd_ws", None
    if _autotuning():
        return "fwd_ws", _fwd_ws_tuned
    return ("fwd", _fwd_tuned) if causal else ("fwd_ws", None)


# The Gluon kernels (kernels/flash_gluon.py) are written against Triton 3.6's Gluon API, which is experimental and
# changes between releases: other Triton versions run this module's kernels.
_GLUON_TRITON = tuple(int(x) for x in triton.__version__.split(".")[:2]) == (3, 6)
GLUON_KERNELS = os.environ.get("FLASH_GLUON", "1") != "0"


def _gluon_off() -> str | None:
    """Why no Gluon kernel runs in this process, or None."""
    if not GLUON_KERNELS:
        return "FLASH_GLUON=0"
    if not _GLUON_TRITON:
        return f"Triton {triton.__version__} (the Gluon kernels are written for 3.6)"
    return None


def _gluon_unsupported(q, k, v, causal: bool, dropout_p: float, varlen: bool, out_dtype) -> str | None:
    """Why the Gluon forward does not take this call, or None (then `_flash_fwd` launches it)."""
    off = _gluon_off()
    if off:
        return off
    if out_dtype not in (None, q.dtype):
        return "an output dtype other than the inputs' (kernels/ring.py's float32 partials)"
    from kernels import flash_gluon  # here, not at the top: only Triton 3.6's Gluon API is known to import

    return (flash_gluon.unsupported(q, k, v, causal, dropout_p, varlen)
            or _tma_layout_unsupported(False, q=q, k=k, v=v) or _ws_platform_unsupported(q))


def _tma_layout_unsupported(varlen: bool, **tensors) -> str | None:
    """The first named tensor that a 2-D TMA view (`_ws_layout_problem`) cannot read or write, and why; or None."""
    for name, t in tensors.items():
        problem = _ws_layout_problem(t, varlen)
        if problem:
            return f"{name}: {problem}"
    return None


def _gluon_bwd_unsupported(q, k, v, do, lse, delta, grads, causal: bool, dropout_p: float, varlen: bool) -> str | None:
    """Why the Gluon backward does not take this call, or None (then `_flash_bwd` launches it). grads: the (dq, dk,
    dv) buffers it would fill."""
    off = _gluon_off()
    if off:
        return off
    if torch.are_deterministic_algorithms_enabled():
        return "deterministic mode (its dQ reduce adds in a varying order)"
    if any(g.dtype != q.dtype for g in grads):
        return "gradient dtype other than the inputs' (kernels/ring.py's float32 partials)"
    if do.dtype != q.dtype:  # its Q / dO ring holds one dtype
        return f"dO in {do.dtype}, the inputs in {q.dtype}"
    if not (lse.is_contiguous() and delta.is_contiguous() and lse.shape == delta.shape):
        return "LSE or delta not contiguous (batch, nheads, seqlen)"
    from kernels import flash_gluon

    dq, dk, dv = grads
    return (flash_gluon.bwd_unsupported(q, k, causal, dropout_p, varlen)
            or _tma_layout_unsupported(False, q=q, k=k, v=v, do=do, dk=dk, dv=dv) or _ws_platform_unsupported(q))


class _GluonForward:
    """One call geometry's Gluon forward (kernels/flash_gluon.py), its launch worked out by `_gluon_fwd_setup`."""

    __slots__ = ("device", "o_shape", "o_dtype", "lse_shape", "dropout", "kernel")

    def __call__(self, q, k, v):
        device = self.device
        o = torch.empty(self.o_shape, dtype=self.o_dtype, device=device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=device)
        seed = draw_dropout_seed(device) if self.dropout else lse  # any pointer when unused
        self.kernel(q, k, v, o, lse, seed)
        return o, lse, seed


def _gluon_fwd_plan(q, k, v, softmax_scale: float, causal: bool, dropout_p: float, out_dtype):
    """The Gluon forward of this call (a `_GluonForward`), or None where `_gluon_unsupported` says why not; made once
    per geometry, as `_gluon_bwd_plan`."""
    geometry = TensorGeometry
    return _plan(_gluon_fwd_setup, (geometry(q), geometry(k), geometry(v), softmax_scale, causal, dropout_p, out_dtype,
                                    (GLUON_KERNELS, _GLUON_TRITON, _interpreting())))


def _gluon_fwd_setup(q, k, v, softmax_scale, causal, dropout_p, out_dtype, switches):
    """`_gluon_fwd_plan`'s plan from the call's geometries (switches: read by the checks themselves)."""
    if _gluon_unsupported(q, k, v, causal, dropout_p, False, out_dtype) is not None:
        return None
    from kernels.flash_gluon import forward_launch

    plan = _GluonForward()
    plan.device, plan.o_shape, plan.o_dtype = q.device, q.shape, out_dtype or q.dtype
    plan.lse_shape, plan.dropout = lse_shape(q, False), dropout_p > 0
    o = TensorGeometry.fresh(plan.o_shape, plan.o_dtype, q.device)
    lse = TensorGeometry.fresh(plan.lse_shape, torch.float32, q.device)
    seed = TensorGeometry.fresh((1,), torch.int64, q.device) if plan.dropout else lse
    plan.kernel = forward_launch(q, k, v, o, lse, seed, softmax_scale * LOG2E, causal, dropout_p=dropout_p)
    return plan


class _GluonBackward:
    """One call geometry's Gluon backward (kernels/flash_gluon.py), its launches worked out by `_gluon_bwd_setup`:
    delta = rowsum(dO * O) with the float32 dQ buffer zeroed in the same launch, the kernel, dQ scaled and cast."""

    __slots__ = ("device", "q_shape", "delta_shape", "fresh_grads", "dropout", "preprocess", "kernel", "cast")

    def __call__(self, do, q, k, v, o, lse, seed, out):
        device = self.device
        delta = torch.empty(self.delta_shape, dtype=torch.float32, device=device)
        dq_accum = torch.empty(self.q_shape, dtype=torch.float32, device=device)
        if out is None:
            dq, dk, dv = (torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.fresh_grads)
        else:
            dq, dk, dv = out
        self.preprocess(o, do, delta, dq_accum, o)
        self.kernel(q, do, k, v, dk, dv, dq_accum, lse, delta, seed if self.dropout else lse)
        self.cast(dq_accum, dq)
        return dq, dk, dv


def _gluon_bwd_plan(do, q, k, v, o, lse, seed, out, grad_dtype, softmax_scale: float, causal: bool,
                    dropout_p: float):
    """The Gluon backward of this call (a `_GluonBackward`), or None where `_gluon_bwd_unsupported` says why not. Made
    once per geometry of the tensors and the switches the checks read, so a call does only its allocations and
    launches: the host time of a GPT-2-shaped backward is as long as its kernels."""
    geometry = TensorGeometry
    return _plan(_gluon_bwd_setup, (
        geometry(do), geometry(q), geometry(k), geometry(v), geometry(o), geometry(lse),
        geometry(seed) if dropout_p > 0 else None, None if out is None else tuple(map(geometry, out)), grad_dtype,
        softmax_scale, causal, dropout_p,
        (GLUON_KERNELS, _GLUON_TRITON, _interpreting(), torch.are_deterministic_algorithms_enabled())))


def _gluon_bwd_setup(do, q, k, v, o, lse, seed, grads, grad_dtype, softmax_scale, causal, dropout_p, switches):
    """`_gluon_bwd_plan`'s plan from the call's geometries (switches: read by the checks themselves)."""
    device = q.device
    delta = TensorGeometry.fresh(lse_shape(q, False), torch.float32, device)
    fresh_grads = None
    if grads is None:
        fresh_grads, grads = _fresh_grads(q, k, v, grad_dtype, device)
    if _gluon_bwd_unsupported(q, k, v, do, lse, delta, grads, causal, dropout_p, False) is not None:
        return None
    from kernels.flash_gluon import backward_launch

    dq, dk, dv = grads
    dq_accum = TensorGeometry.fresh(q.shape, torch.float32, device)
    plan = _GluonBackward()
    plan.device, plan.q_shape, plan.delta_shape, plan.fresh_grads = device, q.shape, delta.shape, fresh_grads
    plan.dropout = dropout_p > 0
    plan.preprocess = _bwd_preprocess_launch(o, do, delta, dq_accum, False, q.shape[0], q.shape[1])
    plan.kernel = backward_launch(q, k, v, do, dk, dv, dq_accum, lse, delta, seed, softmax_scale, causal,
                                  dropout_p=dropout_p)
    plan.cast = _scale_cast_launch(dq_accum, softmax_scale, dq)
    return plan


def _tma_scratch(size: int, alignment: int, stream):
    """Global memory for the TMA descriptors `_fwd_ws` writes on the device (3 x 128 bytes per program), from
    torch's caching allocator on the current device and stream, which are the ones Triton launches on: no
    cudaMalloc per launch, and its blocks are 512-byte aligned (Triton asks for 128)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_tma_allocator():
    """Install `_tma_scratch` as Triton's allocator unless one is set. Triton keeps it in a ContextVar, which a
    new thread starts without, so this is checked on every warp-specialised launch (one ContextVar read), not
    once per process; an allocator set by someone else stays (any that returns device memory will do)."""
    from triton.runtime import _allocation  # Triton 3.6 has no public getter

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_tma_scratch)


def _flash_fwd(q, k, v, softmax_scale, causal, dropout_p, varlen, cu_q, cu_k, max_q, max_k, out_dtype=None,
               warp_spec=None):
    # out_dtype: the kernel stores O in whatever dtype O has (float32 for kernels/ring.py's partial outputs).
    # warp_spec: see `_fwd_kind` (None: automatic, the Gluon forward first where `_gluon_unsupported` allows;
    # True / False: this module's kernels only, as tests and A/Bs ask).
    if warp_spec is None and not varlen:  # the Gluon forward takes no varlen
        plan = _gluon_fwd_plan(q, k, v, softmax_scale, causal, dropout_p, out_dtype)
        if plan is not None:
            return plan(q, k, v)
    plan = _jit_fwd_plan(q, k, v, cu_q if varlen else None, cu_k if varlen else None, max_q, max_k, softmax_scale,
                         causal, dropout_p, out_dtype, warp_spec)
    return plan(q, k, v, cu_q, cu_k)


def _flash_bwd(do, q, k, v, o, lse, seed, softmax_scale, causal, dropout_p, varlen, cu_q, cu_k, max_q, max_k,
               delta=None, grad_dtype=None, out=None, gluon=True):
    # delta: rowsum(dO * O) computed by the caller (then o is unused; it must share lse's strides);
    # grad_dtype: the kernels store dQ/dK/dV in the dtype of their buffers. Both for kernels/ring.py.
    # out: (dq, dk, dv) buffers to write into (views of one packed dqkv), else fresh ones.
    # gluon: the Gluon backward where `_gluon_bwd_unsupported` allows (`_gluon_bwd_plan`); False: this module's kernels
    # (tests, A/Bs).
    do = _lastdim_contig(do)
    if gluon and delta is None and not varlen:  # the Gluon backward takes neither a caller's delta nor varlen
        plan = _gluon_bwd_plan(do, q, k, v, o, lse, seed, out, grad_dtype, softmax_scale, causal, dropout_p)
        if plan is not None:
            return plan(do, q, k, v, o, lse, seed, out)
    plan = _jit_bwd_plan(do, q, k, v, o, lse, seed, delta, out, grad_dtype, cu_q if varlen else None,
                         cu_k if varlen else None, max_q, max_k, softmax_scale, causal, dropout_p)
    return plan(do, q, k, v, o, lse, seed, delta, out, cu_q, cu_k)


# The @triton.jit kernels' plans, as the Gluon ones: a call geometry's launches worked out once. A varlen batch's
# packed length changes from batch to batch, so its plans are keyed without it (`_packed_geometry`): what it changes
# in a launch is the LSE's (and delta's) head stride, which the kernels do not specialise on (`_PER_BATCH_INTS`), and
# the fused backward's dQ-buffer rows; each call passes those (`Prepared.varying`).


def _rows_class(n: int) -> int:
    """What the checks can tell of a packed length: no rows, one, several, 2^31 or more (`_ws_layout_problem`)."""
    return n if n < 2 else 2 if n < 2**31 else 2**31


def _packed_geometry(t):
    """The TensorGeometry of a packed (total, nheads, headdim) tensor, its total replaced by `_rows_class`'s (its
    strides do not depend on it)."""
    shape = t.shape
    return tuple.__new__(TensorGeometry, (torch.Size((_rows_class(shape[0]), *shape[1:])), t.stride(), t.dtype,
                                          t.device, t.data_ptr() % 16))


def _packed_lse_geometry(lse):
    """The TensorGeometry of a varlen (nheads, total) LSE or delta, its total replaced by `_rows_class`'s and its head
    stride by that: the kernels take the real one at each call."""
    (nheads, total), (_, token_stride) = lse.shape, lse.stride()
    rows = _rows_class(total)
    return tuple.__new__(TensorGeometry, (torch.Size((nheads, rows)), (rows, token_stride), lse.dtype, lse.device,
                                          lse.data_ptr() % 16))


def _key_geometry(cu_q, cu_k, max_q, max_k) -> tuple:
    """(how a plan keys the call's q-like tensors, its key's cu_seqlens and longest lengths): dense (cu_q None) by
    TensorGeometry, the lengths in the shapes; varlen without the packed length (`_packed_geometry`), by the
    cu_seqlens' geometries and the longest lengths as the kernels get them (`_varlen_max`). Shared with
    kernels/blocksparse.py's plans."""
    if cu_q is None:
        return TensorGeometry, (None, None, None, None)
    return _packed_geometry, (TensorGeometry(cu_q), TensorGeometry(cu_k), _varlen_max(max_q), _varlen_max(max_k))


def _pointer_geometry(t):
    """What a launch keys of a tensor it passes only as an unused pointer (a seed without dropout)."""
    return None if t is None else (t.dtype, t.device, t.data_ptr() % 16)


class _JitLaunch:
    """One launch of a @triton.jit kernel in a plan. Its first call resolves the config (`_launch_config`; while the
    autotuner has not tuned the key, the call goes through `_launch`, which tunes it); the launches then go through a
    `Prepared`. Called with the leading tensors and the values of the varying numbers."""

    __slots__ = ("kind", "raw", "tuned", "grid_of", "numbers", "consts", "dtypes", "varying", "prepared")

    def __init__(self, kind, raw, tuned, grid_of, numbers: tuple, consts: dict, dtypes: tuple, varying: tuple = ()):
        self.kind, self.raw, self.tuned, self.grid_of = kind, raw, tuned, grid_of
        self.numbers, self.consts, self.dtypes, self.varying = numbers, consts, dtypes, varying
        self.prepared = None

    def __call__(self, tensors: tuple, values: tuple = ()) -> None:
        prepared = self.prepared
        if prepared is None:
            config = _launch_config(self.kind, self.tuned, self.consts, self.numbers[-2:], self.dtypes)
            if config is None:
                numbers = self.numbers
                for i, value in zip(self.varying, values):
                    numbers = (*numbers[:i], value, *numbers[i + 1:])
                _launch(self.kind, self.raw, self.tuned, self.grid_of, (*tensors, *numbers), self.consts, self.dtypes)
                return
            prepared = self.prepared = Prepared(self.raw, self.grid_of(config), self.numbers,
                                                {**self.consts, **config}, varying=self.varying)
        prepared.run(tensors, values)


class _JitForward:
    """One call geometry's @triton.jit forward (`_jit_fwd_setup`)."""

    __slots__ = ("device", "o_dtype", "varlen", "dropout", "tma", "launch")

    def __call__(self, q, k, v, cu_q, cu_k):
        device = self.device
        o = torch.empty(q.shape, dtype=self.o_dtype, device=device)
        lse = torch.empty(lse_shape(q, self.varlen), dtype=torch.float32, device=device)
        seed = draw_dropout_seed(device) if self.dropout else lse  # any pointer when unused
        if self.tma:
            _ensure_tma_allocator()
        if self.varlen:
            self.launch((q, k, v, o, lse, seed, cu_q, cu_k), (lse.stride(0),))
        else:
            self.launch((q, k, v, o, lse, seed, lse, lse))
        return o, lse, seed


def _jit_fwd_plan(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p, out_dtype, warp_spec):
    """The @triton.jit forward of this call (a `_JitForward`), made once per geometry; varlen (cu_q given): per
    geometry but for the packed length, and per longest sequence as the kernels get it (`_varlen_max`)."""
    geometry, varlen_key = _key_geometry(cu_q, cu_k, max_q, max_k)
    return _plan(_jit_fwd_setup, (geometry(q), geometry(k), geometry(v), *varlen_key, softmax_scale, causal,
                                  dropout_p, out_dtype, warp_spec, (_interpreting(), _autotuning())))


def _jit_fwd_setup(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p, out_dtype, warp_spec,
                   switches):
    """`_jit_fwd_plan`'s plan from the call's geometries (switches: read by the checks and `_launch_config`)."""
    varlen = cu_q is not None
    nheads, headdim = q.shape[-2], q.shape[-1]
    group = nheads // k.shape[-2]
    batch, max_q, max_k = problem_sizes(q, k, cu_q, max_q, max_k)
    plan = _JitForward()
    plan.device, plan.o_dtype, plan.varlen, plan.dropout = q.device, out_dtype or q.dtype, varlen, dropout_p > 0
    o = TensorGeometry.fresh(q.shape, plan.o_dtype, q.device)
    lse = TensorGeometry.fresh(lse_shape(q, varlen), torch.float32, q.device)
    slb, slh = lse_strides(lse, varlen)
    thresh, drop_scale = _drop_consts(dropout_p)
    numbers = (max_q, max_k, nheads, group, softmax_scale * LOG2E, thresh, drop_scale, *_strides(q, varlen),
               *_strides(k, varlen), *_strides(v, varlen), *_strides(o, varlen), slb)
    varying = (len(numbers),) if varlen else ()  # slh: the packed length
    numbers += (slh, _bucket(max_q), _bucket(max_k))
    consts = dict(HEAD_DIM=headdim, BLOCK_D=_block_d(headdim), IS_CAUSAL=causal, VARLEN=varlen,
                  HAS_DROPOUT=dropout_p > 0, REVERSE=causal)
    kind, tuned = _fwd_kind(q, k, v, causal, dropout_p, varlen, warp_spec)
    plan.tma = kind == "fwd_ws" and not _interpreting()
    plan.launch = _JitLaunch(kind, _fwd_kernel, tuned, lambda m: (cdiv(max_q, m["BLOCK_M"]), batch * nheads), numbers,
                             consts, (q.dtype, plan.o_dtype), varying)
    return plan


class _JitBackward:
    """One call geometry's @triton.jit backward (`_jit_bwd_setup`): the dQ kernel (computing delta unless the caller
    gave it) then the dK/dV one; or, fused, delta, the dK/dV kernel adding dQ into a float32 buffer, and dQ's scale
    and cast."""

    __slots__ = ("device", "varlen", "grad_dtypes", "compute_delta", "fused", "scale", "preprocess", "dq", "dkdv")

    def __call__(self, do, q, k, v, o, lse, seed, delta, out, cu_q, cu_k):
        device, varlen = self.device, self.varlen
        if self.compute_delta:
            delta = torch.empty(lse_shape(q, varlen), dtype=torch.float32, device=device)
        dq, dk, dv = _new_grads(q, k, v, self.grad_dtypes, device) if out is None else out
        if not varlen:
            cu_q = cu_k = lse
        lse_head = (lse.stride(0),) if varlen else ()
        if self.fused:
            dqa = torch.zeros(q.shape[0] * (1 if varlen else q.shape[1]), q.shape[-2] * q.shape[-1],
                              dtype=torch.float32, device=device)
            if self.compute_delta:
                self.preprocess.run((o, do, delta, o, cu_q if varlen else o), (q.shape[0],) if varlen else ())
            if not _interpreting():
                _ensure_tma_allocator()
            varying = (*lse_head, q.shape[0]) if varlen else ()  # the LSE's head stride and the buffer's rows
            self.dkdv((q, k, v, do, dk, dv, dqa, lse, delta, seed, cu_q, cu_k), varying)
            torch.mul(dqa.view(q.shape), self.scale, out=dq)  # scale and cast in one pass over the float32 buffer
            return dq, dk, dv
        self.dq((q, k, v, do, dq, lse, delta, seed, o if self.compute_delta else dq, cu_q, cu_k), lse_head)
        self.dkdv((q, k, v, do, dk, dv, dk, lse, delta, seed, cu_q, cu_k), lse_head)
        return dq, dk, dv


def _jit_bwd_plan(do, q, k, v, o, lse, seed, delta, out, grad_dtype, cu_q, cu_k, max_q, max_k, softmax_scale,
                  causal, dropout_p):
    """The @triton.jit backward of this call (a `_JitBackward`), made once per geometry as `_jit_fwd_plan`."""
    geometry, varlen_key = _key_geometry(cu_q, cu_k, max_q, max_k)
    lse_geometry = TensorGeometry if cu_q is None else _packed_lse_geometry
    return _plan(_jit_bwd_setup, (
        geometry(do), geometry(q), geometry(k), geometry(v), geometry(o) if delta is None else None, lse_geometry(lse),
        geometry(seed) if dropout_p > 0 else _pointer_geometry(seed), None if delta is None else lse_geometry(delta),
        None if out is None else tuple(map(geometry, out)), grad_dtype, *varlen_key, softmax_scale, causal, dropout_p, (_interpreting(), _autotuning(), torch.are_deterministic_algorithms_enabled(),
                    FUSED_DROPOUT_BWD_MAX_D)))


def _jit_bwd_setup(do, q, k, v, o, lse, seed, delta, grads, grad_dtype, cu_q, cu_k, max_q, max_k, softmax_scale,
                   causal, dropout_p, switches):
    """`_jit_bwd_plan`'s plan from the call's geometries (switches: read by `_fused_bwd` and `_launch_config`)."""
    varlen = cu_q is not None
    device = q.device
    nheads, headdim = q.shape[-2], q.shape[-1]
    nheads_k = k.shape[-2]
    group = nheads // nheads_k
    batch, max_q, max_k = problem_sizes(q, k, cu_q, max_q, max_k)
    plan = _JitBackward()
    plan.device, plan.varlen, plan.scale = device, varlen, softmax_scale
    # Without a caller's delta, the two-kernel path's dQ kernel computes it (COMPUTE_DELTA) and runs first; the
    # fused path, whose dK/dV work starts at once, takes it from `bwd_preprocess`.
    plan.compute_delta = compute_delta = delta is None
    if compute_delta:
        delta = TensorGeometry.fresh(lse_shape(q, varlen), torch.float32, device)
    plan.grad_dtypes = tuple(grad_dtype or t.dtype for t in (q, k, v))
    dq, dk, dv = _fresh_grads(q, k, v, grad_dtype, device)[1] if grads is None else grads
    plan.fused = fused = _fused_bwd(q, dropout_p, _block_d(headdim))
    slb, slh = lse_strides(lse, varlen)
    thresh, drop_scale = _drop_consts(dropout_p)
    common = (max_q, max_k, nheads, group, softmax_scale, softmax_scale * LOG2E, thresh, drop_scale,
              *_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen))
    consts = dict(HEAD_DIM=headdim, BLOCK_D=_block_d(headdim), IS_CAUSAL=causal, VARLEN=varlen,
                  HAS_DROPOUT=dropout_p > 0)
    tune = (_bucket(max_q), _bucket(max_k))
    dkdv_numbers = (*common, *_strides(dk, varlen), *_strides(dv, varlen), slb)
    dkdv_varying = (len(dkdv_numbers),) if varlen else ()  # slh
    dkdv_consts = dict(consts, GQA=group > 1, LSE_ALIGNED=lse_aligned(slb, slh, varlen))
    dkdv_grid = lambda m: (cdiv(max_k, m["BLOCK_N"]), batch * nheads_k)  # noqa: E731
    if fused:
        rows = q.shape[0] * (1 if varlen else q.shape[1])
        if compute_delta:
            plan.preprocess = _bwd_preprocess_launch(o, do, delta, None, varlen, batch, max_q)
        plan.dkdv = _JitLaunch("fused", _bwd_dkdv_kernel, _fused_tuned, dkdv_grid, (*dkdv_numbers, slh, rows, *tune),
                               dict(dkdv_consts, FUSED_DQ=True, DQ_TMA=not _interpreting()),
                               (q.dtype, do.dtype, dk.dtype), (*dkdv_varying, len(dkdv_numbers) + 1) if varlen else ())
        return plan
    o_arg = o if compute_delta else dq  # any pointer when unused
    dq_numbers = (*common, *_strides(dq, varlen), *_strides(o_arg, varlen), slb)
    plan.dq = _JitLaunch("dq", _bwd_dq_kernel, _dq_tuned, lambda m: (cdiv(max_q, m["BLOCK_M"]), batch * nheads),
                         (*dq_numbers, slh, *tune), dict(consts, REVERSE=causal, COMPUTE_DELTA=compute_delta),
                         (q.dtype, do.dtype, dq.dtype), (len(dq_numbers),) if varlen else ())
    plan.dkdv = _JitLaunch("dkdv", _bwd_dkdv_kernel, _dkdv_tuned, dkdv_grid, (*dkdv_numbers, slh, 0, *tune),
                           dkdv_consts, (q.dtype, do.dtype, dk.dtype), dkdv_varying)
    return plan


# The fused backward: the dK/dV kernel also adds dQ (atomically, through Hopper's TMA reduce), so no dQ kernel
# runs and the dropout mask is drawn once per tile pair instead of twice. Without dropout it is slower (the
# prototype, results/attention/tma_dq/README.md), hence dropout only. dQ's summation order then varies from run to
# run, so torch.use_deterministic_algorithms(True) keeps the two kernels. Measured as integrated, on the H100
# (results/attention/fused_bwd/README.md): 1.12x the two-kernel backward at head dim 16 (Path-X's shape), 1.07x
# at 32, but 0.92x / 0.97x at 64 (GPT-2's / BERT's shapes). So by default ("auto") it runs for head dims up to
# 32; FLASH_FUSED_DROPOUT_BWD=1 takes it to 64, =0 turns it off.
def _fused_max_head_dim(setting: str) -> int:
    """FLASH_FUSED_DROPOUT_BWD's value -> the largest (padded) head dim that takes the fused backward."""
    limits = {"0": 0, "auto": 32, "1": 64}
    if setting not in limits:
        raise ValueError(f"FLASH_FUSED_DROPOUT_BWD={setting!r}: expected one of {sorted(limits)}")
    return limits[setting]


FUSED_DROPOUT_BWD_MAX_D = _fused_max_head_dim(os.environ.get("FLASH_FUSED_DROPOUT_BWD", "auto"))


def _fused_bwd(q, dropout_p: float, block_d: int) -> bool:
    if dropout_p == 0 or block_d > FUSED_DROPOUT_BWD_MAX_D or torch.are_deterministic_algorithms_enabled():
        return False
    return _interpreting() or (q.is_cuda and _is_sm90(q.device.index))


# ---------------------------------------------------------------------------------------------------
# The operators torch.compile sees (kernels/ops.py): opaque, with fake (shape-only) implementations, so compiled
# models keep one graph and Dynamo never enters the launchers or the autotuner. The autograd Functions below call
# them through `ops.define`'s callers: the launchers in eager mode, the operators while Dynamo traces.
# ---------------------------------------------------------------------------------------------------


def _op_fwd(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p):
    """(out, base-2 LSE, dropout seed). An operator's outputs may not alias each other, so without dropout the seed
    is a fresh zero tensor rather than a placeholder pointer."""
    o, lse, seed = _flash_fwd(q, k, v, softmax_scale, causal, dropout_p, cu_q is not None, cu_q, cu_k, max_q, max_k)
    if dropout_p == 0:
        seed = torch.zeros(1, dtype=torch.int64, device=q.device)
    return o, lse, seed


def _fwd_fake(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p):
    return (q.new_empty(q.shape), q.new_empty(lse_shape(q, cu_q is not None), dtype=torch.float32),
            q.new_empty((1,), dtype=torch.int64))


def _op_bwd(do, q, k, v, o, lse, seed, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p):
    return _flash_bwd(do, q, k, v, o, lse, seed, softmax_scale, causal, dropout_p, cu_q is not None, cu_q, cu_k,
                      max_q, max_k)


def _bwd_fake(do, q, k, v, o, lse, seed, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_fwd_op = ops.define("fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_q, Tensor? cu_k, SymInt max_q, SymInt max_k, "
                     "float softmax_scale, bool causal, float dropout_p) -> (Tensor, Tensor, Tensor)",
                     _op_fwd, _fwd_fake)
_bwd_op = ops.define("bwd(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor seed, Tensor? cu_q, "
                     "Tensor? cu_k, SymInt max_q, SymInt max_k, float softmax_scale, bool causal, float dropout_p) "
                     "-> (Tensor, Tensor, Tensor)", _op_bwd, _bwd_fake)


# Self-attention on a fused projection's output, qkv (..., 3, nheads, headdim), as its own pair of operators: the
# backward writes dQ, dK, dV into one gradient shaped like qkv. Through the unpacked ones, the compiled backward
# stacks three separate gradients into it (a copy of the projection output per layer).
def _op_fwd_qkv(qkv, cu, max_s, softmax_scale, causal, dropout_p):
    q, k, v = qkv.unbind(dim=-3)
    return _op_fwd(q, k, v, cu, cu, max_s, max_s, softmax_scale, causal, dropout_p)


def _fwd_qkv_fake(qkv, cu, max_s, softmax_scale, causal, dropout_p):
    q = qkv.select(-3, 0)
    return (q.new_empty(q.shape), q.new_empty(lse_shape(q, cu is not None), dtype=torch.float32),
            q.new_empty((1,), dtype=torch.int64))


def _bwd_packed(do, qkv, o, lse, seed, cu, max_s, softmax_scale, causal, dropout_p):
    """dQ, dK, dV written into one gradient shaped like qkv."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    q, k, v = qkv.unbind(dim=-3)
    _flash_bwd(do, q, k, v, o, lse, seed, softmax_scale, causal, dropout_p, cu is not None, cu, cu, max_s, max_s,
               out=dqkv.unbind(dim=-3))
    return dqkv


def _bwd_qkv_fake(do, qkv, o, lse, seed, cu, max_s, softmax_scale, causal, dropout_p):
    return qkv.new_empty(qkv.shape)


_fwd_qkv_op = ops.define("fwd_qkvpacked(Tensor qkv, Tensor? cu, SymInt max_s, float softmax_scale, bool causal, "
                         "float dropout_p) -> (Tensor, Tensor, Tensor)", _op_fwd_qkv, _fwd_qkv_fake)
_bwd_qkv_op = ops.define("bwd_qkvpacked(Tensor do, Tensor qkv, Tensor o, Tensor lse, Tensor seed, Tensor? cu, "
                         "SymInt max_s, float softmax_scale, bool causal, float dropout_p) -> Tensor",
                         _bwd_packed, _bwd_qkv_fake)


class _Flash(torch.autograd.Function):
    """Attention of q, k, v: the kernels' launchers in eager mode, the operators under torch.compile."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p):
        if torch.compiler.is_compiling():
            o, lse, seed = _fwd_op(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, dropout_p)
        else:  # the launcher itself: without dropout, no zero seed to allocate (the operator's outputs may not alias)
            o, lse, seed = _flash_fwd(q, k, v, softmax_scale, causal, dropout_p, cu_q is not None, cu_q, cu_k, max_q,
                                      max_k)
        ctx.save_for_backward(q, k, v, o, lse, seed, cu_q, cu_k)
        ctx.args = (max_q, max_k, softmax_scale, causal, dropout_p)
        ctx.mark_non_differentiable(lse)
        # dlse reaches backward as None instead of a zeros tensor autograd would allocate and fill each step (a
        # launch at every layer); do is never None there, since lse cannot carry a gradient
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, seed, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _bwd_op(do, q, k, v, o, lse, seed, cu_q, cu_k, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None


class _FlashQKV(torch.autograd.Function):
    """Self-attention on the fused projection's output, qkv (..., 3, nheads, headdim): the backward writes
    dQ, dK, dV into one (..., 3, nheads, headdim) gradient, so autograd never stacks three separate ones
    (a copy of the whole projection output per layer, which the unbound q, k, v would cost)."""

    @staticmethod
    def forward(ctx, qkv, cu, max_s, softmax_scale, causal, dropout_p):
        if torch.compiler.is_compiling():
            o, lse, seed = _fwd_qkv_op(qkv, cu, max_s, softmax_scale, causal, dropout_p)
        else:  # as in _Flash
            q, k, v = qkv.unbind(dim=-3)
            o, lse, seed = _flash_fwd(q, k, v, softmax_scale, causal, dropout_p, cu is not None, cu, cu, max_s, max_s)
        ctx.save_for_backward(qkv, o, lse, seed, cu)
        ctx.args = (max_s, softmax_scale, causal, dropout_p)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # as in _Flash
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        qkv, o, lse, seed, cu = ctx.saved_tensors
        return _bwd_qkv_op(do, qkv, o, lse, seed, cu, *ctx.args), None, None, None, None, None


def _softmax_scale(softmax_scale: float | None, headdim: int) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(headdim)


def _public_lse(lse2: torch.Tensor) -> torch.Tensor:
    return lse2 * LN2  # the kernels keep the log-sum-exp in base 2


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                    return_lse: bool = False):
    """Exact attention, fused. q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim).

    Returns (batch, seqlen_q, nheads, headdim) in q's dtype; with return_lse=True also the natural-log
    log-sum-exp of the scaled scores, (batch, nheads, seqlen_q) float32 (-inf for rows that see no key).
    causal is bottom-right aligned. softmax_scale defaults to 1/sqrt(headdim).
    """
    check_inputs(q, k, v, dropout_p=dropout_p)
    scale = _softmax_scale(softmax_scale, q.shape[-1])
    q, k, v = _lastdim_contig(q), _lastdim_contig(k), _lastdim_contig(v)
    out, lse = _Flash.apply(*ops.distinct(q, k, v), None, None, q.shape[1], k.shape[1], float(scale), bool(causal),
                            float(dropout_p))
    return (out, _public_lse(lse)) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False, return_lse: bool = False,
                           check_seqlens: bool = True):
    """Exact attention over packed sequences: q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim).

    cu_seqlens_q / cu_seqlens_k: int32 (batch + 1,) prefix sums of the sequence lengths; max_seqlen_*:
    the longest sequence (sizes the grid). With return_lse=True also returns lse (nheads, total_q) float32.
    check_seqlens=False skips the host-side check of cu_seqlens (a device sync per call), for callers
    that built them themselves (kernels.padding.PackedBatch, once per model forward).
    """
    check_inputs(q, k, v, varlen=True, cu_seqlens_q=cu_seqlens_q if check_seqlens else None,
                 cu_seqlens_k=cu_seqlens_k if check_seqlens else None, max_seqlen_q=max_seqlen_q,
                 max_seqlen_k=max_seqlen_k, dropout_p=dropout_p)
    scale = _softmax_scale(softmax_scale, q.shape[-1])
    q, k, v = _lastdim_contig(q), _lastdim_contig(k), _lastdim_contig(v)
    out, lse = _Flash.apply(*ops.distinct(q, k, v, cu_seqlens_q, cu_seqlens_k), int(max_seqlen_q), int(max_seqlen_k),
                            float(scale), bool(causal), float(dropout_p))
    return (out, _public_lse(lse)) if return_lse else out


def _check_qkv(qkv, varlen: bool):
    rank = 4 if varlen else 5
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != rank or qkv.shape[-3] != 3:
        layout = "(total, 3, nheads, headdim)" if varlen else "(batch, seqlen, 3, nheads, headdim)"
        raise ValueError(f"qkv must be {layout}, got {tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else qkv!r}")
    if qkv.stride(-1) != 1:
        raise ValueError("qkv's head dim must be contiguous (the view of a fused projection's output is)")


def flash_attn_qkvpacked_func(qkv, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False):
    """Self-attention on packed projections: qkv (batch, seqlen, 3, nheads, headdim) -> (batch, seqlen, nheads,
    headdim). The same result as flash_attn_func(*qkv.unbind(2)); its gradient is one tensor shaped like qkv."""
    _check_qkv(qkv, False)
    q, k, v = qkv.unbind(dim=2)
    check_inputs(q, k, v, dropout_p=dropout_p)
    scale = _softmax_scale(softmax_scale, qkv.shape[-1])
    out, _ = _FlashQKV.apply(qkv, None, qkv.shape[1], float(scale), bool(causal), float(dropout_p))
    return out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p: float = 0.0,
                                     softmax_scale: float | None = None, causal: bool = False,
                                     check_seqlens: bool = True):
    """flash_attn_varlen_func for self-attention on packed projections: qkv (total, 3, nheads, headdim) ->
    (total, nheads, headdim), its gradient one tensor shaped like qkv."""
    _check_qkv(qkv, True)
    q, k, v = qkv.unbind(dim=1)
    check_inputs(q, k, v, varlen=True, cu_seqlens_q=cu_seqlens if check_seqlens else None,
                 cu_seqlens_k=cu_seqlens if check_seqlens else None, max_seqlen_q=max_seqlen,
                 max_seqlen_k=max_seqlen, dropout_p=dropout_p)
    scale = _softmax_scale(softmax_scale, qkv.shape[-1])
    out, _ = _FlashQKV.apply(qkv, cu_seqlens, int(max_seqlen), float(scale), bool(causal), float(dropout_p))
    return out


# ---------------------------------------------------------------------------------------------------
# One block of a larger attention, for kernels/ring.py: no autograd (the ring has its own Function), the
# output and gradients stored in float32 so that partial results add up without a rounding per block,
# and the backward driven by the global (merged) LSE and delta rather than the block's own.
# ---------------------------------------------------------------------------------------------------


def flash_block_fwd(q, k, v, softmax_scale: float, causal: bool):
    """(out float32, natural-log LSE float32 (batch, nheads, seqlen_q)) of q against this key block alone.

    Inputs as for flash_attn_func (already checked by the caller; any strides with a contiguous head dim)."""
    o, lse, _ = _flash_fwd(q, k, v, softmax_scale, causal, 0.0, False, None, None, q.shape[1], k.shape[1],
                           out_dtype=torch.float32)
    return o, _public_lse(lse)


def flash_block_bwd(do, q, k, v, lse, delta, softmax_scale: float, causal: bool):
    """float32 (dq, dk, dv): this key block's share of the gradients of an attention whose softmax ran over
    more keys than these. lse: the natural-log LSE over all keys, delta = rowsum(dO * O) with the final O,
    both (batch, nheads, seqlen_q) float32. The probabilities exp(s - lse) are then the global ones, so the
    shares of all blocks sum to the full gradients (dq here is this block's term only)."""
    lse2 = (lse * LOG2E).contiguous()
    delta = delta.contiguous()  # the kernels index LSE and delta with one stride set
    dq, dk, dv = _flash_bwd(_lastdim_contig(do), q, k, v, None, lse2, lse2, softmax_scale, causal, 0.0, False, None,
                            None, q.shape[1], k.shape[1], delta=delta, grad_dtype=torch.float32)
    return dq, dk, dv


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "dropout_keep_mask", "draw_dropout_seed", "check_inputs",
           "bwd_preprocess"]
