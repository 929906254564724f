"""kernels/flash.py's dropout mask drawn inside Gluon kernels, in the layout of a wgmma accumulator.

The stream is `kernels.flash.dropout_keep`'s: Philox4x32-7 keyed on the seed, one call per (query pair r, r + 8;
key group c, c + 1, c + 8, c + 9), so a Gluon kernel and the `@triton.jit` kernels drop the same scores and
`attn=standard-matched` (models/attention.py) stays the reference for both. Gluon has no `tl.philox`, so `_philox`
writes its rounds out.

Why the layout matters: in a Hopper wgmma accumulator (m64nNk16, one warp per 16 rows) thread t of a warp holds
rows t / 4 and t / 4 + 8 and columns 2 (t % 4), + 1 of every 8-column group, which are exactly the eight scores of
one Philox call. `keep_rows` draws the calls on a (rows / 2, cols / 4) grid laid out so that each thread draws its
own, and the joins, reshapes and permute that spread each call's 8 results over the tile only rename registers: the
final convert_layout to the accumulator's layout moves no data (checked on sm_90 by
tests/test_gluon_dropout.py's compile test: no shared memory, no shuffles).

    keep_rows(seed, bh, row0, col0, thresh, layout)   # (64 x N) accumulator tile, queries as rows: the forward;
                                                      # the backward transposes it through shared memory
    dropout_keep_mask(seed, batch, nheads, seqlen)    # the whole mask through keep_rows (tests; reference:
                                                      # kernels.flash.dropout_keep_mask)
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels.flash import PHILOX_ROUNDS, _drop_consts

# tl.philox's 32-bit constants (triton/language/random.py), so that both draw the same stream
_KEY_A: gl.constexpr = gl.constexpr(0x9E3779B9)
_KEY_B: gl.constexpr = gl.constexpr(0xBB67AE85)
_ROUND_A: gl.constexpr = gl.constexpr(0xD2511F53)
_ROUND_B: gl.constexpr = gl.constexpr(0xCD9E8D57)


@gluon.jit
def _philox(seed, c0, c1, c2, c3, N_ROUNDS: gl.constexpr):
    """tl.philox(seed, c0, c1, c2, c3, N_ROUNDS) for int32 counters: four uint32 outputs."""
    seed = seed.to(gl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(gl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(gl.uint32)
    c0 = c0.to(gl.uint32, bitcast=True)
    c1 = c1.to(gl.uint32, bitcast=True)
    c2 = c2.to(gl.uint32, bitcast=True)
    c3 = c3.to(gl.uint32, bitcast=True)
    for _ in gl.static_range(N_ROUNDS):
        _c0, _c2 = c0, c2
        c0 = gl.umulhi(_ROUND_B, _c2) ^ c1 ^ k0
        c2 = gl.umulhi(_ROUND_A, _c0) ^ c3 ^ k1
        c1 = gl.mul(_ROUND_B, _c2, sanitize_overflow=False)
        c3 = gl.mul(_ROUND_A, _c0, sanitize_overflow=False)
        k0 = gl.add(k0, _KEY_A, sanitize_overflow=False)
        k1 = gl.add(k1, _KEY_B, sanitize_overflow=False)
    return c0, c1, c2, c3


@gluon.jit
def _halves(x, thresh):
    """int8 keep flags of a Philox output's low and high 16-bit halves, joined on a new last axis."""
    lo = ((x & 0xFFFF).to(gl.int32) >= thresh).to(gl.int8)
    hi = ((x >> 16).to(gl.int32) >= thresh).to(gl.int8)
    return gl.join(lo, hi)


@gluon.constexpr_function
def _call_layout(warps):
    """The (rows / 2, cols / 4) grid of Philox calls for an accumulator with one warp per 16 rows: call (pair p,
    group G) on warp p // 8, lane 4 (p % 8) + G % 4, the groups G, G + 4, ... in that thread's registers."""
    return gl.BlockedLayout([1, 1], [8, 4], [warps, 1], [1, 0])


@gluon.jit
def keep_rows(seed, bh, row0, col0, thresh, layout: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr,
              WARPS: gl.constexpr):
    """The (ROWS, COLS) tile of kernels.flash.dropout_keep for queries row0 .. + ROWS - 1 and keys col0 .. + COLS - 1
    of (batch x head) bh, bool in `layout`: a wgmma accumulator with one warp per 16 rows (ROWS == 16 WARPS).
    row0 and col0 are multiples of 16; seed is the int64 from the seed tensor; thresh = round(p * 2^16)."""
    gl.static_assert(ROWS == 16 * WARPS and COLS % 16 == 0, "keep_rows: one warp per 16 rows, 16-column groups")
    calls: gl.constexpr = _call_layout(WARPS)
    pair = row0 // 2 + gl.arange(0, ROWS // 2, layout=gl.SliceLayout(1, calls))   # 8 (row // 16) + row % 8
    group = col0 // 4 + gl.arange(0, COLS // 4, layout=gl.SliceLayout(0, calls))  # 4 (col // 16) + (col % 8) // 2
    c0 = group[None, :] + pair[:, None] * 0
    c1 = pair[:, None] + group[None, :] * 0
    zero = c0 * 0
    x0, x1, x2, x3 = _philox(seed, c0, c1, zero + bh, zero, PHILOX_ROUNDS)
    # output x_(2 rb + j), half b of call (pair = 8 a + i, group = 4 h + q) is score (16 a + 8 rb + i,
    # 16 h + 8 j + 2 q + b): the same assembly as kernels.flash.dropout_keep_tile's
    k = gl.join(gl.join(_halves(x0, thresh), _halves(x2, thresh)), gl.join(_halves(x1, thresh), _halves(x3, thresh)))
    k = gl.reshape(k, (ROWS // 16, 8, COLS // 16, 4, 2, 2, 2))  # (a, i, h, q, b, rb, j)
    k = gl.permute(k, (0, 5, 1, 2, 6, 3, 4))                    # (a, rb, i, h, j, q, b)
    return gl.convert_layout(gl.reshape(k, (ROWS, COLS)), layout) != 0


@gluon.constexpr_function
def acc_layout(warps, n):
    """A wgmma accumulator's layout, one warp per 16 rows (kernels/flash_gluon.py's score and output tiles, and the
    layout keep_rows draws in). Partitions build their own: layouts do not pass through warp_specialize's
    arguments."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _keep_rows_kernel(OUT, SEED, seqlen, thresh, ROWS: gl.constexpr, COLS: gl.constexpr):
    """OUT[bh, rows, cols] = keep_rows of tile (program 0, program 1) of (batch x head) program 2, int8."""
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = acc_layout(WARPS, COLS)
    row0 = gl.program_id(0) * ROWS
    col0 = gl.program_id(1) * COLS
    bh = gl.program_id(2)
    keep = keep_rows(gl.load(SEED), bh, row0, col0, thresh, layout, ROWS, COLS, WARPS)
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    offs = bh.to(gl.int64) * seqlen * seqlen + rows[:, None] * seqlen + cols[None, :]
    gl.store(OUT + offs, keep.to(gl.int8))


def dropout_keep_mask(seed: torch.Tensor, batch: int, nheads: int, seqlen: int, dropout_p: float,
                      rows: int = 64, cols: int = 128) -> torch.Tensor:
    """The keep-mask that keep_rows draws, bool (batch, nheads, seqlen, seqlen), tiles of rows x cols (one warp per
    16 rows). Equal to kernels.flash.dropout_keep_mask's for the same seed (tests/test_gluon_dropout.py)."""
    if seed.dtype != torch.int64 or seed.numel() != 1 or not seed.is_cuda:
        raise ValueError("dropout_keep_mask: seed must be one int64 on the GPU (kernels.flash.draw_dropout_seed)")
    if rows % 16 or cols % 16 or seqlen % rows or seqlen % cols:
        raise ValueError(f"dropout_keep_mask: seqlen {seqlen} must be a multiple of the {rows} x {cols} tile, "
                         "both multiples of 16")
    thresh, _ = _drop_consts(dropout_p)
    out = torch.empty(batch * nheads, seqlen, seqlen, dtype=torch.int8, device=seed.device)
    _keep_rows_kernel[(seqlen // rows, seqlen // cols, batch * nheads)](out, seed, seqlen, thresh, ROWS=rows,
                                                                        COLS=cols, num_warps=rows // 16)
    return out.view(batch, nheads, seqlen, seqlen).bool()
