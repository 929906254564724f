"""Prototype (session 23): the backward in Gluon, in one kernel with five matmuls per
tile pair, as FlashAttention-2/3 and cuDNN do it. Our shipped backward runs two kernels (dK/dV, then dQ) and seven
matmuls per pair; it is 0.65-0.80x cuDNN's at head dim 128 (results/attention/h100.md), the larger part of the gap.

One program per key tile (BLOCK_N = 128 keys, two warpgroups of 64 keys each; 8 warps), looping over query tiles
of BLOCK_M = 64 whose Q and dO arrive by TMA into a STAGES-deep ring. Per query tile i, with scores kept
transposed (keys down, queries across) so that P^T and dS^T are already the register operands dV and dK need:

    S^T = K Q_i^T, dP^T = V dO_i^T                      (two async wgmma, issued together)
    P^T = exp2(S^T * scale * log2 e - LSE_i)            (LSE base 2, as kernels/flash.py's forward writes it)
    dV += P^T dO_i                                      (async; P^T from registers)
    dS^T = P^T * (dP^T - delta_i)                       (delta = rowsum(dO * O), kernels.flash.bwd_preprocess)
    dK += dS^T Q_i                                      (async; dS^T from registers)
    dQ_i += dS K                                        (dS^T through shared memory, read transposed; then added
                                                         to a float32 dQ buffer with atomics)

then dK (times the softmax scale) and dV out by TMA, and dQ = scale * buffer in one elementwise pass.

Measured on the H100 (session 24, README.md): correct, 0.64-0.89x our backward. Two variants, compiled in session 24
and run in session 25: ws keeps that loop body on 8 compute warps and gives the loads to a loader warp and the dQ
reduce (TMA, from a shared-memory ring) to a dQ warp, as FlashAttention-3's backward divides the work: 1.24-1.39x our
backward at head dim 128, shipped as kernels/flash_gluon.py's `_bwd_kernel`, which "ws" now runs; pp
(`_attn_bwd_pp`) also lets the two compute warpgroups work apart (each its own 64 keys and dQ partial), so one's
softmax overlaps the other's matmuls: 1.06-1.19x, behind ws.

    python results/attention/gluon_bwd/gluon_bwd.py ab         # GPU: the shipped backward in kernels/flash.py vs
                                                                 # its @triton.jit one and cuDNN, 512 to 16K tokens

Scope: dense self-attention, (batch, seqlen, heads, head_dim) contiguous bf16, head dim 64 or 128, seqlen a multiple
of 128, causal or not, no dropout. dQ's summation order varies from run to run (atomics, or TMA reduces).

    python results/attention/gluon_bwd/gluon_bwd.py compile    # CPU: compiles for sm_90, registers / spills / smem
    python results/attention/gluon_bwd/gluon_bwd.py check [one ws pp]  # GPU: gradients against float64 and ours
    python results/attention/gluon_bwd/gluon_bwd.py bench [one ws pp]  # GPU: backward ms against ours and cuDNN
"""
import math
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "results/attention/gluon_fwd")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton._C.libtriton import ir  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language import _core  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from gluon_fwd import head_tiles  # noqa: E402

LOG2E = 1.4426950408889634


@_core.builtin
def tma_reduce_add(desc, coord, value, _semantic=None):
    """desc[coord block] += value through the TMA unit (cp.reduce.async.bulk.tensor .add): Gluon 3.6's hopper.tma has
    no reduce, but the tensor-descriptor reduce op of `tl` lowers through the same passes (the value is staged in
    shared memory, then one bulk reduce per block). One instruction stream per tile instead of a float32 atomic, and
    its 64-bit address, per element per thread."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    return _semantic.builder.create_descriptor_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, value.handle, coord)



@gluon.jit
def _load_qdo(q_desc, do_desc, q_smem, do_smem, bars, tile, slot, row0, col, n_end,
              BLOCK_M: gl.constexpr, TILE_BYTES: gl.constexpr):
    pred = tile < n_end
    mbarrier.expect(bars.index(slot), 2 * TILE_BYTES, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [row0 + tile * BLOCK_M, col], bars.index(slot), q_smem.index(slot),
                                    pred=pred)
    tma.async_copy_global_to_shared(do_desc, [row0 + tile * BLOCK_M, col], bars.index(slot), do_smem.index(slot),
                                    pred=pred)


@gluon.jit
def _bwd_tile(k_smem, v_smem, q_s, do_s, ds_smem, LSE, DELTA, stat_base, lse_s, delta_s, i, start_n, keys, qcols,
              st_init, dq_init, dv, dk, qk_scale, op_layout: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, DQ_T: gl.constexpr, STATS_SMEM: gl.constexpr):
    """One query tile i against this program's keys: the five wgmma and the softmax between them. Returns dV and dK
    accumulated, and this tile's dQ (dQ^T when DQ_T), all waited for. The tile's LSE and delta come from global
    memory, or with STATS_SMEM from the shared tiles lse_s, delta_s that the loader warp filled."""
    dtype: gl.constexpr = q_s.dtype
    st_tok = warpgroup_mma(k_smem, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    dpt_tok = warpgroup_mma(v_smem, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    queries = i * BLOCK_M + qcols
    if STATS_SMEM:  # (1, BLOCK_M) tiles, read straight into the scores' layout
        lse = lse_s.load(st_init.type.layout)
        delta = delta_s.load(st_init.type.layout)
    else:
        lse = gl.load(LSE + stat_base + queries)[None, :]
        delta = gl.load(DELTA + stat_base + queries)[None, :]
    st = warpgroup_mma_wait(1, (st_tok,))
    pt = gl.exp2(st * qk_scale - lse)
    if IS_CAUSAL:  # only the tiles on the diagonal have keys after some of their queries
        if i * BLOCK_M < start_n + BLOCK_N:
            pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
    dv_tok = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_s, dv, is_async=True)
    dpt = warpgroup_mma_wait(1, (dpt_tok,))  # dP^T was issued before dV, so it is the one done
    dst = (pt * (dpt - delta)).to(dtype)
    dk_tok = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
    ds_smem.store(dst)
    fence_async_shared()
    if DQ_T:
        dq_tok = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, dq_init, use_acc=False, is_async=True)
    else:
        dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_init, use_acc=False, is_async=True)
    dv, dk, dq = warpgroup_mma_wait(0, (dv_tok, dk_tok, dq_tok))
    return dv, dk, dq


@gluon.jit
def _store_dkdv(dk, dv, sm_scale, k_smem, v_smem, dk_desc, dv_desc, row, col):
    """dK (times the softmax scale) and dV out by TMA through the K and V tiles, which are no longer read."""
    k_smem.store((dk * sm_scale).to(k_smem.dtype))
    v_smem.store(dv.to(v_smem.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [row, col], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [row, col], v_smem)
    tma.store_wait(0)


@gluon.jit
def _bwd_descriptors(Q, K, V, DO, DK, DV, DQA, total_rows, nheads, BLOCK_M: gl.constexpr, KV_ROWS: gl.constexpr,
                     HEAD_DIM: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr,
                     dqa_layout: gl.constexpr):
    """The backward kernels' TMA descriptors: Q, dO in tiles of BLOCK_M queries, K, V, dK, dV of KV_ROWS keys, the
    float32 dQ buffer of BLOCK_M queries."""
    return (head_tiles(Q, total_rows, nheads, BLOCK_M, HEAD_DIM, q_layout),
            head_tiles(DO, total_rows, nheads, BLOCK_M, HEAD_DIM, q_layout),
            head_tiles(K, total_rows, nheads, KV_ROWS, HEAD_DIM, kv_layout),
            head_tiles(V, total_rows, nheads, KV_ROWS, HEAD_DIM, kv_layout),
            head_tiles(DK, total_rows, nheads, KV_ROWS, HEAD_DIM, kv_layout),
            head_tiles(DV, total_rows, nheads, KV_ROWS, HEAD_DIM, kv_layout),
            head_tiles(DQA, total_rows, nheads, BLOCK_M, HEAD_DIM, dqa_layout))


@gluon.jit
def _attn_bwd(Q, K, V, DO, DK, DV, DQA, LSE, DELTA, total_rows, seqlen, nheads, qk_scale, sm_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              IS_CAUSAL: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr, ds_layout: gl.constexpr,
              st_layout: gl.constexpr, kv_acc_layout: gl.constexpr, op_layout: gl.constexpr,
              dq_layout: gl.constexpr, DQ_T: gl.constexpr, DQ_TMA: gl.constexpr, dqa_layout: gl.constexpr):
    # DQ_T: query tiles narrower than a wgmma's 64 rows compute dQ^T = K^T dS^T (head_dim rows) instead of dS K
    dtype: gl.constexpr = Q.dtype.element_ty
    TILE_BYTES: gl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    KV_BYTES: gl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    width = nheads * HEAD_DIM
    col = h * HEAD_DIM
    row0 = b * seqlen
    start_n = pid_n * BLOCK_N
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc = _bwd_descriptors(
        Q, K, V, DO, DK, DV, DQA, total_rows, nheads, BLOCK_M, BLOCK_N, HEAD_DIM, q_layout, kv_layout, dqa_layout)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()

    # query tiles that see any of these keys: with the causal mask, from the one holding query start_n on
    lo = start_n // BLOCK_M if IS_CAUSAL else 0
    n_end = seqlen // BLOCK_M
    mbarrier.expect(kv_bar, 2 * KV_BYTES)
    tma.async_copy_global_to_shared(k_desc, [row0 + start_n, col], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [row0 + start_n, col], kv_bar, v_smem)
    for s in gl.static_range(STAGES):
        _load_qdo(q_desc, do_desc, q_smem, do_smem, bars, lo + s, s, row0, col, n_end, BLOCK_M, TILE_BYTES)

    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    if DQ_T:  # dQ^T tile: head_dim down, queries across
        dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, dq_layout))
        dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, dq_layout))
    else:
        dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
        dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    stat_base = bh.to(gl.int64) * seqlen
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    if DQ_T:
        dq_init = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, layout=dq_layout)
    else:
        dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    mbarrier.wait(kv_bar, 0)

    for i in range(lo, n_end):
        t = i - lo
        slot = t % STAGES
        mbarrier.wait(bars.index(slot), (t // STAGES) & 1)
        dv, dk, dq = _bwd_tile(k_smem, v_smem, q_smem.index(slot), do_smem.index(slot), ds_smem, LSE, DELTA, stat_base,
                               0, 0, i, start_n, keys, qcols, st_init, dq_init, dv, dk, qk_scale, op_layout, BLOCK_M,
                               BLOCK_N, IS_CAUSAL, DQ_T, False)
        _load_qdo(q_desc, do_desc, q_smem, do_smem, bars, i + STAGES, slot, row0, col, n_end, BLOCK_M, TILE_BYTES)
        if DQ_TMA:
            if DQ_T:
                tma_reduce_add(dqa_desc, [row0 + i * BLOCK_M, col], gl.permute(dq, [1, 0]))
            else:
                tma_reduce_add(dqa_desc, [row0 + i * BLOCK_M, col], dq)
        else:
            if DQ_T:
                dq_ptrs = (DQA + ((row0 + i * BLOCK_M + dq_rows[None, :]).to(gl.int64) * width + col)
                           + dq_cols[:, None])
            else:
                dq_ptrs = (DQA + ((row0 + i * BLOCK_M + dq_rows[:, None]).to(gl.int64) * width + col)
                           + dq_cols[None, :])
            gl.atomic_add(dq_ptrs, dq, sem="relaxed")

    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    _store_dkdv(dk, dv, sm_scale, k_smem, v_smem, dk_desc, dv_desc, row0 + start_n, col)


# ---- Variant WS (session 24; measured in session 25, shipped): FlashAttention-3's division of labour, a loader warp
# and a dQ writer warp beside the 8 compute warps. It is now kernels/flash_gluon.py's `_bwd_kernel` (with row strides
# for packed qkv views), which "ws" runs; session 25's sweep of three configs ran this file's own copy at f6fbeb9.
from kernels.flash_gluon import _acc_layout, _fill_qdo_ring, tma_reduce_add_shared  # noqa: E402
from kernels.flash_gluon import gluon_backward as shipped_backward  # noqa: E402


@gluon.constexpr_function
def _op_layout(warps, n):
    return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(warps, n), k_width=2)


@gluon.constexpr_function
def _dq_layout(warps, head_dim, block_m):
    if block_m < 64:  # dQ^T (head_dim x block_m), one warp per 16 rows
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, block_m, 16])
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, warps // 4],
                                     instr_shape=[16, head_dim // (warps // 4), 16])


# ---- Variant PP (session 24, compiled, not yet run): the two compute warpgroups work apart, as the forward's ws
# kernel's consumers do. In `_attn_bwd` and `_attn_bwd_ws` the 8 compute warps share each dS^T tile through shared
# memory for dQ, so they move in lockstep and the tensor cores idle while both do their softmax. Here warpgroup w
# owns keys start_n + 64w .. +63 alone: its K, V halves, dK, dV, dS^T, and a dQ^T partial over its 64 keys, which it
# leaves in its own dQ ring for the dQ warp (two TMA reduces per query tile instead of one). No barrier joins the
# two, so one's exponentials run while the other's wgmma do. They share the Q / dO ring (a slot is freed by both:
# count 2) and the loader's LSE and delta. 32-query steps only: 64 would need a 64-register dQ partial beside dK, dV.
SUB_N = gl.constexpr(64)


@gluon.jit
def _pp_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, LSE, DELTA,
               lse_smem, delta_smem, stat_base, row0, col, start_n, lo, n_end, BLOCK_M: gl.constexpr,
               STAGES: gl.constexpr):
    HALF_BYTES: gl.constexpr = k_smem.shape[1] * k_smem.shape[2] * k_smem.dtype.primitive_bitwidth // 8
    mbarrier.expect(kv_bar, 4 * HALF_BYTES)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [row0 + start_n + w * SUB_N, col], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(v_desc, [row0 + start_n + w * SUB_N, col], kv_bar, v_smem.index(w))
    _fill_qdo_ring(q_desc, do_desc, q_smem, do_smem, ready, empty, LSE, DELTA, lse_smem, delta_smem, stat_base, row0,
                   col, lo, n_end, BLOCK_M, STAGES)


@gluon.jit
def _pp_dq_writer(dqa_desc, dq_smem, dq_full, dq_empty, row0, col, lo, n_end, BLOCK_M: gl.constexpr,
                  DQ_STAGES: gl.constexpr):
    for i in range(lo, n_end):
        t = i - lo
        s = t % DQ_STAGES
        for w in gl.static_range(2):  # the two warpgroups' partials, in a fixed order
            mbarrier.wait(dq_full.index(w * DQ_STAGES + s), (t // DQ_STAGES) & 1)
            tma_reduce_add_shared(dqa_desc, [row0 + i * BLOCK_M, col], dq_smem.index(w * DQ_STAGES + s))
        tma.store_wait(0)
        for w in gl.static_range(2):
            mbarrier.arrive(dq_empty.index(w * DQ_STAGES + s))


@gluon.jit
def _pp_compute(W: gl.constexpr, LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem,
                lse_smem, delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo,
                n_end, qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    st_layout: gl.constexpr = _acc_layout(4, BLOCK_M)
    kv_acc_layout: gl.constexpr = _acc_layout(4, HEAD_DIM)
    op_layout: gl.constexpr = _op_layout(4, HEAD_DIM)
    dq_layout: gl.constexpr = _dq_layout(4, HEAD_DIM, BLOCK_M)
    k_w = k_smem.index(W)
    v_w = v_smem.index(W)
    ds_w = ds_smem.index(W)
    start_w = start_n + W * SUB_N
    keys = start_w + gl.arange(0, SUB_N, layout=gl.SliceLayout(1, st_layout))
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    dk = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
    dv = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
    st_init = gl.zeros([SUB_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, layout=dq_layout)
    mbarrier.wait(kv_bar, 0)
    lo_w = start_w // BLOCK_M if IS_CAUSAL else lo  # this half's first query tile (causal: later than the program's)
    for i in range(lo, n_end):
        t = i - lo
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        if i >= lo_w:  # the warpgroup's keys are all after tile i's queries otherwise: nothing to add
            dv, dk, dqt = _bwd_tile(k_w, v_w, q_smem.index(slot), do_smem.index(slot), ds_w, LSE, DELTA, stat_base,
                                    lse_smem.index(slot), delta_smem.index(slot), i, start_w, keys, qcols, st_init,
                                    dq_init, dv, dk, qk_scale, op_layout, BLOCK_M, SUB_N, IS_CAUSAL, True, True)
        else:
            dqt = dq_init
        mbarrier.arrive(empty.index(slot))  # count 2: the slot is refilled once both warpgroups are done with it
        s = W * DQ_STAGES + t % DQ_STAGES
        mbarrier.wait(dq_empty.index(s), ((t // DQ_STAGES) & 1) ^ 1)
        dq_smem.index(s).store(gl.permute(dqt, [1, 0]))
        fence_async_shared()
        mbarrier.arrive(dq_full.index(s))

    _store_dkdv(dk, dv, sm_scale, k_w, v_w, dk_desc, dv_desc, row0 + start_w, col)  # its own K and V halves


@gluon.jit
def _pp_compute0(LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                 delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo, n_end,
                 qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                 DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    _pp_compute(0, LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo, n_end,
                qk_scale, sm_scale, HEAD_DIM, BLOCK_M, STAGES, DQ_STAGES, IS_CAUSAL)


@gluon.jit
def _pp_compute1(LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                 delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo, n_end,
                 qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                 DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    _pp_compute(1, LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo, n_end,
                qk_scale, sm_scale, HEAD_DIM, BLOCK_M, STAGES, DQ_STAGES, IS_CAUSAL)


@gluon.jit
def _attn_bwd_pp(Q, K, V, DO, DK, DV, DQA, LSE, DELTA, total_rows, seqlen, nheads, qk_scale, sm_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr,
                 ds_layout: gl.constexpr, dqa_layout: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    dtype: gl.constexpr = Q.dtype.element_ty
    gl.static_assert(BLOCK_N == 2 * SUB_N, "two warpgroups of 64 keys")
    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    col = h * HEAD_DIM
    row0 = b * seqlen
    start_n = pid_n * BLOCK_N
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc = _bwd_descriptors(
        Q, K, V, DO, DK, DV, DQA, total_rows, nheads, BLOCK_M, SUB_N, HEAD_DIM, q_layout, kv_layout, dqa_layout)

    k_smem = gl.allocate_shared_memory(dtype, [2, SUB_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, SUB_N, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, SUB_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2 * DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2 * DQ_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2 * DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()

    lo = start_n // BLOCK_M if IS_CAUSAL else 0
    n_end = seqlen // BLOCK_M
    stat_base = bh.to(gl.int64) * seqlen
    gl.warp_specialize([
        (_pp_compute0, (LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                        delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo, n_end,
                        qk_scale, sm_scale, HEAD_DIM, BLOCK_M, STAGES, DQ_STAGES, IS_CAUSAL)),
        (_pp_compute1, (LSE, DELTA, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                        delta_smem, kv_bar, ready, empty, dq_full, dq_empty, stat_base, row0, col, start_n, lo, n_end,
                        qk_scale, sm_scale, HEAD_DIM, BLOCK_M, STAGES, DQ_STAGES, IS_CAUSAL)),
        (_pp_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, LSE,
                      DELTA, lse_smem, delta_smem, stat_base, row0, col, start_n, lo, n_end, BLOCK_M, STAGES)),
        (_pp_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, row0, col, lo, n_end, BLOCK_M, DQ_STAGES))],
        [4, 1, 1], [CONSUMER_REGS, 24, 24])


BLOCK_N, WARPS = 128, 8
# (BLOCK_M queries per step, STAGES of the Q / dO ring, dQ through the TMA reduce rather than atomics)
CONFIGS = [(64, 2, False), (64, 2, True), (32, 3, False), (32, 3, True)]


def layouts(head_dim: int, block_m: int, dq_tma: bool = False, dtype=gl.bfloat16) -> dict:
    """Shared layouts (TMA tiles; dS^T, read transposed by the dQ wgmma) and the wgmma accumulators': S^T / dP^T
    (BLOCK_N x block_m) and dK / dV (BLOCK_N x head_dim) one warp per 16 keys; dQ (block_m x head_dim) with the two
    warpgroups side by side along head_dim, or for block_m < 64 dQ^T (head_dim x block_m), one warp per 16 rows."""
    kv_acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, head_dim, 16])
    dq_t = block_m < 64
    return dict(
        q_layout=gl.NVMMASharedLayout.get_default_for([block_m, head_dim], dtype),
        kv_layout=gl.NVMMASharedLayout.get_default_for([BLOCK_N, head_dim], dtype),
        ds_layout=gl.NVMMASharedLayout.get_default_for([BLOCK_N, block_m], dtype),
        st_layout=gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, block_m, 16]),
        kv_acc_layout=kv_acc,
        op_layout=gl.DotOperandLayout(operand_index=0, parent=kv_acc, k_width=2),
        dq_layout=(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, block_m, 16])
                   if dq_t else
                   gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WARPS // 4],
                                             instr_shape=[16, head_dim // (WARPS // 4), 16])),
        DQ_T=dq_t, DQ_TMA=dq_tma,
        dqa_layout=gl.NVMMASharedLayout.get_default_for([block_m, head_dim], gl.float32))


def gluon_backward(do, q, k, v, o, lse2, causal: bool, config=CONFIGS[0]):
    """(dq, dk, dv) for q, k, v (batch, seqlen, heads, head_dim) bf16; lse2: the forward's base-2 log-sum-exp,
    (batch, heads, seqlen) contiguous."""
    import kernels.flash as F

    block_m, stages, dq_tma = config
    batch, seqlen, nheads, head_dim = q.shape
    if head_dim not in (64, 128) or seqlen % BLOCK_N or q.dtype != torch.bfloat16:
        raise ValueError(f"bf16, head dim 64 or 128, seqlen a multiple of {BLOCK_N}; got {q.shape} {q.dtype}")
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    F._ensure_tma_allocator()  # in-kernel TMA descriptors take global scratch
    delta = F.bwd_preprocess(o, do)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dqa = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(head_dim)
    _attn_bwd[(seqlen // BLOCK_N, batch * nheads)](
        q, k, v, do, dk, dv, dqa, lse2.contiguous(), delta, batch * seqlen, seqlen, nheads, scale * LOG2E, scale,
        head_dim, block_m, BLOCK_N, stages, causal, **layouts(head_dim, block_m, dq_tma), num_warps=WARPS)
    return (dqa * scale).to(q.dtype), dk, dv


# ws: (BLOCK_M queries per step, STAGES of the Q / dO ring, DQ_STAGES of the dQ ring, LSE and delta through shared
# memory by the loader warp rather than loaded by the compute warps); dQ always by the TMA reduce
WS_CONFIGS = [(64, 2, 2, True)]  # session 25 also ran (32, 3, 2, True) and (32, 3, 2, False): slower (README.md)
# pp: (BLOCK_M queries per step, STAGES of the Q / dO ring, DQ_STAGES of each warpgroup's dQ ring)
PP_CONFIGS = [(32, 3, 2), (16, 4, 2)]
ALL_CONFIGS = CONFIGS + [("ws", *c) for c in WS_CONFIGS] + [("pp", *c) for c in PP_CONFIGS]


def gluon_backward_ws(do, q, k, v, o, lse2, causal: bool, config=WS_CONFIGS[0]):
    """As gluon_backward, with the shipped warp-specialised kernel (kernels/flash_gluon.py), whose one config this is."""
    import kernels.flash as F

    if tuple(config) != WS_CONFIGS[0]:
        raise ValueError(f"the shipped kernel runs {WS_CONFIGS[0]} only")
    F._ensure_tma_allocator()
    delta = F.bwd_preprocess(o, do)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    shipped_backward(do, q, k, v, lse2.contiguous(), delta, dq, dk, dv, 1.0 / math.sqrt(q.shape[-1]), causal)
    return dq, dk, dv


def pp_layouts(head_dim: int, block_m: int, dtype=gl.bfloat16) -> dict:
    """The shared layouts `_attn_bwd_pp` takes: TMA tiles of block_m queries and of 64 keys, dS^T per warpgroup
    (64 keys x block_m), the float32 dQ tiles."""
    return dict(q_layout=gl.NVMMASharedLayout.get_default_for([block_m, head_dim], dtype),
                kv_layout=gl.NVMMASharedLayout.get_default_for([64, head_dim], dtype),
                ds_layout=gl.NVMMASharedLayout.get_default_for([64, block_m], dtype),
                dqa_layout=gl.NVMMASharedLayout.get_default_for([block_m, head_dim], gl.float32),
                CONSUMER_REGS=240)


def gluon_backward_pp(do, q, k, v, o, lse2, causal: bool, config=PP_CONFIGS[0]):
    """As gluon_backward, with the two compute warpgroups apart; config (BLOCK_M, STAGES, DQ_STAGES)."""
    import kernels.flash as F

    block_m, stages, dq_stages = config
    batch, seqlen, nheads, head_dim = q.shape
    if head_dim not in (64, 128) or seqlen % BLOCK_N or q.dtype != torch.bfloat16:
        raise ValueError(f"bf16, head dim 64 or 128, seqlen a multiple of {BLOCK_N}; got {q.shape} {q.dtype}")
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    F._ensure_tma_allocator()
    delta = F.bwd_preprocess(o, do)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dqa = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(head_dim)
    _attn_bwd_pp[(seqlen // BLOCK_N, batch * nheads)](
        q, k, v, do, dk, dv, dqa, lse2.contiguous(), delta, batch * seqlen, seqlen, nheads, scale * LOG2E, scale,
        head_dim, block_m, BLOCK_N, stages, dq_stages, causal, **pp_layouts(head_dim, block_m), num_warps=4)
    return (dqa * scale).to(q.dtype), dk, dv


def kind(cfg) -> str:
    """"one" (the one-partition kernel), "ws" or "pp"."""
    return cfg[0] if isinstance(cfg[0], str) else "one"


def run_config(do, q, k, v, o, lse2, causal, cfg):
    if cfg[0] == "ws":
        return gluon_backward_ws(do, q, k, v, o, lse2, causal, cfg[1:])
    if cfg[0] == "pp":
        return gluon_backward_pp(do, q, k, v, o, lse2, causal, cfg[1:])
    return gluon_backward(do, q, k, v, o, lse2, causal, cfg)


def compile_report():
    """sm_90 compile on the CPU (scripts/kernel_resources.py's `resources`): registers, spills and shared memory per
    config, head dim and causality."""
    sys.path.insert(0, "scripts")
    from kernel_resources import resources

    for head_dim in (64, 128):
        for causal in (False, True):
            for block_m, stages, dq_tma in CONFIGS:
                consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=BLOCK_N, STAGES=stages, IS_CAUSAL=causal,
                              **layouts(head_dim, block_m, dq_tma))
                r = resources(_attn_bwd, consts, WARPS, stages)
                print(f"hd {head_dim} causal {causal} (BLOCK_M {block_m}, BLOCK_N {BLOCK_N}, {WARPS} warps, stages "
                      f"{stages}, dQ {'TMA reduce' if dq_tma else 'atomics'}): regs {r['regs']}, spill stack "
                      f"{r['stack']} B, smem {r['smem']} B", flush=True)
            import kernels.flash_gluon as G  # the shipped ws kernel, with host-built descriptors
            from kernel_resources import tensordesc

            lay = G.bwd_layouts(head_dim, gl.bfloat16)
            bm, bn, bstages, dq_stages = G.BWD_TILES[head_dim]
            q_desc = tensordesc("bf16", [bm, head_dim], lay["q_layout"])
            kv_desc = tensordesc("bf16", [bn, head_dim], lay["kv_layout"])
            types = dict(q_desc=q_desc, do_desc=q_desc, k_desc=kv_desc, v_desc=kv_desc, dk_desc=kv_desc,
                         dv_desc=kv_desc, dqa_desc=tensordesc("fp32", [bm, head_dim], lay["dqa_layout"]))
            consts = dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, STAGES=bstages, DQ_STAGES=dq_stages,
                          IS_CAUSAL=causal, WARPS=G.BWD_WARPS, ds_layout=lay["ds_layout"])
            r = resources(G._bwd_kernel, consts, G.BWD_WARPS, bstages, types=types)
            print(f"hd {head_dim} causal {causal} ws (shipped: BLOCK_M {bm}, BLOCK_N {bn}, "
                  f"{G.BWD_WARPS} compute warps + loader + dQ writer, stages {bstages}, dQ stages "
                  f"{dq_stages}, LSE/delta by the loader): regs {r['regs']}, spill stack {r['stack']} B, smem "
                  f"{r['smem']} B", flush=True)
            for block_m, stages, dq_stages in PP_CONFIGS:
                consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=BLOCK_N, STAGES=stages, DQ_STAGES=dq_stages,
                              IS_CAUSAL=causal, **pp_layouts(head_dim, block_m))
                r = resources(_attn_bwd_pp, consts, 4, stages)
                print(f"hd {head_dim} causal {causal} pp (BLOCK_M {block_m}, two warpgroups of 64 keys apart + loader + "
                      f"dQ writer, stages {stages}, dQ stages {dq_stages}): regs {r['regs']}, spill stack "
                      f"{r['stack']} B, smem {r['smem']} B", flush=True)


def _inputs(batch, seqlen, nheads, head_dim, causal):
    import kernels.flash as F

    q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 1.0 / math.sqrt(head_dim)
    o, lse2, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, seqlen, seqlen)
    return q, k, v, do, o, lse2, seed, scale


def check(kinds=("one", "ws", "pp")):
    import kernels.flash as F
    from kernels.standard import standard_attention

    torch.manual_seed(0)
    failures = []
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in (128, 512, 1024):
                q, k, v, do, o, lse2, seed, scale = _inputs(2, seqlen, 4, head_dim, causal)
                ref_in = [x.double().requires_grad_() for x in (q, k, v)]
                ref = torch.autograd.grad(standard_attention(*ref_in, causal=causal), ref_in, do.double())
                ours = F._flash_bwd(do, q, k, v, o, lse2, seed, scale, causal, 0.0, False, None, None, seqlen, seqlen)
                for cfg in [c for c in ALL_CONFIGS if kind(c) in kinds]:
                    try:
                        got = run_config(do, q, k, v, o, lse2, causal, cfg)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 (say so, go on)
                        print(f"hd {head_dim} causal {causal} n {seqlen} (BLOCK_M, STAGES, DQ_TMA) {cfg}: WRONG, raised "
                              f"{type(e).__name__}: {str(e)[:300]}", flush=True)
                        if not failures:  # the first failure's whole traceback: a device call to debug it is costly
                            import traceback
                            traceback.print_exc()
                        failures.append(cfg)
                        continue
                    cells, ok = [], True
                    for name, g, base, r in zip(("dq", "dk", "dv"), got, ours, ref):
                        err = (g.double() - r).abs().max().item()
                        base_err = (base.double() - r).abs().max().item()
                        ok &= err <= 2 * base_err + 1e-3
                        cells.append(f"{name} {err:.1e} (ours {base_err:.1e})")
                    print(f"hd {head_dim} causal {causal} n {seqlen} (BLOCK_M, STAGES, DQ_TMA) {cfg}: {', '.join(cells)} "
                          f"{'ok' if ok else 'WRONG'}", flush=True)


def bench(kinds=("one", "ws", "pp")):
    from triton.testing import do_bench

    import kernels.flash as F

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    # six shapes, not twelve: our backward autotunes each new one (tens of seconds at head dim 128)
    for head_dim, seqlen, causal in ((64, 1024, True), (64, 4096, False), (128, 4096, False), (128, 4096, True),
                                     (128, 16384, False), (128, 16384, True)):
        batch, nheads = 16384 // seqlen, 2048 // head_dim
        q, k, v, do, o, lse2, seed, scale = _inputs(batch, seqlen, nheads, head_dim, causal)
        flops = 2.5 * 4 * batch * nheads * seqlen * seqlen * head_dim / (2 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            dot = do.transpose(1, 2)
            cudnn = do_bench(lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True))
        ours = do_bench(lambda: F._flash_bwd(do, q, k, v, o, lse2, seed, scale, causal, 0.0, False, None, None,
                                             seqlen, seqlen))
        cells = []
        for cfg in [c for c in ALL_CONFIGS if kind(c) in kinds]:
            ms = do_bench(lambda: run_config(do, q, k, v, o, lse2, causal, cfg))
            cells.append(f"{cfg} {ms:.3f} ms ({flops / ms * 1e-9:.0f} TF/s, x{ours / ms:.2f} ours, "
                         f"x{cudnn / ms:.2f} cuDNN)")
        print(f"hd {head_dim} n {seqlen} causal {causal}: ours {ours:.3f} ms ({flops / ours * 1e-9:.0f}), "
              f"cuDNN {cudnn:.3f} ms ({flops / cudnn * 1e-9:.0f}) | " + " | ".join(cells), flush=True)


def ab():
    """The shipped backward as kernels/flash.py runs it (`_flash_bwd`, delta and dQ's scaling included) against the
    same launcher's @triton.jit kernels (autotuned) and cuDNN's backward, head dim 128, bf16, 16K tokens a batch,
    16 heads, every length from 512: where it is faster decides flash_gluon.BWD_MIN_SEQLEN."""
    from triton.testing import do_bench

    import kernels.flash as F
    import kernels.flash_gluon as G

    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for causal in (False, True):
        for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
            batch, nheads, head_dim = 16384 // seqlen, 16, 128
            q, k, v, do, o, lse2, seed, scale = _inputs(batch, seqlen, nheads, head_dim, causal)
            flops = 2.5 * 4 * batch * nheads * seqlen * seqlen * head_dim / (2 if causal else 1)

            def bwd(gluon):
                return F._flash_bwd(do, q, k, v, o, lse2, seed, scale, causal, 0.0, False, None, None, seqlen, seqlen,
                                    gluon=gluon)

            assert F._gluon_bwd_unsupported(q, k, v, do, lse2, lse2, (q, k, v), causal, 0.0, False) is None
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(bwd(True), bwd(False)))
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                dot = do.transpose(1, 2)
                cudnn = do_bench(lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True))
            triton_ms = do_bench(lambda: bwd(False))
            gluon_ms = do_bench(lambda: bwd(True))
            print(f"hd {head_dim} n {seqlen} causal {causal}: gluon {gluon_ms:.3f} ms ({flops / gluon_ms * 1e-9:.0f} "
                  f"TF/s) | triton {triton_ms:.3f} ms ({flops / triton_ms * 1e-9:.0f}) | cuDNN {cudnn:.3f} ms "
                  f"({flops / cudnn * 1e-9:.0f}) | gluon x{triton_ms / gluon_ms:.2f} triton, x{cudnn / gluon_ms:.2f} "
                  f"cuDNN | max |gluon - triton| {diff:.1e}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "bench"
    if mode == "compile":
        compile_report()
    else:  # check / bench [one ws pp]: the kernels to run, all by default
        {"check": check, "bench": bench, "ab": lambda: ab()}[mode](*([tuple(sys.argv[2:])] if len(sys.argv) > 2 else []))
