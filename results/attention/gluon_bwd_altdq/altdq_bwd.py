"""Session 36's prepared experiment (README.md here): the head-dim-64 Gluon backward laid out as cuDNN's is
(../gluon_bwd_profile/README.md, last section). Each of the two compute warpgroups owns 64 keys of the 128-key block,
as in the shipped `_bwd_kernel`, and both store their dS^T halves to shared memory. But a tile's whole dQ
(64 queries x 64, over all 128 keys: m64n64, eight k-steps) is computed by one warpgroup, taking turns by tile, where
the shipped kernel splits dQ's columns over both (m64n32, each reading all of dS^T). The other warpgroup goes on to
the next tile meanwhile.

- The warpgroups are separate `warp_specialize` partitions (their own barriers are 128-thread ones), as in
  ../gluon_bwd_pp64/.
- dS^T is double-buffered by tile: ds_full[b] (count 2, both halves stored) and ds_free[b] (count 1, that tile's
  dQ wgmma done).
- Before a warpgroup writes its dK / dV into its K / V half, it waits for the block's last dQ (which reads both K
  halves).
- The loader (`_bwd_loader`) and the dQ warp (`_bwd_dq_writer`, one reduce a tile) are the shipped ones.

    python results/attention/gluon_bwd_altdq/altdq_bwd.py compile     # sm_90 registers / spills / smem (CPU)
    python results/attention/gluon_bwd_altdq/altdq_bwd.py check       # GPU: against float64 and the shipped kernel
    python results/attention/gluon_bwd_altdq/altdq_bwd.py bench       # GPU: against the shipped kernel and cuDNN
"""
import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,  # noqa: E402
                                                              warpgroup_mma, warpgroup_mma_wait)

import kernels.flash_gluon as G  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_pp64"))
import pp64_bwd as PP  # noqa: E402  (the tile sizes, layouts, launcher and check / bench harness are pp64's)

BLOCK_M, BLOCK_N, HEAD_DIM, SUB_N = PP.BLOCK_M, PP.BLOCK_N, PP.HEAD_DIM, PP.SUB_N


@gluon.jit
def _altdq_compute(W: gl.constexpr, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                   delta_smem, kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads,
                   seqlen, head_group, qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, TURNS: gl.constexpr):
    st_layout: gl.constexpr = G._tile_layout(4, SUB_N, BLOCK_M)
    kv_acc_layout: gl.constexpr = G._tile_layout(4, SUB_N, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_acc_layout, k_width=2)
    dq_layout: gl.constexpr = G._tile_layout(4, BLOCK_M, HEAD_DIM)
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    st_init = gl.zeros([SUB_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    it = 0
    g = 0  # query tiles, over all key blocks: the rings' position, and whose turn dQ is (g % 2)
    for u in range(gl.program_id(0), G._n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = G._work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = G._key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                    seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            start_w = start_n + W * SUB_N
            kb = it % KV_BUFFERS
            k_buf = k_smem.index(kb)
            k_w = k_buf.slice(W * SUB_N, SUB_N)
            v_w = v_smem.index(kb).slice(W * SUB_N, SUB_N)
            keys = start_w + gl.arange(0, SUB_N, layout=gl.SliceLayout(1, st_layout))
            dk = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            dv = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            mbarrier.wait(kv_ready.index(kb), (it // KV_BUFFERS) & 1)
            for i in range(lo, n_end):
                slot = g % STAGES
                mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
                q_s = q_smem.index(slot)
                do_s = do_smem.index(slot)
                lse = lse_smem.index(slot).load(st_layout)
                delta = delta_smem.index(slot).load(st_layout)
                st_tok = warpgroup_mma(k_w, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
                dpt_tok = warpgroup_mma(v_w, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
                st = warpgroup_mma_wait(1, (st_tok,))
                pt = gl.exp2(st * qk_scale - lse)
                if IS_CAUSAL:  # only the tiles on the diagonal have keys after some of their queries
                    if i * BLOCK_M < start_w + SUB_N:
                        queries = i * BLOCK_M + qcols
                        pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
                dv_tok = warpgroup_mma(gl.convert_layout(pt.to(q_s.dtype), op_layout), do_s, dv, is_async=True)
                dpt = warpgroup_mma_wait(1, (dpt_tok,))
                dst = (pt * (dpt - delta)).to(q_s.dtype)
                b = g % 2
                # the dQ of tile g - 2 has read this dS^T buffer (a fresh barrier passes parity 1)
                mbarrier.wait(ds_free.index(b), ((g // 2) & 1) ^ 1)
                ds_smem.index(2 * b + W).store(dst)
                dk_tok = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
                fence_async_shared()
                mbarrier.arrive(ds_full.index(b))  # count 2: both halves of tile g's dS^T stored
                dv, dk = warpgroup_mma_wait(0, (dv_tok, dk_tok))
                mbarrier.arrive(empty.index(slot))  # count 2: Q_i, dO_i, LSE_i, delta_i read by both warpgroups
                if KV_BUFFERS > 1:
                    if (i == lo) & (it > 0):
                        tma.store_wait(0)  # this warpgroup's half of the last block's dK, dV has left its buffer
                        mbarrier.arrive(kv_empty.index((it - 1) % KV_BUFFERS))  # count 2
                # this warpgroup's turn (TURNS; else the first warpgroup's, always): the tile's whole dQ = dS K
                if (g % 2 == W) if TURNS else (W == 0):
                    mbarrier.wait(ds_full.index(b), (g // 2) & 1)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * b).permute((1, 0)), k_buf.slice(0, SUB_N), dq_init,
                                           use_acc=False, is_async=True)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * b + 1).permute((1, 0)), k_buf.slice(SUB_N, SUB_N),
                                           dq_tok, is_async=True)
                    dq = warpgroup_mma_wait(0, (dq_tok,))
                    mbarrier.arrive(ds_free.index(b))
                    s = g % DQ_STAGES
                    mbarrier.wait(dq_empty.index(s), ((g // DQ_STAGES) & 1) ^ 1)
                    dq_smem.index(s).store(dq)
                    fence_async_shared()  # the generic-proxy stores, before the TMA unit reads them
                    mbarrier.arrive(dq_full.index(s))
                g += 1
            # the block's last dQ (either warpgroup's) reads both K halves: done before dK overwrites this one
            mbarrier.wait(ds_free.index((g - 1) % 2), ((g - 1) // 2) & 1)
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
def _altdq_compute0(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                    kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads, seqlen,
                    head_group, qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, TURNS: gl.constexpr):
    _altdq_compute(0, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                   kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads, seqlen,
                   head_group, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS,
                   IS_CAUSAL, PAIRED, TURNS)


@gluon.jit
def _altdq_compute1(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                    kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads, seqlen,
                    head_group, qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, TURNS: gl.constexpr):
    _altdq_compute(1, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                   kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads, seqlen,
                   head_group, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS,
                   IS_CAUSAL, PAIRED, TURNS)


@gluon.jit
def _altdq_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, seqlen, nheads, n_bh,
                  qk_scale, sm_scale, head_group, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr,
                  PAIRED: gl.constexpr, ds_layout: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  TURNS: gl.constexpr = True):
    # k_desc, v_desc: tiles of BLOCK_N keys (the loader's); dk_desc, dv_desc: of SUB_N keys (a warpgroup's half)
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(BLOCK_N == 2 * SUB_N, "two warpgroups of 64 keys")
    n_n = seqlen // BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [4, SUB_N, BLOCK_M], ds_layout)  # [tile buffer x warpgroup half]
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both warpgroups' halves stored
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both warpgroups done with the slot
    for i in gl.static_range(2):
        mbarrier.init(ds_full.index(i), count=2)  # both dS^T halves stored
        mbarrier.init(ds_free.index(i), count=1)  # the tile's dQ wgmma done
    for i in gl.static_range(DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_altdq_compute0, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                           kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads,
                           seqlen, head_group, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES,
                           KV_BUFFERS, IS_CAUSAL, PAIRED, TURNS)),
        (_altdq_compute1, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                           kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads,
                           seqlen, head_group, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES,
                           KV_BUFFERS, IS_CAUSAL, PAIRED, TURNS)),
        (G._bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready,
                         empty, LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                         BLOCK_N, HEAD_DIM, STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED)),
        (G._bwd_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                            BLOCK_N, HEAD_DIM, DQ_STAGES, IS_CAUSAL, PAIRED))],
        [4, 1, 1], [CONSUMER_REGS, 24, 24])


# (STAGES of the Q / dO / stats ring, DQ_STAGES of the dQ ring, KV_BUFFERS, TURNS: dQ by the warpgroups in turns,
# else always by the first)
CONFIGS = [(3, 2, 2, True), (2, 2, 2, True), (3, 3, 2, True), (3, 2, 2, False)]


def altdq_backward(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, config=CONFIGS[0],
                   programs: int | None = None) -> None:
    """As kernels.flash_gluon.gluon_backward (same arguments and checks), head dim 64 only."""
    stages, dq_stages, kv_buffers, turns = config
    PP.launch_split(_altdq_kernel, do, q, k, v, lse, delta, dq, dk, dv, softmax_scale, causal, programs,
                    dict(STAGES=stages, DQ_STAGES=dq_stages, KV_BUFFERS=kv_buffers, TURNS=turns))


def compile_report():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R

    lay = PP.layouts()
    types = PP.sm90_types(R)
    for (stages, dq_stages, kv_buffers, turns), causal in itertools.product(CONFIGS, (False, True)):
        consts = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=stages, DQ_STAGES=dq_stages,
                      KV_BUFFERS=kv_buffers, IS_CAUSAL=causal, PAIRED=causal, ds_layout=lay["ds_layout"],
                      CONSUMER_REGS=G.CONSUMER_REGS, TURNS=turns)
        r = R.resources(_altdq_kernel, consts, 4, stages, sass=True, types=types)
        hgmma = {k: v for k, v in r["ops"].items() if k.startswith("HGMMA")}
        print(f"config {(stages, dq_stages, kv_buffers, turns)} causal {causal:d}: {r['regs']} registers, {r['stack']} "
              f"bytes of spill stack, {r['smem']} bytes of shared memory, {r['ops'].get('BAR', 0)} BAR (static), "
              f"HGMMA {hgmma}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    {"compile": compile_report, "check": lambda: PP.check(altdq_backward, CONFIGS),
     "bench": lambda: PP.bench(a.seqlens, a.rounds, altdq_backward, CONFIGS, "altdq")}[a.mode]()
