"""The Gluon backward with its query tiles software-pipelined: an experiment from session 35, measured slower
(0.87-0.96x) and not shipped. README.md has the numbers and the reading.

Why. kernels/flash_gluon.py's backward runs each query tile's five wgmma and its softmax in one chain: S^T and dP^T
issued together, P^T = exp2(...) while dP^T runs, dV issued, dS^T while dV runs, dK and dQ issued, then a wait for
all three before the next tile's S^T. So the tensor cores idle during most of the softmax. At head dim 64 on one H100
the backward runs at ~390 TFLOP/s from 4K (results/attention/h100.md), ~40% of the dense bf16 peak, 0.95x cuDNN's.

What changes. Per query tile i: S^T(i+1) and dP^T(i+1) issued, then dV(i), dK(i) and dQ(i) from P^T(i) and dS^T(i),
which the last iteration left in shared buffer i % 2; then tile i+1's softmax and dS^T go to the other buffer while
those five run; then one wait for all. dV's and dK's A operands come from shared memory (A_IN_REGS = 0) or, as in the
shipped kernel, from registers (A_IN_REGS = 1). STAGES 4 is timed beside the shipped 3. The same operations per key
row in the same order, so dK and dV equal the shipped kernel's bit for bit; dQ is summed by TMA reduce in a varying
order, as in the shipped kernel. The loader and the dQ writer are the shipped ones (`G._bwd_loader`,
`G._bwd_dq_writer`): the order of tiles and slots they see is unchanged.

What ptxas allows (compile_sm90.txt). A first form carried tile i+1's S^T and dP^T across the loop's back edge and
read them after a partial wait (wgmma.wait_group 4) in the next iteration: ptxas serialised every wgmma of the kernel
(C7514), and it did so in each cut-down form that kept such a read, and not once every wgmma was waited for in the
iteration that issued it. With the A operands in registers, tile i+1's P^T and dS^T are written while dV(i) and
dK(i) still read tile i's from the same registers: serialised too (C7513), so A_IN_REGS = 1 is timed only to show
that cost. A_IN_REGS = 0 compiles with neither note and no spills inside the tile loop (40 bytes in the outer loop).

Prediction (written before the GPU run): head dim 64 backward 1.05-1.20x the shipped one from 2K; 1 chance in 3 that
it is no faster. Measured: 0.87-0.96x (README.md).

Nothing in kernels/ uses this. Modes, from the repo root:

    python results/attention/gluon_bwd_pipeline/pipeline_bwd.py compile   # CPU: sm_90 registers, spills, ptxas notes
    python results/attention/gluon_bwd_pipeline/pipeline_bwd.py check     # GPU: gradients against gluon_backward
    python results/attention/gluon_bwd_pipeline/pipeline_bwd.py bench     # GPU: backward times, alternating rounds
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

import kernels.flash_gluon as G  # noqa: E402
from kernels.launch import launch  # noqa: E402


@gluon.jit
def _issue_scores(k_buf, v_buf, q_s, do_s, st_init):
    """S^T = K Q^T and dP^T = V dO^T of one query tile, issued, not waited for."""
    st = warpgroup_mma(k_buf, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_buf, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    return st, dpt


@gluon.jit
def _issue_grads(pt_op, ds_op, pt_s, ds_s, q_s, do_s, k_buf, dv, dk, dq_init, A_IN_REGS: gl.constexpr):
    """dV += P^T dO, dK += dS^T Q and dQ = dS K of one query tile, issued, not waited for; P^T and dS^T as A operands
    from registers (A_IN_REGS) or shared memory."""
    if A_IN_REGS:
        dv_tok = warpgroup_mma(pt_op, do_s, dv, is_async=True)
        dk_tok = warpgroup_mma(ds_op, q_s, dk, is_async=True)
    else:
        dv_tok = warpgroup_mma(pt_s, do_s, dv, is_async=True)
        dk_tok = warpgroup_mma(ds_s, q_s, dk, is_async=True)
    dq_tok = warpgroup_mma(ds_s.permute((1, 0)), k_buf, dq_init, use_acc=False, is_async=True)
    return dv_tok, dk_tok, dq_tok


@gluon.jit
def _dq_out(dq, dq_smem, dq_full, dq_empty, g, DQ_STAGES: gl.constexpr):
    """Tile g's dQ into the dQ writer's ring (the shipped kernel's hand-off)."""
    s = g % DQ_STAGES
    mbarrier.wait(dq_empty.index(s), ((g // DQ_STAGES) & 1) ^ 1)
    dq_smem.index(s).store(dq)
    fence_async_shared()
    mbarrier.arrive(dq_full.index(s))


@gluon.jit
def _scores_to_smem(st_tok, dpt_tok, i, slot, buf, pt_smem, ds_smem, lse_smem, delta_smem, start_n, keys, qcols,
                    qk_scale, st_layout: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, PENDING: gl.constexpr, A_IN_REGS: gl.constexpr):
    """Query tile i's P^T and dS^T from its S^T and dP^T (issued in this order, then PENDING more wgmma, which stay
    in flight): dS^T into shared buffer `buf` (dQ reads both warpgroups' halves), fenced for the wgmma that read it;
    P^T there too unless A_IN_REGS. Returns P^T and dS^T as dV's and dK's A operands in registers (A_IN_REGS; else
    placeholders)."""
    dtype: gl.constexpr = pt_smem.dtype
    lse = lse_smem.index(slot).load(st_layout)
    delta = delta_smem.index(slot).load(st_layout)
    st = warpgroup_mma_wait(PENDING + 1, (st_tok,))
    pt = gl.exp2(st * qk_scale - lse)
    if IS_CAUSAL:  # only the tiles on the diagonal have keys after some of their queries
        if i * BLOCK_M < start_n + BLOCK_N:
            queries = i * BLOCK_M + qcols
            pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
    if A_IN_REGS:
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
    else:
        pt_smem.index(buf).store(pt.to(dtype))
        pt_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, layout=op_layout)
    dpt = warpgroup_mma_wait(PENDING, (dpt_tok,))
    dst = (pt * (dpt - delta)).to(dtype)
    ds_smem.index(buf).store(dst)
    fence_async_shared()  # both warpgroups' halves, before the wgmma that read all of them
    if A_IN_REGS:
        ds_op = gl.convert_layout(dst, op_layout)
    else:
        ds_op = pt_op
    return pt_op, ds_op


@gluon.jit
def _compute(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem, delta_smem,
             kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, qk_scale,
             sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
             WARPS: gl.constexpr, A_IN_REGS: gl.constexpr):
    # Per query tile i: S^T(i+1) and dP^T(i+1) issued, then dV(i), dK(i), dQ(i) from P^T(i) and dS^T(i) in shared
    # buffer i % 2; tile i+1's softmax and dS^T into the other buffer while those five run; then a wait for all.
    # Every wgmma is waited for in the iteration that issued it: ptxas serialised all of the kernel's wgmma (C7514)
    # in a first form that read tile i+1's scores after a partial wait in the next iteration. A key block has at
    # least two query tiles (BLOCK_N >= 2 BLOCK_M, seqlen_q == seqlen_k), so the last one is never the first.
    gl.static_assert(BLOCK_N >= 2 * BLOCK_M)
    st_layout: gl.constexpr = G._tile_layout(WARPS, BLOCK_N, BLOCK_M)
    kv_acc_layout: gl.constexpr = G._tile_layout(WARPS, BLOCK_N, HEAD_DIM)
    dq_layout: gl.constexpr = G._tile_layout(WARPS, BLOCK_M, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_acc_layout, k_width=2)
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    it = 0
    g = 0  # query tiles started so far, over all key blocks: the Q/dO ring's and the dQ ring's position
    for u in range(gl.program_id(0), G._n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = G._work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = G._key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                    seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            kb = it % KV_BUFFERS
            k_buf = k_smem.index(kb)
            v_buf = v_smem.index(kb)
            keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            mbarrier.wait(kv_ready.index(kb), (it // KV_BUFFERS) & 1)
            slot = g % STAGES
            mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
            st_tok, dpt_tok = _issue_scores(k_buf, v_buf, q_smem.index(slot), do_smem.index(slot), st_init)
            pt_op, ds_op = _scores_to_smem(st_tok, dpt_tok, lo, slot, 0, pt_smem, ds_smem, lse_smem, delta_smem,
                                           start_n, keys, qcols, qk_scale, st_layout, op_layout, BLOCK_M, BLOCK_N,
                                           IS_CAUSAL, 0, A_IN_REGS)
            for i in range(lo, n_end - 1):
                slot = g % STAGES
                nslot = (g + 1) % STAGES
                buf = (i - lo) % 2
                mbarrier.wait(ready.index(nslot), ((g + 1) // STAGES) & 1)
                st_tok, dpt_tok = _issue_scores(k_buf, v_buf, q_smem.index(nslot), do_smem.index(nslot), st_init)
                dv_tok, dk_tok, dq_tok = _issue_grads(pt_op, ds_op, pt_smem.index(buf), ds_smem.index(buf),
                                                      q_smem.index(slot), do_smem.index(slot), k_buf, dv, dk,
                                                      dq_init, A_IN_REGS)
                # buffer 1 - buf was last read by tile i-1's matmuls, waited for in the last iteration
                pt_op, ds_op = _scores_to_smem(st_tok, dpt_tok, i + 1, nslot, 1 - buf, pt_smem, ds_smem, lse_smem,
                                               delta_smem, start_n, keys, qcols, qk_scale, st_layout, op_layout,
                                               BLOCK_M, BLOCK_N, IS_CAUSAL, 3, A_IN_REGS)
                dv, dk, dq = warpgroup_mma_wait(0, (dv_tok, dk_tok, dq_tok))
                mbarrier.arrive(empty.index(slot))
                _dq_out(dq, dq_smem, dq_full, dq_empty, g, DQ_STAGES)
                if KV_BUFFERS > 1:
                    if (i == lo) & (it > 0):
                        # the last key block's dK, dV stores ran beside this tile: wait for them, hand the buffer back
                        tma.store_wait(0)
                        mbarrier.arrive(kv_empty.index((it - 1) % KV_BUFFERS))
                g += 1
            slot = g % STAGES
            buf = (n_end - 1 - lo) % 2
            dv_tok, dk_tok, dq_tok = _issue_grads(pt_op, ds_op, pt_smem.index(buf), ds_smem.index(buf),
                                                  q_smem.index(slot), do_smem.index(slot), k_buf, dv, dk, dq_init,
                                                  A_IN_REGS)
            dv, dk, dq = warpgroup_mma_wait(0, (dv_tok, dk_tok, dq_tok))
            mbarrier.arrive(empty.index(slot))
            _dq_out(dq, dq_smem, dq_full, dq_empty, g, DQ_STAGES)
            g += 1

            # dK (times the softmax scale) and dV out by TMA through this key block's K and V buffers
            k_buf.store((dk * sm_scale).to(k_buf.dtype))
            v_buf.store(dv.to(v_buf.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [row0 + start_n, col], k_buf)
            tma.async_copy_shared_to_global(dv_desc, [row0 + start_n, col], v_buf)
            if KV_BUFFERS == 1:
                tma.store_wait(0)
                mbarrier.arrive(kv_empty.index(0))
            it += 1
    tma.store_wait(0)


@gluon.jit
def _bwd_pipelined_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, seqlen, nheads,
                          n_bh, qk_scale, sm_scale, head_group, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr,
                          KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
                          WARPS: gl.constexpr, ds_layout: gl.constexpr, A_IN_REGS: gl.constexpr):
    # G._bwd_kernel's buffers and barriers, with P^T and dS^T double-buffered (SPLIT tiles are not handled here)
    dtype: gl.constexpr = q_desc.dtype
    n_n = seqlen // BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    # P^T and dS^T, two tiles' each (P^T unused with A_IN_REGS)
    pt_smem = gl.allocate_shared_memory(dtype, [1 if A_IN_REGS else 2, BLOCK_N, BLOCK_M], ds_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_compute, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                    kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group,
                    qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED,
                    WARPS, A_IN_REGS)),
        (G._bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready,
                         empty, LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                         BLOCK_N, HEAD_DIM, STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED)),
        (G._bwd_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                            BLOCK_N, HEAD_DIM, DQ_STAGES, IS_CAUSAL, PAIRED))],
        [1, 1], [24, 24])


# (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, A_IN_REGS) per variant: the shipped tiles with the shipped ring and one slot
# deeper; dV's and dK's A operands (P^T, dS^T) from shared memory (0) or, as in the shipped kernel, registers (1)
VARIANTS = {64: [(64, 128, 3, 2, 0), (64, 128, 4, 2, 0), (64, 128, 3, 2, 1), (64, 128, 4, 2, 1)],
            128: [(64, 128, 2, 2, 0)]}


def _variant_name(tiles: tuple) -> str:
    return "pipelined_" + "_".join(map(str, tiles))


def backward(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, tiles: tuple | None = None,
             programs: int | None = None) -> None:
    """G.gluon_backward's contract and schedule (persistent at G.BWD_PERSISTENT_HEAD_DIMS, with G.BWD_KV_BUFFERS) on
    the pipelined kernel; tiles: (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, A_IN_REGS), VARIANTS's first by default."""
    batch, seqlen, nheads, head_dim = q.shape
    block_m, block_n, stages, dq_stages, a_in_regs = tiles or VARIANTS[head_dim][0]
    if block_n < 16 * G.BWD_WARPS:
        raise ValueError(f"pipeline_bwd: {block_n}-key tiles split across the warpgroups, which it does not handle")
    dqa = torch.zeros(batch, seqlen, nheads, head_dim, dtype=torch.float32, device=q.device)
    persistent = head_dim in G.BWD_PERSISTENT_HEAD_DIMS
    paired = causal and persistent
    grid = G._grid(seqlen // block_n, batch * nheads, paired, persistent, programs, q.device)
    lay = _layouts(block_m, block_n, head_dim, G._GL_DTYPES[q.dtype])
    queries = lambda t: G.head_tiles(t, block_m, lay["q_layout"])  # noqa: E731
    keys = lambda t: G.head_tiles(t, block_n, lay["kv_layout"])  # noqa: E731
    launch(_bwd_pipelined_kernel, grid,
           (queries(q), queries(do), keys(k), keys(v), keys(dk), keys(dv),
            G.head_tiles(dqa, block_m, lay["dqa_layout"]), lse, delta, seqlen, nheads, batch * nheads,
            softmax_scale * G.LOG2E, softmax_scale, G.launch_head_group(seqlen, causal)),
           dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                KV_BUFFERS=G.BWD_KV_BUFFERS[head_dim], IS_CAUSAL=causal, PAIRED=paired, WARPS=G.BWD_WARPS,
                ds_layout=lay["ds_layout"], A_IN_REGS=bool(a_in_regs), num_warps=G.BWD_WARPS))
    torch.mul(dqa, softmax_scale, out=dq)


def _layouts(block_m: int, block_n: int, head_dim: int, dtype) -> dict:
    """G.bwd_layouts's shared layouts, for any tiles."""
    return dict(q_layout=G._shared_layout(block_m, head_dim, dtype),
                kv_layout=G._shared_layout(block_n, head_dim, dtype),
                ds_layout=G._shared_layout(block_n, block_m, dtype),
                dqa_layout=G._shared_layout(block_m, head_dim, gl.float32))


# ------------------------------------------------------------------------------------------------------------- modes

def compile_report(head_dims, shipped: bool = True):
    """sm_90 resources of the shipped backward (unless shipped=False) and each pipelined variant, causal and not
    (PAIRED and KV_BUFFERS as gluon_backward launches them), with the SASS's wgmma count and ptxas's notes on wgmma it
    serialised."""
    import kernel_resources as R

    rows = []
    for head_dim in head_dims:
        runs = [("shipped", G._bwd_kernel, G.BWD_TILES[head_dim] + (None,))] if shipped else []
        runs += [(_variant_name(tiles), _bwd_pipelined_kernel, tiles) for tiles in VARIANTS[head_dim]]
        for name, kernel, tiles in runs:
            block_m, block_n, stages, dq_stages, a_in_regs = tiles
            lay = _layouts(block_m, block_n, head_dim, gl.bfloat16)
            desc = lambda r, name, t="bf16": R.tensordesc(t, [r, head_dim], lay[name])  # noqa: E731
            types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                         **{n: desc(block_n, "kv_layout") for n in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
                         dqa_desc=desc(block_m, "dqa_layout", "fp32"))
            for causal in (False, True):
                consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
                              DQ_STAGES=dq_stages, KV_BUFFERS=G.BWD_KV_BUFFERS[head_dim], IS_CAUSAL=causal,
                              PAIRED=causal and head_dim in G.BWD_PERSISTENT_HEAD_DIMS, WARPS=G.BWD_WARPS,
                              ds_layout=lay["ds_layout"],
                              **({} if a_in_regs is None else {"A_IN_REGS": bool(a_in_regs)}))
                r = R.resources(kernel, consts, G.BWD_WARPS, stages, sass=True, types=types)
                rows.append(dict(kernel=name, head_dim=head_dim, tiles=tiles, causal=causal, regs=r["regs"],
                                 stack=r["stack"], smem=r["smem"], fits=r["smem"] <= R.H100_SMEM_PER_BLOCK,
                                 hgmma=r["ops"].get("HGMMA", 0), local_loads=r["ops"].get("LDL", 0),
                                 local_stores=r["ops"].get("STL", 0),
                                 ptxas_notes=_ptxas_notes(kernel, consts, stages, types)))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _ptxas_notes(kernel, consts: dict, stages: int, types: dict) -> list[str]:
    """ptxas's warnings and "Potential Performance Loss" notes on the kernel's PTX for sm_90a, among them C7510 /
    C7511 / C7515: wgmma it serialised (each waited for before the next is issued), which would undo the overlap this
    kernel is for. (Checked on kernels.flash._fwd_kernel at (128, 128, 4, 3), where it reports C7511.)"""
    import os
    import subprocess
    import tempfile

    import kernel_resources as R
    import triton

    ptx = R.compile_sm90(kernel, consts, G.BWD_WARPS, stages, types).asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        err = subprocess.run([ptxas, "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True).stderr
    return [line.strip() for line in err.splitlines() if "arning" in line or "Performance" in line]


def _inputs(batch, seqlen, nheads, head_dim, causal, dtype=torch.bfloat16, seed=0):
    """q, k, v, dO and the forward's LSE and delta (gluon_forward's: the backward's own inputs)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(4))
    o, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen, device="cuda")
    G.gluon_forward(q, k, v, o, lse, head_dim ** -0.5 * G.LOG2E, causal)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    return q, k, v, do, lse, delta


def check(head_dims) -> int:
    """Gradients of each pipelined variant against the shipped Gluon backward on the same inputs: dK and dV bit for
    bit (the same tiles, the same order per key row), dQ within 2^-7 of its largest element (two TMA-reduce orders).
    Gradients start as NaN, so a key block no program wrote fails. Both masks; one query tile a key block (1 x 128
    causal: the pipeline's prologue and epilogue alone), an odd key-block count, 1, 7 or one-a-SM programs."""
    failures = 0
    cases = [(1, 128, 1, 64), (2, 640, 4, 64), (2, 1024, 4, 64), (8, 2048, 32, 64), (3, 640, 5, 128),
             (4, 4096, 16, 128)]
    for batch, seqlen, nheads, head_dim in cases:
        if head_dim not in head_dims:
            continue
        for causal in (False, True):
            q, k, v, do, lse, delta = _inputs(batch, seqlen, nheads, head_dim, causal)
            scale = head_dim ** -0.5
            ref = [torch.empty_like(q) for _ in range(3)]
            G.gluon_backward(do, q, k, v, lse, delta, *ref, scale, causal)
            for tiles in VARIANTS[head_dim]:
                for programs in (None, 1, 7):
                    got = [torch.full_like(q, float("nan")) for _ in range(3)]
                    backward(do, q, k, v, lse, delta, *got, scale, causal, tiles=tiles, programs=programs)
                    torch.cuda.synchronize()
                    dkdv_equal = torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
                    dq_err = ((got[0].float() - ref[0].float()).abs().max() / ref[0].float().abs().max()).item()
                    ok = dkdv_equal and dq_err <= 2 ** -7  # NaN compares unequal and fails here
                    print(json.dumps(dict(case=[batch, seqlen, nheads, head_dim], causal=causal, tiles=tiles,
                                          programs=programs, dkdv_bitwise=dkdv_equal, dq_rel_err=dq_err, ok=ok)),
                          flush=True)
                    failures += not ok
    print(f"check: {failures} case(s) differ")
    return failures


def bench(rounds: int, rep: int, head_dims, seqlens):
    """Backward ms of the shipped Gluon backward and each pipelined variant, 16K tokens a batch, heads x head dim =
    2048, in alternating order each round; the median round."""
    import triton.testing

    for head_dim in head_dims:
        nheads = 2048 // head_dim
        for causal in (False, True):
            for seqlen in seqlens:
                batch = 16384 // seqlen
                q, k, v, do, lse, delta = _inputs(batch, seqlen, nheads, head_dim, causal)
                grads = [torch.empty_like(q) for _ in range(3)]
                scale = head_dim ** -0.5
                fns = {"shipped": functools.partial(G.gluon_backward, do, q, k, v, lse, delta, *grads, scale, causal)}
                for tiles in VARIANTS[head_dim]:
                    fns[_variant_name(tiles)] = functools.partial(backward, do, q, k, v, lse, delta, *grads, scale,
                                                                  causal, tiles=tiles)
                for fn in fns.values():
                    fn()
                torch.cuda.synchronize()
                times = {name: [] for name in fns}
                for r in range(rounds):
                    for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                        times[name].append(triton.testing.do_bench(fns[name], rep=rep))
                med = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
                print(json.dumps(dict(head_dim=head_dim, causal=causal, seqlen=seqlen,
                                      ms={n: round(m, 4) for n, m in med.items()},
                                      vs_shipped={n: round(med["shipped"] / m, 4) for n, m in med.items()},
                                      rounds_ms={n: [round(x, 4) for x in t] for n, t in times.items()})),
                      flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--head-dims", type=int, nargs="+", default=None, help="default: 64 and 128 (compile), 64 (else)")
    ap.add_argument("--no-shipped", action="store_true", help="compile: the pipelined variants only")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    args = ap.parse_args()
    if args.mode == "compile":
        compile_report(args.head_dims or [64, 128], shipped=not args.no_shipped)
    elif args.mode == "check":
        sys.exit(1 if check(args.head_dims or [64]) else 0)
    else:
        bench(args.rounds, args.rep, args.head_dims or [64], args.seqlens)


if __name__ == "__main__":
    main()
