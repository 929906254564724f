"""The attention forward for Hopper written in Gluon: FlashAttention-3's warp-specialised ping-pong.

Gluon (`triton.experimental.gluon`, shipped with Triton 3.6) makes shared-memory buffers, mbarriers, TMA copies,
asynchronous wgmma and warp specialisation explicit. FlashAttention-3's structure (Shah et al., 2024, section 3.1)
can be written in it but not in `@triton.jit`:

    one program = 128 query rows of one (batch, head); three partitions:
    loader (1 warp, 24 registers)   Q's two 64-row halves by TMA once, then K(j), V(j) into a 3-deep ring;
                                    a slot is refilled once both consumers have released it (count-2 mbarrier)
    consumer w = 0, 1 (4 warps each) 64 query rows: S(j) = Q K(j)^T and O += P(j-1) V(j-1) as async wgmma,
                                    issued in turn with the other consumer (two mbarriers): one warpgroup's softmax
                                    runs while the other's matmuls do

ptxas places the wait for P V before the softmax's exponentials whatever the source order, so the overlap inside one
warpgroup that FlashAttention-3's paper also describes does not survive; the overlap between the two warpgroups
does (results/attention/gluon_fwd/README.md). Measured on one H100 against the `@triton.jit` forward: 1.07-1.21x
at head dim 128 from 1K tokens, 0.88-1.03x cuDNN's from 4K (results/attention/gluon_fwd/bench_h100.txt); in the
product, 0.87-1.04x cuDNN's from 4K (results/attention/h100.md).

Scope, checked by `unsupported` (kernels/flash.py runs its `@triton.jit` forward everywhere else): an sm_90 GPU,
fp16/bf16, head dim 128, no dropout, no varlen, seqlen_q == seqlen_k, a multiple of 128 (the 2-D TMA view runs one
batch's rows into the next one's, so the tiles must not cross it) and at least MIN_SEQLEN. Grouped-query attention
and any row stride that TMA can read (q, k, v as views of a packed qkv) are supported. The output and the base-2
log-sum-exp are the ones `kernels.flash._fwd_kernel` writes, so its backward takes them unchanged.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

BLOCK_M, BLOCK_N, STAGES = 128, 128, 3  # the fastest of the prototype's configs at every benchmarked point
HEAD_DIM = 128
CONSUMER_REGS = 240  # setmaxnreg for the consumers; the loader gets 24
# Shortest sequences it takes, non-causal / causal: below them the @triton.jit forward's smaller tiles were faster on
# the H100 (results/attention/h100.md before and after this kernel: 512 non-causal, 512 and 1K causal).
MIN_SEQLEN = {False: 1024, True: 2048}


@gluon.constexpr_function
def _acc_layout(warps, n):
    """A wgmma accumulator's layout, one warp per 16 rows. Partitions build their own: layouts do not pass
    through warp_specialize's arguments."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _lhs_layout(warps, n):
    """The register operand (P) of a wgmma whose accumulator has _acc_layout(warps, n)."""
    return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(warps, n), k_width=2)


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, MASK: gl.constexpr, s_layout: gl.constexpr):
    """Online softmax of one float32 score tile: (P unnormalised, new row max, new row sum, alpha), base 2."""
    if MASK:  # the tile crosses the diagonal: key j is visible to query i iff j <= i
        cols = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, start_n, rows, crosses_diagonal, IS_CAUSAL: gl.constexpr,
                  s_layout: gl.constexpr):
    """_softmax_step with the causal mask only on tiles that cross the diagonal (a runtime test)."""
    if IS_CAUSAL:
        if crosses_diagonal:
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, True, s_layout)
        else:
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, False, s_layout)
    else:
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, False, s_layout)
    return p, m_i, l_i, alpha


@gluon.jit
def _head_tiles(ptr, total_rows, row_stride, nheads, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr,
                layout: gl.constexpr):
    """TMA descriptor of (batch, seqlen, nheads, HEAD_DIM) data, heads side by side and rows row_stride apart,
    viewed as (batch * seqlen, nheads * HEAD_DIM): block [row, h * HEAD_DIM] is rows row.. of head h."""
    return tma.make_tensor_descriptor(ptr, [total_rows, nheads * HEAD_DIM], [row_stride, 1], [BLOCK, HEAD_DIM],
                                      layout)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, q_row0, kv_row0,
            q_col, kv_col, n_tiles, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
            STAGES: gl.constexpr):
    SUB_M: gl.constexpr = BLOCK_M // 2
    KV_BYTES: gl.constexpr = BLOCK_N * HEAD_DIM * k_smem.dtype.primitive_bitwidth // 8
    Q_BYTES: gl.constexpr = SUB_M * HEAD_DIM * k_smem.dtype.primitive_bitwidth // 8
    for w in gl.static_range(2):
        mbarrier.expect(q_bars.index(w), Q_BYTES)
        tma.async_copy_global_to_shared(q_desc, [q_row0 + w * SUB_M, q_col], q_bars.index(w), q_smem.index(w))
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(kv_empty.index(slot), ((j // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
        mbarrier.expect(k_ready.index(slot), KV_BYTES)
        tma.async_copy_global_to_shared(k_desc, [kv_row0 + j * BLOCK_N, kv_col], k_ready.index(slot),
                                        k_smem.index(slot))
        mbarrier.expect(v_ready.index(slot), KV_BYTES)
        tma.async_copy_global_to_shared(v_desc, [kv_row0 + j * BLOCK_N, kv_col], v_ready.index(slot),
                                        v_smem.index(slot))


@gluon.jit
def _consumer(W: gl.constexpr, o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns,
              q_row0, q_col, lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Query rows start_m + W * 64 .. +63: per key tile j, S(j) and P(j-1) V(j-1) issued in this consumer's turn,
    then the softmax of S(j) while the other consumer issues."""
    SUB_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _acc_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = _lhs_layout(4, HEAD_DIM)
    my_q = q_smem.index(W)
    my_turn = turns.index(W)
    other_turn = turns.index(1 - W)
    rows = start_m + W * SUB_M + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([SUB_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([SUB_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([SUB_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_init = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bars.index(W), 0)

    # round 0: S(0) alone
    mbarrier.wait(k_ready.index(0), 0)
    mbarrier.wait(my_turn, 0)
    s_tok = warpgroup_mma(my_q, k_smem.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
    mbarrier.arrive(other_turn)
    s = warpgroup_mma_wait(0, (s_tok,))
    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, 0, rows, n_full < 1, IS_CAUSAL, s_layout)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    # rounds 1 .. n-1: S(j) and P(j-1) V(j-1)
    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        mbarrier.wait(my_turn, j & 1)
        s_tok = warpgroup_mma(my_q, k_smem.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
        acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        mbarrier.arrive(other_turn)
        s = warpgroup_mma_wait(1, (s_tok,))  # S(j) was issued first, so it is the one done
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j * BLOCK_N, rows, j >= n_full, IS_CAUSAL,
                                           s_layout)
        acc = warpgroup_mma_wait(0, (acc_tok,))
        mbarrier.arrive(kv_empty.index(prev))  # this consumer is done with tile j-1's K and V
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    # round n: P(n-1) V(n-1)
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    mbarrier.wait(my_turn, n_tiles & 1)
    acc_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    mbarrier.arrive(other_turn)
    acc = warpgroup_mma_wait(0, (acc_tok,))
    mbarrier.arrive(kv_empty.index(last))

    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    my_q.store(acc.to(dtype))  # this warpgroup's Q tile is no longer read: it takes O on the way out
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row0 + W * SUB_M, q_col], my_q)
    gl.store(LSE + lse_row0 + rows, m_i + gl.log2(l_i))
    tma.store_wait(0)


# warp_specialize takes one function per partition; the consumer's index must be a constexpr
@gluon.jit
def _consumer0(o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns, q_row0, q_col,
               lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    _consumer(0, o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns, q_row0, q_col,
              lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, IS_CAUSAL)


@gluon.jit
def _consumer1(o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns, q_row0, q_col,
               lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    _consumer(1, o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns, q_row0, q_col,
              lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, IS_CAUSAL)


@gluon.jit
def _fwd_kernel(Q, K, V, O, LSE, total_rows, seqlen, nheads, group, q_row_stride, k_row_stride, v_row_stride,
                qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr,
                CONSUMER_REGS: gl.constexpr):
    SUB_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q.dtype.element_ty
    pid_m = gl.program_id(0)
    if IS_CAUSAL:  # the longest rows first, so the short ones fill the last wave
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    nheads_k = nheads // group
    start_m = pid_m * BLOCK_M
    q_desc = _head_tiles(Q, total_rows, q_row_stride, nheads, SUB_M, HEAD_DIM, q_layout)
    k_desc = _head_tiles(K, total_rows, k_row_stride, nheads_k, BLOCK_N, HEAD_DIM, kv_layout)
    v_desc = _head_tiles(V, total_rows, v_row_stride, nheads_k, BLOCK_N, HEAD_DIM, kv_layout)
    o_desc = _head_tiles(O, total_rows, nheads * HEAD_DIM, nheads, SUB_M, HEAD_DIM, q_layout)

    q_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a slot
    mbarrier.arrive(turns.index(0))  # consumer 0 issues first
    fence_async_shared()

    if IS_CAUSAL:
        n_tiles = gl.cdiv(start_m + BLOCK_M, BLOCK_N)
        n_full = (start_m + 1) // BLOCK_N  # tiles whose last key every row of this program sees: no mask
    else:
        n_tiles = seqlen // BLOCK_N
        n_full = n_tiles
    kv_row0 = b * seqlen
    q_row0 = kv_row0 + start_m
    q_col = h * HEAD_DIM
    kv_col = (h // group) * HEAD_DIM
    lse_row0 = bh.to(gl.int64) * seqlen
    # the argument tuples are written out in the call: a tuple first bound to a name turns its constexprs into
    # tensors on the way into the partitions
    gl.warp_specialize([
        (_consumer0, (o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns, q_row0, q_col,
                      lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, IS_CAUSAL)),
        (_consumer1, (o_desc, LSE, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns, q_row0, q_col,
                      lse_row0, start_m, n_tiles, n_full, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, IS_CAUSAL)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, q_row0,
                   kv_row0, q_col, kv_col, n_tiles, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES))],
        [4, 1], [CONSUMER_REGS, 24])


_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def unsupported(q, k, v, causal: bool, dropout_p: float, varlen: bool) -> str | None:
    """Why this forward cannot take these inputs (beyond kernels.flash's platform and layout checks), or None."""
    if q.shape[-1] != HEAD_DIM:
        return f"head dim {q.shape[-1]}, not {HEAD_DIM}"
    if varlen:
        return "varlen"
    if dropout_p > 0:
        return "dropout"
    if q.dtype not in _GL_DTYPES:
        return f"{q.dtype}"
    if q.shape[1] != k.shape[1]:
        return "seqlen_q != seqlen_k"
    if q.shape[1] % BLOCK_M or q.shape[1] % BLOCK_N:
        return f"seqlen {q.shape[1]} is not a multiple of {BLOCK_M}"
    if q.shape[1] < MIN_SEQLEN[causal]:
        return f"seqlen {q.shape[1]} below {MIN_SEQLEN[causal]}{' causal' if causal else ''}, where it is slower"
    return None


def gluon_forward(q, k, v, o, lse, qk_scale: float, causal: bool) -> None:
    """Fill o (batch, seqlen, nheads, 128), contiguous, and lse (batch, nheads, seqlen) float32, contiguous, with
    the attention of q, k, v; qk_scale = softmax scale * log2(e) (the LSE is base 2). The caller has checked
    `unsupported`, the TMA layout of q, k, v (kernels.flash._ws_layout_problem) and installed Triton's allocator
    (the descriptors are built on the device)."""
    batch, seqlen, nheads, head_dim = q.shape
    if not (o.is_contiguous() and lse.is_contiguous() and o.dtype == q.dtype
            and lse.shape == (batch, nheads, seqlen)):
        raise ValueError("gluon_forward: o must be contiguous in q's dtype and lse contiguous (batch, nheads, seqlen)")
    dtype = _GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M // 2, head_dim], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, head_dim], dtype)
    _fwd_kernel[(seqlen // BLOCK_M, batch * nheads)](
        q, k, v, o, lse, batch * seqlen, seqlen, nheads, nheads // k.shape[2], q.stride(1), k.stride(1), v.stride(1),
        qk_scale, head_dim, BLOCK_M, BLOCK_N, STAGES, causal, q_layout, kv_layout, CONSUMER_REGS,
        num_warps=4)
