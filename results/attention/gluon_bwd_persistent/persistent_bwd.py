"""A persistent form of the Gluon backward (kernels/flash_gluon.py's `_bwd_kernel`), prepared on the CPU in session 34.

Why. The shipped backward runs one program per 128 keys of one (batch, head), one program a SM (133 KB of shared
memory at head dim 64, 214 KB at 128). What each program does once is exposed: at the start K and V's load and the
Q/dO ring's first fill, at the end dK and dV's conversion and store. A fit of head dim 64's times
(results/attention/gluon_bwd_stages/ab_h100.txt: 4096 programs at every length, 16 query tiles a program at 1K, 256
at 16K) puts that at ~3-8 us a program against ~1.7 us a query tile: 8-13% of the time at 2K, ~5% at 4K. The
session-34 forward+backward is 0.92-0.94x cuDNN at head dim 64 from 2K, and the backward is most of it.

What changes (the forward's persistent form, session 34, applied to the backward):
- one program a SM loops over work units (`_bwd_unit`); under a causal mask a unit is the pair of key blocks i and
  n_n-1-i of one head, whose query tiles add up to the same count for every pair, so a fixed round-robin is balanced;
- the loader keeps running ahead across key blocks: its Q/dO ring continues from one key block into the next, and with
  KV_BUFFERS = 2 it loads the next key block's K and V into a second buffer while this one's are in use;
- the compute warps release a K/V buffer once its dK and dV have left it (`tma.store_wait`), after the next key block's
  first query tile, so the store runs beside that tile;
- the dQ warp's ring continues across key blocks too.
Same tiles, the same operations per key row in the same order: dK and dV should equal the shipped kernel's bit for
bit; dQ is summed by TMA reduce in a varying order, as in the shipped kernel.

Shared memory: a second K/V buffer is 32 KB at head dim 64 (133 -> ~165 KB); at head dim 128 it does not fit beside
the shipped rings (214 + 64 KB), so there KV_BUFFERS = 1: only the Q/dO ring runs ahead, and the next K/V load waits
for this key block's dK/dV store.

Nothing in kernels/ uses this. Modes, from the repo root:

    python results/attention/gluon_bwd_persistent/persistent_bwd.py compile   # CPU: sm_90 registers, spills, smem
    python results/attention/gluon_bwd_persistent/persistent_bwd.py check     # GPU: gradients against gluon_backward
    python results/attention/gluon_bwd_persistent/persistent_bwd.py bench     # GPU: backward times, alternating rounds
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
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402
from kernels.launch import launch  # noqa: E402


@gluon.jit
def _bwd_unit(u, n_n, n_bh, head_group, PAIRED: gl.constexpr):
    """Work unit u: (batch x head, its first key block, its second, how many of the two it has). PAIRED (causal):
    key blocks i and n_n-1-i of one head, the longer (i: it sees the queries from its own on) first, units head by
    head. Otherwise one key block in the shipped launch order (`G._work_item`)."""
    if PAIRED:
        per_head = (n_n + 1) // 2
        bh = u // per_head
        i = u % per_head
        first = i
        second = n_n - 1 - i
        count = 2 - (2 * i + 1 == n_n).to(gl.int32)
    else:
        first, bh = G._work_item(u, n_n, n_bh, head_group)
        second = first
        count = 1
    return bh, first, second, count


@gluon.jit
def _n_units(n_n, n_bh, PAIRED: gl.constexpr):
    if PAIRED:
        return (n_n + 1) // 2 * n_bh
    else:
        return n_n * n_bh


@gluon.jit
def _key_block(bh, pid_n, nheads, seqlen, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
               IS_CAUSAL: gl.constexpr):
    """Key block pid_n of (batch x head) bh: (start_n, first query tile, query tiles end, first row, column, offset of
    its LSE / delta rows)."""
    start_n = pid_n * BLOCK_N
    lo = start_n // BLOCK_M if IS_CAUSAL else 0  # query tiles that see any of these keys (seqlen_q == seqlen_k)
    return start_n, lo, seqlen // BLOCK_M, (bh // nheads) * seqlen, (bh % nheads) * HEAD_DIM, bh.to(gl.int64) * seqlen


@gluon.jit
def _loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready, empty, LSE,
            DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr,
            IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    KV_BYTES: gl.constexpr = BLOCK_N * HEAD_DIM * k_smem.dtype.primitive_bitwidth // 8
    TILE_BYTES: gl.constexpr = BLOCK_M * HEAD_DIM * q_smem.dtype.primitive_bitwidth // 8
    it = 0  # key blocks done by this program
    g = 0  # query tiles loaded so far, over all key blocks: the ring's position
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _bwd_unit(u, n_n, n_bh, head_group, PAIRED)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            kb = it % KV_BUFFERS
            # buffer kb held key block it - KV_BUFFERS until its dK, dV were stored; a fresh barrier passes parity 1
            mbarrier.wait(kv_empty.index(kb), ((it // KV_BUFFERS) & 1) ^ 1)
            mbarrier.expect(kv_ready.index(kb), 2 * KV_BYTES)
            tma.async_copy_global_to_shared(k_desc, [row0 + start_n, col], kv_ready.index(kb), k_smem.index(kb))
            tma.async_copy_global_to_shared(v_desc, [row0 + start_n, col], kv_ready.index(kb), v_smem.index(kb))
            for i in range(lo, n_end):
                slot = g % STAGES
                mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)
                # LSE_i and delta_i stored before the expect's arrive, which releases them with the tile
                offs = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, G._row_layout(BLOCK_M)))[None, :]
                lse_smem.index(slot).store(gl.load(LSE + stat_base + offs))
                delta_smem.index(slot).store(gl.load(DELTA + stat_base + offs))
                mbarrier.expect(ready.index(slot), 2 * TILE_BYTES)
                tma.async_copy_global_to_shared(q_desc, [row0 + i * BLOCK_M, col], ready.index(slot),
                                                q_smem.index(slot))
                tma.async_copy_global_to_shared(do_desc, [row0 + i * BLOCK_M, col], ready.index(slot),
                                                do_smem.index(slot))
                g += 1
            it += 1


@gluon.jit
def _dq_writer(dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
               PAIRED: gl.constexpr):
    g = 0
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _bwd_unit(u, n_n, n_bh, head_group, PAIRED)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            for i in range(lo, n_end):
                s = g % DQ_STAGES
                mbarrier.wait(dq_full.index(s), (g // DQ_STAGES) & 1)
                G.tma_reduce_add_shared(dqa_desc, [row0 + i * BLOCK_M, col], dq_smem.index(s))
                tma.store_wait(0)  # the TMA unit has read the slot
                mbarrier.arrive(dq_empty.index(s))
                g += 1


@gluon.jit
def _compute(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem, delta_smem,
             kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, qk_scale,
             sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
             WARPS: gl.constexpr, SPLIT: gl.constexpr):
    st_layout: gl.constexpr = G._tile_layout(WARPS, BLOCK_N, BLOCK_M)
    kv_acc_layout: gl.constexpr = G._tile_layout(WARPS, BLOCK_N, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_acc_layout, k_width=2)
    dq_layout: gl.constexpr = G._tile_layout(WARPS, BLOCK_M, HEAD_DIM)
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    it = 0
    g = 0
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _bwd_unit(u, n_n, n_bh, head_group, PAIRED)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            kb = it % KV_BUFFERS
            k_buf = k_smem.index(kb)
            v_buf = v_smem.index(kb)
            keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            mbarrier.wait(kv_ready.index(kb), (it // KV_BUFFERS) & 1)
            for i in range(lo, n_end):
                slot = g % STAGES
                mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
                lse = lse_smem.index(slot).load(st_layout)
                delta = delta_smem.index(slot).load(st_layout)
                dv, dk, dq = G._bwd_tile(k_buf, v_buf, q_smem.index(slot), do_smem.index(slot), pt_smem, ds_smem, lse,
                                         delta, i, start_n, keys, qcols, st_init, dq_init, dv, dk, qk_scale, op_layout,
                                         BLOCK_M, BLOCK_N, IS_CAUSAL, SPLIT)
                mbarrier.arrive(empty.index(slot))
                if KV_BUFFERS > 1:
                    if (i == lo) & (it > 0):
                        # the last key block's dK, dV stores ran beside this tile: wait for them, hand the buffer back
                        tma.store_wait(0)
                        mbarrier.arrive(kv_empty.index((it - 1) % KV_BUFFERS))
                s = g % DQ_STAGES
                mbarrier.wait(dq_empty.index(s), ((g // DQ_STAGES) & 1) ^ 1)
                dq_smem.index(s).store(dq)
                fence_async_shared()
                mbarrier.arrive(dq_full.index(s))
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
def _bwd_persistent_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, seqlen, nheads,
                           n_bh, qk_scale, sm_scale, head_group, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr,
                           KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
                           WARPS: gl.constexpr, ds_layout: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    n_n = seqlen // BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    SPLIT: gl.constexpr = BLOCK_N < 16 * WARPS  # see G._tile_layout and G._bwd_tile
    if SPLIT:
        pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    else:  # not read: P^T stays in registers
        pt_smem = ds_smem
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
    # the argument tuples are written out in the call (a named tuple turns constexprs into tensors)
    gl.warp_specialize([
        (_compute, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem,
                    delta_smem, kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen,
                    head_group, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS,
                    IS_CAUSAL, PAIRED, WARPS, SPLIT)),
        (_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready, empty,
                   LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M, BLOCK_N,
                   HEAD_DIM, STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED)),
        (_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M, BLOCK_N,
                      HEAD_DIM, DQ_STAGES, IS_CAUSAL, PAIRED))],
        [1, 1], [24, 24])


# Variants per head dim: KV_BUFFERS 2 where a second K/V buffer fits beside the shipped rings (head dim 64), else 1;
# at head dim 128 also 64-key tiles (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES) = (64, 64, 2, 2), whose two K/V buffers fit
# (214 KB) and which compile without spills (the shipped 128-key tiles spill 24-64 bytes): added after session 34's
# GPU run, not yet timed
VARIANTS = {64: [dict(kv_buffers=2), dict(kv_buffers=1)],
            128: [dict(kv_buffers=1), dict(kv_buffers=2, tiles=(64, 64, 2, 2))]}


def _variant_name(var: dict) -> str:
    return f"persistent_kv{var['kv_buffers']}" + ("_tiles" + "_".join(map(str, var["tiles"])) if "tiles" in var else "")


def _layouts(block_m: int, block_n: int, head_dim: int, dtype) -> dict:
    """G.bwd_layouts's shared layouts, for any tiles."""
    return dict(q_layout=G._shared_layout(block_m, head_dim, dtype),
                kv_layout=G._shared_layout(block_n, head_dim, dtype), ds_layout=G._shared_layout(block_n, block_m, dtype),
                dqa_layout=G._shared_layout(block_m, head_dim, gl.float32))


def backward(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, kv_buffers: int | None = None,
             programs: int | None = None, persistent: bool = True, tiles: tuple | None = None) -> None:
    """G.gluon_backward's contract on the persistent kernel: min(units, SMs) programs (or `programs`), or with
    persistent=False one unit a program (pairs off: the shipped schedule); tiles: (BLOCK_M, BLOCK_N, STAGES,
    DQ_STAGES) instead of G.BWD_TILES's."""
    batch, seqlen, nheads, head_dim = q.shape
    dqa = torch.zeros(batch, seqlen, nheads, head_dim, dtype=torch.float32, device=q.device)
    block_m, block_n, stages, dq_stages = tiles or G.BWD_TILES[head_dim]
    kvb = kv_buffers or VARIANTS[head_dim][0]["kv_buffers"]
    paired = causal and persistent
    n_n = seqlen // block_n
    units = ((n_n + 1) // 2 if paired else n_n) * batch * nheads
    grid = min(units, programs or G._sm_count(q.device.index)) if persistent else units
    lay = _layouts(block_m, block_n, head_dim, G._GL_DTYPES[q.dtype])
    queries = lambda t: G.head_tiles(t, block_m, lay["q_layout"])  # noqa: E731
    keys = lambda t: G.head_tiles(t, block_n, lay["kv_layout"])  # noqa: E731
    launch(_bwd_persistent_kernel, (grid,),
           (queries(q), queries(do), keys(k), keys(v), keys(dk), keys(dv),
            G.head_tiles(dqa, block_m, lay["dqa_layout"]), lse, delta, seqlen, nheads, batch * nheads,
            softmax_scale * G.LOG2E, softmax_scale, G.launch_head_group(seqlen, causal)),
           dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                KV_BUFFERS=kvb, IS_CAUSAL=causal, PAIRED=paired, WARPS=G.BWD_WARPS, ds_layout=lay["ds_layout"],
                num_warps=G.BWD_WARPS))
    torch.mul(dqa, softmax_scale, out=dq)


# ------------------------------------------------------------------------------------------------------------- modes

def compile_report():
    """sm_90 resources of the shipped backward and each persistent variant, head dims 64 and 128 (and 128 with
    64-key tiles), causal and not."""
    import kernel_resources as R

    rows = []
    for head_dim, tiles, kv_buffers in ((64, G.BWD_TILES[64], (1, 2)), (128, G.BWD_TILES[128], (1, 2)),
                                        (128, (64, 64, 2, 2), (1, 2))):
        block_m, block_n, stages, dq_stages = tiles
        lay = _layouts(block_m, block_n, head_dim, gl.bfloat16)
        desc = lambda r, name, t="bf16": R.tensordesc(t, [r, head_dim], lay[name])  # noqa: E731
        types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                     **{n: desc(block_n, "kv_layout") for n in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
                     dqa_desc=desc(block_m, "dqa_layout", "fp32"))
        for causal in (False, True):
            consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                          IS_CAUSAL=causal, WARPS=G.BWD_WARPS, ds_layout=lay["ds_layout"])
            runs = [("shipped", G._bwd_kernel, consts)] if tiles == G.BWD_TILES[head_dim] else []
            runs += [(f"persistent, {kvb} K/V buffer(s)", _bwd_persistent_kernel,
                      dict(consts, KV_BUFFERS=kvb, PAIRED=causal)) for kvb in kv_buffers]
            for name, kernel, kconsts in runs:
                r = R.resources(kernel, kconsts, G.BWD_WARPS, stages, sass=True, types=types)
                rows.append(dict(kernel=name, head_dim=head_dim, tiles=tiles, causal=causal, regs=r["regs"],
                                 stack=r["stack"], smem=r["smem"], fits=r["smem"] <= R.H100_SMEM_PER_BLOCK,
                                 hgmma=r["ops"].get("HGMMA", 0)))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _inputs(batch, seqlen, nheads, head_dim, causal, dtype=torch.bfloat16, seed=0):
    """q, k, v, dO and the forward's O, LSE and delta (gluon_forward's: the backward's own inputs)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(4))
    o, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen, device="cuda")
    G.gluon_forward(q, k, v, o, lse, head_dim ** -0.5 * G.LOG2E, causal)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    return q, k, v, do, lse, delta


def check():
    """Gradients of the persistent kernel against the shipped Gluon backward on the same inputs: dK and dV bit for
    bit (the same tiles, the same order per key row), dQ within 2^-7 of its largest element (two TMA-reduce orders).
    Gradients start as NaN, so a key block no program wrote fails. Head dims 64 and 128, both masks, an odd key-block
    count (a lone middle unit), 1 and 7 programs and one a SM, each KV_BUFFERS that fits, and one unit a program."""
    failures = 0
    cases = [(1, 128, 1, 64), (2, 640, 4, 64), (2, 1024, 4, 64), (8, 2048, 32, 64), (3, 640, 5, 128),
             (4, 4096, 16, 128)]
    for batch, seqlen, nheads, head_dim in cases:
        for causal in (False, True):
            q, k, v, do, lse, delta = _inputs(batch, seqlen, nheads, head_dim, causal)
            scale = head_dim ** -0.5
            ref = [torch.empty_like(q) for _ in range(3)]
            G.gluon_backward(do, q, k, v, lse, delta, *ref, scale, causal)
            variants = [dict(var, programs=p) for var in VARIANTS[head_dim] for p in (None, 1, 7)]
            variants.append(dict(persistent=False))
            for var in variants:
                got = [torch.full_like(q, float("nan")) for _ in range(3)]
                backward(do, q, k, v, lse, delta, *got, scale, causal, **var)
                torch.cuda.synchronize()
                dkdv_equal = torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
                dq_err = ((got[0].float() - ref[0].float()).abs().max() / ref[0].float().abs().max()).item()
                ok = dkdv_equal and dq_err <= 2 ** -7  # NaN compares unequal and fails here
                print(json.dumps(dict(case=[batch, seqlen, nheads, head_dim], causal=causal, **var,
                                      dkdv_bitwise=dkdv_equal, dq_rel_err=dq_err, ok=ok)), flush=True)
                failures += not ok
    print(f"check: {failures} case(s) differ")
    return failures


def bench(rounds: int, rep: int, head_dims, seqlens):
    """Backward ms of the shipped Gluon backward and the persistent one (each KV_BUFFERS, and one unit a program),
    16K tokens a batch, heads x head dim = 2048, in alternating order each round; the median round."""
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
                for var in VARIANTS[head_dim]:
                    fns[_variant_name(var)] = functools.partial(backward, do, q, k, v, lse, delta, *grads, scale,
                                                                causal, **var)
                fns["one_unit"] = functools.partial(backward, do, q, k, v, lse, delta, *grads, scale, causal,
                                                    persistent=False)
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
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    args = ap.parse_args()
    if args.mode == "compile":
        compile_report()
    elif args.mode == "check":
        sys.exit(1 if check() else 0)
    else:
        bench(args.rounds, args.rep, args.head_dims, args.seqlens)


if __name__ == "__main__":
    main()
