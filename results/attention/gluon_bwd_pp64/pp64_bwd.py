"""Session 36's experiment: the head-dim-64 Gluon backward with its two compute warpgroups apart, 64-query steps
(README.md here). The shipped `_bwd_kernel` (kernels/flash_gluon.py) shares each tile's dS^T between its two
compute warpgroups, because dQ sums over all 128 keys, so they move in lockstep and the tensor cores idle while both
run their exponentials. Here warpgroup w owns keys start_n + 64w .. + 63 of each key block alone: its halves of the K
and V buffers, its dK and dV, its dS^T tile, and a dQ partial over its 64 keys, left in its own dQ ring; the dQ warp
adds both partials by TMA reduce (two reduces a query tile instead of one). The warpgroups share only the Q / dO /
stats ring (a slot freed by both: count 2) and the K/V buffers (freed by both). Session 25's `_attn_bwd_pp`
(../gluon_bwd/) did this with 32- and 16-query steps only; at head dim 64 a 64-query step fits: dK, dV, S^T, dP^T and
the dQ partial take 32 registers a thread each.

Everything else is the shipped kernel's: the persistent grid and work units, the loader (`_bwd_loader`, unchanged),
the tile's order (`_bwd_tile`, one warpgroup's 64 keys).

    python results/attention/gluon_bwd_pp64/pp64_bwd.py compile     # sm_90 registers / spills / smem (CPU)
    python results/attention/gluon_bwd_pp64/pp64_bwd.py check       # GPU: against float64 and the shipped kernel
    python results/attention/gluon_bwd_pp64/pp64_bwd.py bench       # GPU: against the shipped kernel and cuDNN
"""
import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,  # noqa: E402
                                                              warpgroup_mma_wait)

import kernels.flash_gluon as G  # noqa: E402

BLOCK_M, BLOCK_N, HEAD_DIM = 64, 128, 64
SUB_N = gl.constexpr(64)  # keys a warpgroup


@gluon.jit
def _pp_dq_writer(dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_STAGES: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, SKIP_MASKED: gl.constexpr, ABLATE: gl.constexpr,
                  empty, STAGES: gl.constexpr, WRITER_RELEASES: gl.constexpr):
    if ABLATE > 0:  # the compute warpgroups hand over no dQ
        return
    g = 0  # query tiles, and the first warpgroup's dQ partials
    g1 = 0  # the second warpgroup's dQ partials
    for u in range(gl.program_id(0), G._n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = G._work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = G._key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                    seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            for i in range(lo, n_end):
                s = g % DQ_STAGES
                mbarrier.wait(dq_full.index(s), (g // DQ_STAGES) & 1)
                G.tma_reduce_add_shared(dqa_desc, [row0 + i * BLOCK_M, col], dq_smem.index(s))
                # the second warpgroup's partial; under SKIP_MASKED it has none for the block's first query tile
                partial1 = (i > lo) | (not SKIP_MASKED)
                s1 = DQ_STAGES + g1 % DQ_STAGES
                if partial1:
                    mbarrier.wait(dq_full.index(s1), (g1 // DQ_STAGES) & 1)
                    G.tma_reduce_add_shared(dqa_desc, [row0 + i * BLOCK_M, col], dq_smem.index(s1))
                if WRITER_RELEASES:
                    # both warpgroups handed this tile's dQ over after their last wgmma: Q_i, dO_i are read
                    mbarrier.arrive(empty.index(g % STAGES))
                tma.store_wait(0)  # the TMA unit has read the slots
                mbarrier.arrive(dq_empty.index(s))
                if partial1:
                    mbarrier.arrive(dq_empty.index(s1))
                    g1 += 1
                g += 1


@gluon.jit
def _ablated_tile(k_smem, v_smem, q_s, do_s, ds_smem, lse, delta, i, start_n, keys, qcols, st_init, dv, dk, qk_scale,
                  op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                  ABLATE: gl.constexpr):
    """`_bwd_tile`'s unsplit branch without dQ's wgmma (ABLATE 2), and also without the exponential (ABLATE 3: P^T is
    the scaled scores, wrong values, the same matmuls): timing only, to bound what each part costs."""
    dtype: gl.constexpr = q_s.dtype
    st_tok = warpgroup_mma(k_smem, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    dpt_tok = warpgroup_mma(v_smem, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(1, (st_tok,))
    if ABLATE == 3:
        pt = st * qk_scale - lse
    else:
        pt = gl.exp2(st * qk_scale - lse)
    if IS_CAUSAL:
        if i * BLOCK_M < start_n + BLOCK_N:
            queries = i * BLOCK_M + qcols
            pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
    dv_tok = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_s, dv, is_async=True)
    dpt = warpgroup_mma_wait(1, (dpt_tok,))
    dst = (pt * (dpt - delta)).to(dtype)
    dk_tok = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
    dv, dk = warpgroup_mma_wait(0, (dv_tok, dk_tok))
    return dv, dk


@gluon.jit
def _pp_release_kv(kv_empty, i, lo, it, KV_BUFFERS: gl.constexpr):
    if KV_BUFFERS > 1:
        if (i == lo) & (it > 0):
            tma.store_wait(0)  # this warpgroup's half of the last block's dK, dV has left its buffer
            mbarrier.arrive(kv_empty.index((it - 1) % KV_BUFFERS))  # count 2


@gluon.jit
def _pp_compute(W: gl.constexpr, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                delta_smem, kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen,
                head_group, qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr,
                IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, SKIP_MASKED: gl.constexpr, ABLATE: gl.constexpr,
                WRITER_RELEASES: gl.constexpr):
    st_layout: gl.constexpr = G._tile_layout(4, SUB_N, BLOCK_M)
    kv_acc_layout: gl.constexpr = G._tile_layout(4, SUB_N, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_acc_layout, k_width=2)
    dq_layout: gl.constexpr = G._tile_layout(4, BLOCK_M, HEAD_DIM)
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    st_init = gl.zeros([SUB_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    ds_w = ds_smem.index(W)
    it = 0
    g = 0  # query tiles
    gq = 0  # dQ partials handed to the dQ warp
    for u in range(gl.program_id(0), G._n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = G._work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = G._key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                    seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            start_w = start_n + W * SUB_N
            kb = it % KV_BUFFERS
            k_w = k_smem.index(kb).slice(W * SUB_N, SUB_N)
            v_w = v_smem.index(kb).slice(W * SUB_N, SUB_N)
            keys = start_w + gl.arange(0, SUB_N, layout=gl.SliceLayout(1, st_layout))
            dk = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            dv = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            mbarrier.wait(kv_ready.index(kb), (it // KV_BUFFERS) & 1)
            # causal: the second warpgroup's keys are all after query tile lo's queries; without SKIP_MASKED it runs
            # that tile anyway (masked to zero)
            for i in range(lo, n_end):
                slot = g % STAGES
                mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
                if SKIP_MASKED & (W == 1) & (i == lo):
                    # causal: every key of this warpgroup is after every query of the block's first tile
                    mbarrier.arrive(empty.index(slot))
                    _pp_release_kv(kv_empty, i, lo, it, KV_BUFFERS)
                else:
                    lse = lse_smem.index(slot).load(st_layout)
                    delta = delta_smem.index(slot).load(st_layout)
                    if ABLATE >= 2:
                        dv, dk = _ablated_tile(k_w, v_w, q_smem.index(slot), do_smem.index(slot), ds_w, lse, delta,
                                               i, start_w, keys, qcols, st_init, dv, dk, qk_scale, op_layout,
                                               BLOCK_M, SUB_N, IS_CAUSAL, ABLATE)
                    else:
                        dv, dk, dq = G._bwd_tile(k_w, v_w, q_smem.index(slot), do_smem.index(slot), ds_w, ds_w, lse,
                                                 delta, i, start_w, keys, qcols, st_init, dq_init, dv, dk, qk_scale,
                                                 op_layout, BLOCK_M, SUB_N, IS_CAUSAL, False)
                    if not WRITER_RELEASES:
                        mbarrier.arrive(empty.index(slot))  # count 2: refilled once both warpgroups are done with it
                    _pp_release_kv(kv_empty, i, lo, it, KV_BUFFERS)
                    if ABLATE == 0:
                        s = W * DQ_STAGES + gq % DQ_STAGES
                        mbarrier.wait(dq_empty.index(s), ((gq // DQ_STAGES) & 1) ^ 1)
                        dq_smem.index(s).store(dq)
                        fence_async_shared()
                        mbarrier.arrive(dq_full.index(s))
                    gq += 1
                g += 1
            k_w.store((dk * sm_scale).to(k_w.dtype))
            v_w.store(dv.to(v_w.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [row0 + start_w, col], k_w)
            tma.async_copy_shared_to_global(dv_desc, [row0 + start_w, col], v_w)
            if KV_BUFFERS == 1:
                tma.store_wait(0)
                mbarrier.arrive(kv_empty.index(0))
            it += 1
    tma.store_wait(0)


@gluon.jit
def _pp_compute0(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem, kv_ready,
                 kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, qk_scale, sm_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
                 SKIP_MASKED: gl.constexpr, ABLATE: gl.constexpr, WRITER_RELEASES: gl.constexpr):
    _pp_compute(0, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, qk_scale,
                sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED, SKIP_MASKED,
                ABLATE, WRITER_RELEASES)


@gluon.jit
def _pp_compute1(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem, kv_ready,
                 kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, qk_scale, sm_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
                 SKIP_MASKED: gl.constexpr, ABLATE: gl.constexpr, WRITER_RELEASES: gl.constexpr):
    _pp_compute(1, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, qk_scale,
                sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED, SKIP_MASKED,
                ABLATE, WRITER_RELEASES)


@gluon.jit
def _pp_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, seqlen, nheads, n_bh,
               qk_scale, sm_scale, head_group, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr,
               PAIRED: gl.constexpr, ds_layout: gl.constexpr, CONSUMER_REGS: gl.constexpr, SKIP: gl.constexpr,
               ABLATE: gl.constexpr = 0, WRITER_RELEASES: gl.constexpr = False):
    # k_desc, v_desc: tiles of BLOCK_N keys (the loader's); dk_desc, dv_desc: of SUB_N keys (a warpgroup's half)
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(BLOCK_N == 2 * SUB_N, "two warpgroups of 64 keys")
    n_n = seqlen // BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, SUB_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2 * DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2 * DQ_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both warpgroups' halves stored
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        # both warpgroups done with the slot, or (WRITER_RELEASES) the dQ warp, once it has both tiles' partials
        mbarrier.init(empty.index(i), count=1 if WRITER_RELEASES else 2)
    for i in gl.static_range(2 * DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    SKIP_MASKED: gl.constexpr = SKIP and IS_CAUSAL
    gl.warp_specialize([
        (_pp_compute0, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                        kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group,
                        qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL,
                        PAIRED, SKIP_MASKED, ABLATE, WRITER_RELEASES)),
        (_pp_compute1, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                        kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group,
                        qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL,
                        PAIRED, SKIP_MASKED, ABLATE, WRITER_RELEASES)),
        (G._bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready,
                         empty, LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                         BLOCK_N, HEAD_DIM, STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED)),
        (_pp_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                         BLOCK_N, HEAD_DIM, DQ_STAGES, IS_CAUSAL, PAIRED, SKIP_MASKED, ABLATE, empty, STAGES,
                         WRITER_RELEASES))],
        [4, 1, 1], [G.CONSUMER_REGS, 24, 24])


# (STAGES of the Q / dO / stats ring, DQ_STAGES of each warpgroup's dQ ring, KV_BUFFERS, SKIP: causal, the second
# warpgroup skips each key block's first query tile, where its keys are all masked, rather than run it masked)
# (2, 2, 2, False) was measured in the first run (bench_h100_run1.txt): 0.91-1.02x the shipped kernel, dropped.
# A fifth field, WRITER_RELEASES (default False): the dQ warp frees each Q / dO slot once it has both warpgroups'
# partials of that tile, so the compute warpgroups skip an arrive and the barrier Gluon puts before it
CONFIGS = [(3, 2, 2, False), (3, 2, 2, True), (3, 2, 2, False, True)]


def layouts(dtype=gl.bfloat16) -> dict:
    return dict(q_layout=G._shared_layout(BLOCK_M, HEAD_DIM, dtype), kv_layout=G._shared_layout(BLOCK_N, HEAD_DIM, dtype),
                half_layout=G._shared_layout(64, HEAD_DIM, dtype), ds_layout=G._shared_layout(64, BLOCK_M, dtype),
                dqa_layout=G._shared_layout(BLOCK_M, HEAD_DIM, gl.float32))


def launch_split(kernel, do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, programs, consts):
    """Launch a kernel of this folder's form (and ../gluon_bwd_altdq's): `_bwd_kernel`'s arguments with dK and dV
    written by 64-key halves, on the persistent grid; consts: its constexprs beyond the tiles, mask and layout. Then
    dQ scaled and cast out of the float32 buffer, as gluon_backward does."""
    batch, seqlen, nheads, head_dim = q.shape
    assert head_dim == HEAD_DIM and seqlen % BLOCK_N == 0
    dqa = torch.zeros(batch, seqlen, nheads, head_dim, dtype=torch.float32, device=q.device)
    grid = G._grid(seqlen // BLOCK_N, batch * nheads, causal, True, programs, q.device)
    lay = layouts(G._GL_DTYPES[q.dtype])
    queries = lambda t: G.head_tiles(t, BLOCK_M, lay["q_layout"])  # noqa: E731
    keys = lambda t: G.head_tiles(t, BLOCK_N, lay["kv_layout"])  # noqa: E731
    halves = lambda t: G.head_tiles(t, 64, lay["half_layout"])  # noqa: E731
    G.launch(kernel, grid,
             (queries(q), queries(do), keys(k), keys(v), halves(dk), halves(dv),
              G.head_tiles(dqa, BLOCK_M, lay["dqa_layout"]), lse, delta, seqlen, nheads, batch * nheads,
              softmax_scale * G.LOG2E, softmax_scale, G.launch_head_group(seqlen, causal)),
             dict(HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, IS_CAUSAL=causal, PAIRED=causal,
                  ds_layout=lay["ds_layout"], CONSUMER_REGS=G.CONSUMER_REGS, num_warps=4, **consts))
    torch.mul(dqa, softmax_scale, out=dq)


def pp64_backward(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, config=CONFIGS[0],
                  programs: int | None = None, ablate: int = 0) -> None:
    """As kernels.flash_gluon.gluon_backward (same arguments and checks), head dim 64 only."""
    stages, dq_stages, kv_buffers, skip, *writer_releases = config
    launch_split(_pp_kernel, do, q, k, v, lse, delta, dq, dk, dv, softmax_scale, causal, programs,
                 dict(STAGES=stages, DQ_STAGES=dq_stages, KV_BUFFERS=kv_buffers, SKIP=skip, ABLATE=ablate,
                      WRITER_RELEASES=bool(writer_releases and writer_releases[0])))


def sm90_types(R) -> dict:
    """The descriptor argument types of a kernel of this form, for scripts/kernel_resources.py (R)'s compile."""
    lay = layouts()
    desc = lambda r, l, t="bf16": R.tensordesc(t, [r, HEAD_DIM], lay[l])  # noqa: E731
    return dict(q_desc=desc(BLOCK_M, "q_layout"), do_desc=desc(BLOCK_M, "q_layout"), k_desc=desc(BLOCK_N, "kv_layout"),
                v_desc=desc(BLOCK_N, "kv_layout"), dk_desc=desc(64, "half_layout"), dv_desc=desc(64, "half_layout"),
                dqa_desc=desc(BLOCK_M, "dqa_layout", "fp32"))


def compile_report():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R

    lay = layouts()
    types = sm90_types(R)
    for (stages, dq_stages, kv_buffers, skip, *wr), causal in itertools.product(CONFIGS, (False, True)):
        consts = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=stages, DQ_STAGES=dq_stages,
                      KV_BUFFERS=kv_buffers, IS_CAUSAL=causal, PAIRED=causal, ds_layout=lay["ds_layout"],
                      CONSUMER_REGS=G.CONSUMER_REGS, SKIP=skip, WRITER_RELEASES=bool(wr and wr[0]))
        r = R.resources(_pp_kernel, consts, 4, stages, sass=True, types=types)
        print(f"config {(stages, dq_stages, kv_buffers, skip, *wr)} causal {causal:d}: {r['regs']} registers, {r['stack']} bytes "
              f"of spill stack, {r['smem']} bytes of shared memory, {r['ops'].get('HGMMA', 0)} HGMMA, "
              f"{r['ops'].get('BAR', 0)} BAR (static)", flush=True)


def _inputs(batch, seqlen, nheads, causal, seed=0, head_dim=HEAD_DIM):
    """q, k, v, dO (bf16), the Gluon forward's LSE, delta and the softmax scale (also ../gluon_bwd_stats_at_use/)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    scale = head_dim ** -0.5
    o, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen, device="cuda")
    G.gluon_forward(q, k, v, o, lse, scale * G.LOG2E, causal)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    return q, k, v, do, lse, delta, scale


def _run(fn, args, causal, **kw):
    q, k, v, do, lse, delta, scale = args
    grads = [torch.empty_like(q) for _ in range(3)]
    fn(do, q, k, v, lse, delta, *grads, scale, causal, **kw)
    return grads


def _reference(args, causal):
    q, k, v, do, _, _, scale = args
    q64, k64, v64 = (x.double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v64
    return [g.transpose(1, 2) for g in torch.autograd.grad(out, (q64, k64, v64), do.double().transpose(1, 2))]


def check(backward=None, configs=CONFIGS):
    """backward (this folder's pp64_backward by default) in each of configs, against float64 and the shipped kernel."""
    bad = 0
    for cfg, seqlen, causal, programs in itertools.product(configs, (384, 1024), (False, True), (None, 7)):
        args = _inputs(2, seqlen, 4, causal)
        ref = _reference(args, causal)
        shipped = _run(G.gluon_backward, args, causal, programs=programs)
        grads = _run(backward or pp64_backward, args, causal, config=cfg, programs=programs)
        err = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
        base = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(shipped, ref)]
        same = all(torch.equal(a, b) for a, b in zip(grads[1:], shipped[1:]))
        ok = all(e <= 2 * b + 1e-3 for e, b in zip(err, base)) and max(err) < 2e-2
        bad += not ok
        print(f"config {cfg} seqlen {seqlen} causal {causal:d} programs {programs}: rel err dq/dk/dv "
              f"{err[0]:.2e} {err[1]:.2e} {err[2]:.2e} (shipped {base[0]:.2e} {base[1]:.2e} {base[2]:.2e}); dK/dV "
              f"bit-identical to the shipped kernel's: {same}; {'ok' if ok else 'BAD'}", flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(seqlens, rounds, backward=None, configs=CONFIGS, tag="pp"):
    """backward (pp64_backward by default) in each of configs, named tag + config, against the shipped kernel and
    cuDNN's backward, in alternating rounds."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"backward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, 32 heads, head dim 64, bf16")
    for seqlen, causal in itertools.product(seqlens, (False, True)):
        args = _inputs(16384 // seqlen, seqlen, 32, causal)
        q, k, v, do, *_ = args
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = do.transpose(1, 2)
        fns = {"shipped": lambda: _run(G.gluon_backward, args, causal),
               "cudnn": lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)}
        for cfg in configs:
            fns[f"{tag}{cfg}"] = lambda cfg=cfg: _run(backward or pp64_backward, args, causal, config=cfg)
        times = {n: [] for n in fns}
        for _ in range(rounds):
            for n, f in fns.items():
                times[n].append(triton.testing.do_bench(f, rep=60))
        base = statistics.median(times["shipped"])
        print(f"seqlen {seqlen} causal {causal:d}: " + " ".join(
            f"{n} {statistics.median(t):.3f} ({base / statistics.median(t):.3f}x)" for n, t in times.items()),
            flush=True)


def ablate(seqlens, rounds):
    """pp (3, 2, 2, False) with parts of the tile removed (wrong gradients; timing only): 1 no dQ hand-off (no dQ
    store, fence, arrive or reduce), 2 no dQ at all (nor its wgmma), 3 also no exponential."""
    import triton.testing

    names = {0: "full", 1: "no dQ hand-off", 2: "no dQ", 3: "no dQ, no exp2"}
    print(f"backward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, 32 heads, head dim 64; "
          f"pp {CONFIGS[0]} with parts removed")
    for seqlen, causal in itertools.product(seqlens, (False, True)):
        args = _inputs(16384 // seqlen, seqlen, 32, causal)
        times = {a: [] for a in names}
        for _ in range(rounds):
            for a in names:
                times[a].append(triton.testing.do_bench(lambda: _run(pp64_backward, args, causal, ablate=a), rep=60))
        base = statistics.median(times[0])
        print(f"seqlen {seqlen} causal {causal:d}: " + " ".join(
            f"{names[a]} {statistics.median(t):.3f} ({statistics.median(t) / base:.3f} of full)"
            for a, t in times.items()), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench", "ablate"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    {"compile": compile_report, "check": check, "bench": lambda: bench(a.seqlens, a.rounds),
     "ablate": lambda: ablate(a.seqlens, a.rounds)}[a.mode]()
