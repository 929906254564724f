"""Experiment: where the block-sparse backward loses to FlexAttention at head dim 128, and which
kernel variants close the gap. Times each backward kernel alone (CUDA events via do_bench) for
variants of the dK/dV and dQ loops, and FlexAttention's kernels through the profiler, on one GPU in
one process. Not part of the library; results/blocksparse/bwd_variants.md records a run.

    python scripts/exp_blocksparse_bwd.py --out results/blocksparse --tag bwd_variants
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kernels.blocksparse import compress_layout  # noqa: E402
from kernels.flash import LOG2E, bwd_preprocess, load_tile  # noqa: E402


@triton.jit
def _dkdv_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, start_m, offs_m, cols,
               offs_d, seqlen_q, diag, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               MASK_CAUSAL: tl.constexpr, MASK_ROWS: tl.constexpr, DV_FIRST: tl.constexpr, QT_PTR: tl.constexpr):
    rows = start_m + offs_m
    if QT_PTR:
        qt_ptrs = q_base + rows[None, :].to(tl.int64) * stride_qm + offs_d[:, None]
        if MASK_ROWS:
            qT = tl.load(qt_ptrs, mask=rows[None, :] < seqlen_q, other=0.0)
        else:
            qT = tl.load(qt_ptrs)
    else:
        qT = tl.trans(load_tile(q_base, stride_qm, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, MASK_ROWS))
    if MASK_ROWS:
        lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
    else:
        lse = tl.load(lse_base + rows)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    qkT = tl.dot(k, qT)
    pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
    if MASK_CAUSAL:
        pT = tl.where(cols[:, None] <= rows[None, :] + diag, pT, 0.0)
    do = load_tile(do_base, stride_dom, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, MASK_ROWS)
    if DV_FIRST:
        dv = tl.dot(pT.to(do.dtype), do, dv)
        if MASK_ROWS:
            delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
        else:
            delta = tl.load(delta_base + rows)
        dpT = tl.dot(v, tl.trans(do))
    else:
        if MASK_ROWS:
            delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
        else:
            delta = tl.load(delta_base + rows)
        dpT = tl.dot(v, tl.trans(do))
        dv = tl.dot(pT.to(do.dtype), do, dv)
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, COL_FULL, COL_PART, COL_IDX,
                 stride_qm, stride_qh, stride_qb, stride_kn, stride_kh, stride_kb, stride_lh,
                 stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k, sm_scale, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 MASK_FULL: tl.constexpr, DV_FIRST: tl.constexpr, QT_PTR: tl.constexpr, GROUP_C: tl.constexpr):
    # q / do / dk / dv share strides (same layout); lse / delta (B, H, N) contiguous.
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    nheads_k = nheads // group
    b = bhk // nheads_k
    hk = bhk % nheads_k
    b64 = b.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + b64 * stride_kb + hk * stride_kh, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, True)
    v = load_tile(V + b64 * stride_kb + hk * stride_kh, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    n_groups = group
    if GROUP_C > 0:
        n_groups = GROUP_C
    for g in range(0, n_groups):
        h = hk * n_groups + g
        q_base = Q + b64 * stride_qb + h * stride_qh
        do_base = DO + b64 * stride_qb + h * stride_qh
        lse_base = LSE + (b64 * nheads + h) * stride_lh
        delta_base = DELTA + (b64 * nheads + h) * stride_lh
        lay = h * stride_lay_h + pid_n
        n_full = tl.load(COL_FULL + lay)
        n_part = tl.load(COL_PART + lay)
        idx_ptr = COL_IDX + lay.to(tl.int64) * idx_width
        for t in range(0, n_full):
            start_m = tl.load(idx_ptr + t) * BLOCK_M
            dk, dv = _dkdv_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qm, start_m,
                                offs_m, cols, offs_d, seqlen_q, diag, qk_scale, HEAD_DIM, BLOCK_D, False, MASK_FULL,
                                DV_FIRST, QT_PTR)
        for t in range(n_full, n_full + n_part):
            start_m = tl.load(idx_ptr + t) * BLOCK_M
            dk, dv = _dkdv_step(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qm, start_m,
                                offs_m, cols, offs_d, seqlen_q, diag, qk_scale, HEAD_DIM, BLOCK_D, False, True,
                                DV_FIRST, QT_PTR)
    dk = dk * sm_scale
    ok = cols[:, None] < seqlen_k
    rows64 = cols[:, None].to(tl.int64)
    tl.store(DK + b64 * stride_kb + hk * stride_kh + rows64 * stride_kn + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=ok)
    tl.store(DV + b64 * stride_kb + hk * stride_kh + rows64 * stride_kn + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=ok)


@triton.jit
def _dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, ROW_FULL, ROW_PART, ROW_IDX,
               stride_qm, stride_qh, stride_qb, stride_kn, stride_kh, stride_kb, stride_lh,
               stride_lay_h, idx_width, nheads, group, seqlen_q, seqlen_k, sm_scale, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               KT_PTR: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    b64 = b.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b64 * stride_qb + h * stride_qh, stride_qm, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + b64 * stride_qb + h * stride_qh, stride_qm, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, True)
    lse = tl.load(LSE + (b64 * nheads + h) * stride_lh + rows, mask=rows < seqlen_q, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(DELTA + (b64 * nheads + h) * stride_lh + rows, mask=rows < seqlen_q, other=0.0)
    k_base = K + b64 * stride_kb + (h // group) * stride_kh
    v_base = V + b64 * stride_kb + (h // group) * stride_kh
    lay = h * stride_lay_h + pid_m
    n_full = tl.load(ROW_FULL + lay)
    idx_ptr = ROW_IDX + lay.to(tl.int64) * idx_width
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for t in range(0, n_full):  # the experiment's layouts have full tiles only
        start_n = tl.load(idx_ptr + t) * BLOCK_N
        cols = start_n + offs_n
        if KT_PTR:
            kT = tl.load(k_base + cols[None, :].to(tl.int64) * stride_kn + offs_d[:, None])
            vT = tl.load(v_base + cols[None, :].to(tl.int64) * stride_kn + offs_d[:, None])
            qk = tl.dot(q, kT)
            p = tl.math.exp2(qk * qk_scale - lse[:, None])
            dp = tl.dot(do, vT)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq)
        else:
            k = load_tile(k_base, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, False)
            v = load_tile(v_base, stride_kn, cols, offs_d, seqlen_k, HEAD_DIM, BLOCK_D, False)
            qk = tl.dot(q, tl.trans(k))
            p = tl.math.exp2(qk * qk_scale - lse[:, None])
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq)
    dq = dq * sm_scale
    tl.store(DQ + b64 * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=rows[:, None] < seqlen_q)


def bench(fn, rep):
    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def profile_kernels(fn, iters=10):
    """{kernel name: mean CUDA ms per call of fn} from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count >= iters:
            out[e.key[:90]] = round(t / 1000 / iters, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:12])


def run_case(n, d, rep, log):
    from kernels.blocksparse import blocksparse_attn_func
    from kernels.sparsity import butterfly

    B, H = max(1, 16384 // n), 2048 // d
    lay = butterfly(n, n, 128, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    res = dict(seqlen=n, headdim=d, batch=B, nheads=H, density=round(lay.density(), 4), kernels={})
    for mem in ("bnhd", "bhnd"):
        raw = [torch.randn(B, n, H, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        if mem == "bhnd":  # (b, h, n, d) storage seen through a (b, n, h, d) view, as FlexAttention reads it
            raw = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in raw]
        q, k, v, do = raw
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        out = blocksparse_attn_func(q, k, v, lay)
        out.backward(do)
        fwd = bench(lambda: blocksparse_attn_func(q, k, v, lay), rep)
        fb = triton.testing.do_bench(lambda: blocksparse_attn_func(q, k, v, lay).backward(do), warmup=10, rep=rep,
                                     grad_to_none=[q, k, v], return_mode="median")
        res[f"ours_{mem}_fwd"], res[f"ours_{mem}_fwdbwd"] = round(fwd, 4), round(fb, 4)
        log(f"n={n} d={d} {mem}: ours fwd {fwd:.3f} fwd+bwd {fb:.3f} ms")
        res[f"ours_{mem}_profile"] = profile_kernels(
            lambda: blocksparse_attn_func(q, k, v, lay).backward(do))
        log(f"  profile {res[f'ours_{mem}_profile']}")
        if mem == "bhnd":
            # variant kernels, timed alone on the same saved state
            from kernels.blocksparse import _bs_forward

            qd, kd, vd = q.detach(), k.detach(), v.detach()
            o, lse, _ = _bs_forward(qd, kd, vd, lay, False, 1 / math.sqrt(d), 0.0)
            delta = bwd_preprocess(o, do)
            dk, dv, dq = torch.empty_like(kd), torch.empty_like(vd), torch.empty_like(qd)
            res["preprocess_ms"] = round(bench(lambda: bwd_preprocess(o, do), rep), 4)
            sm = 1 / math.sqrt(d)
            variants = []
            for tile in [(64, 64, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 4, 3), (128, 128, 8, 2)]:
                for flags in [(True, False, False, 0), (False, False, False, 0), (False, True, False, 0),
                              (False, False, True, 0), (False, False, False, 1), (False, True, True, 1)]:
                    variants.append(("dkdv", tile, flags))
            for tile in [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)]:
                for flags in [(False,), (True,)]:
                    variants.append(("dq", tile, flags))
            for kind, (bm, bn, w, s), flags in variants:
                tab = compress_layout(lay, n, n, False, bm, bn, q.device)
                try:
                    if kind == "dkdv":
                        mf, dvf, qtp, gc = flags

                        def launch():
                            _dkdv_kernel[(triton.cdiv(n, bn), B * H)](
                                qd, kd, vd, do, dk, dv, lse, delta, tab.col_full, tab.col_part, tab.col_idx,
                                qd.stride(1), qd.stride(2), qd.stride(0), kd.stride(1), kd.stride(2), kd.stride(0),
                                lse.stride(1), tab.col_full.stride(0) if tab.col_full.shape[0] > 1 else 0,
                                tab.col_idx.shape[-1], H, 1, n, n, sm, sm * LOG2E,
                                HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn, MASK_FULL=mf, DV_FIRST=dvf,
                                QT_PTR=qtp, GROUP_C=gc, num_warps=w, num_stages=s)
                    else:
                        (ktp,) = flags

                        def launch():
                            _dq_kernel[(triton.cdiv(n, bm), B * H)](
                                qd, kd, vd, do, dq, lse, delta, tab.row_full, tab.row_part, tab.row_idx,
                                qd.stride(1), qd.stride(2), qd.stride(0), kd.stride(1), kd.stride(2), kd.stride(0),
                                lse.stride(1), tab.row_full.stride(0) if tab.row_full.shape[0] > 1 else 0,
                                tab.row_idx.shape[-1], H, 1, n, n, sm, sm * LOG2E,
                                HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn, KT_PTR=ktp, num_warps=w, num_stages=s)
                    launch()
                    ms = bench(launch, rep)
                except Exception as e:  # resources
                    log(f"  {kind} {(bm, bn, w, s)} {flags}: failed {type(e).__name__}: {str(e)[:120]}")
                    continue
                key = f"{kind} {(bm, bn, w, s)} {flags}"
                res["kernels"][key] = round(ms, 4)
                log(f"  {key}: {ms:.4f} ms")
    # FlexAttention, same layout, (b, h, n, d) storage
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    buf = lay.blocks[0].clone()

    def mask_mod(bi, hi, qi, ki):
        return buf[qi // 128, ki // 128]

    bm = create_block_mask(mask_mod, None, None, n, n, device="cuda", BLOCK_SIZE=128, _compile=True)
    fx = torch.compile(flex_attention, dynamic=False)
    q, k, v, do = (torch.randn(B, H, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fx(q, k, v, block_mask=bm).backward(do)
    res["flex_fwd"] = round(bench(lambda: fx(q, k, v, block_mask=bm), rep), 4)
    res["flex_fwdbwd"] = round(triton.testing.do_bench(lambda: fx(q, k, v, block_mask=bm).backward(do), warmup=10,
                                                       rep=rep, grad_to_none=[q, k, v], return_mode="median"), 4)
    res["flex_profile"] = profile_kernels(lambda: fx(q, k, v, block_mask=bm).backward(do))
    log(f"n={n} d={d}: flex fwd {res['flex_fwd']:.3f} fwd+bwd {res['flex_fwdbwd']:.3f}; profile {res['flex_profile']}")
    return res


_BWD_SETS = [(64, 64, 64, 64, 4, 3), (64, 64, 64, 64, 4, 2), (64, 128, 128, 128, 8, 2), (64, 128, 128, 64, 8, 3),
             (32, 128, 64, 64, 4, 3)]
MODE_CONFIGS = {
    # first run (bwd_modes.log): every backward launch mode x tile set, forward tiles as in TILES then
    "modes": {d: [(f, b, m) for b in _BWD_SETS for m in ("split", "streams", "fused")]
              for d, f in ((64, (64, 64, 4, 3)), (128, (128, 128, 8, 3)))},
    # second run (bwd_modes2.log): head dim 128, forward tiles and a few more backward tiles
    "d128": {128: [((128, 128, 8, 3), (64, 128, 128, 128, 8, 2), "fused"),
                   ((128, 64, 8, 3), (64, 128, 128, 128, 8, 2), "fused"),
                   ((128, 64, 4, 3), (64, 128, 128, 128, 8, 2), "fused"),
                   ((64, 128, 4, 3), (64, 128, 128, 128, 8, 2), "fused"),
                   ((128, 128, 8, 3), (64, 128, 128, 128, 8, 1), "fused"),
                   ((128, 128, 8, 3), (64, 128, 128, 64, 8, 2), "fused"),
                   ((128, 128, 8, 3), (64, 128, 64, 128, 8, 2), "fused"),
                   ((128, 128, 8, 3), (128, 128, 128, 128, 8, 1), "fused"),
                   ((128, 128, 8, 3), (64, 128, 128, 128, 8, 2), "streams"),
                   ((128, 128, 8, 3), (64, 64, 64, 64, 4, 2), "streams"),
                   ((128, 128, 8, 3), (64, 64, 64, 64, 4, 2), "split")]},
}
# third run (bwd_prefetch.log): tile indices loaded one iteration ahead (kernels/blocksparse._next_tile)
MODE_CONFIGS["prefetch"] = {
    d: [(f, b, m, pf) for f, b, m in sets for pf in (False, True)]
    for d, sets in ((64, [((64, 64, 4, 3), (64, 64, 64, 64, 4, 2), "split"),
                          ((64, 64, 4, 3), (64, 64, 64, 64, 4, 3), "split"),
                          ((64, 64, 4, 3), (64, 64, 64, 64, 4, 2), "streams")]),
                    (128, [((128, 128, 8, 3), (64, 128, 128, 128, 8, 2), "fused"),
                           ((128, 128, 8, 3), (64, 128, 128, 64, 8, 3), "fused"),
                           ((128, 128, 8, 3), (64, 64, 64, 64, 4, 3), "streams"),
                           ((128, 128, 8, 3), (64, 64, 64, 64, 4, 2), "streams")]))}


def run_modes(n, d, rep, log, configs="modes"):
    """fwd+bwd through the library for each backward launch mode and tile set, FlexAttention beside."""
    import kernels.blocksparse as Bs
    from kernels.sparsity import butterfly

    B, H = max(1, 16384 // n), 2048 // d
    lay = butterfly(n, n, 128, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, n, H, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    res = {}
    saved = dict(Bs.TILES[d]), Bs.BWD_MODE
    saved_pf = Bs.PREFETCH_INDEX
    for fwd_tiles, bwd_tiles, mode, *pf in MODE_CONFIGS[configs][d]:
        Bs.TILES[d]["fwd"], Bs.TILES[d]["bwd"], Bs.BWD_MODE = fwd_tiles, bwd_tiles, mode
        Bs.PREFETCH_INDEX = pf[0] if pf else False
        mode = mode + ("" if not pf else (" prefetch" if pf[0] else " no-prefetch"))
        try:
            Bs.blocksparse_attn_func(q, k, v, lay).backward(do)
            fwd = triton.testing.do_bench(lambda: Bs.blocksparse_attn_func(q, k, v, lay), warmup=10, rep=rep,
                                          return_mode="median")
            ms = triton.testing.do_bench(lambda: Bs.blocksparse_attn_func(q, k, v, lay).backward(do), warmup=10,
                                         rep=rep, grad_to_none=[q, k, v], return_mode="median")
        except Exception as e:
            log(f"  modes n={n} d={d} {mode} {fwd_tiles} {bwd_tiles}: failed {type(e).__name__}")
            continue
        res[f"{mode} {fwd_tiles} {bwd_tiles}"] = dict(fwd=round(fwd, 4), fwdbwd=round(ms, 4))
        log(f"  modes n={n} d={d} {mode:7s} fwd {fwd_tiles} bwd {bwd_tiles}: fwd {fwd:.4f} fwd+bwd {ms:.4f} ms")
    Bs.TILES[d].update(saved[0])
    Bs.BWD_MODE, Bs.PREFETCH_INDEX = saved[1], saved_pf
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    buf = lay.blocks[0].clone()
    bm = create_block_mask(lambda bi, hi, qi, ki: buf[qi // 128, ki // 128], None, None, n, n, device="cuda",
                           BLOCK_SIZE=128, _compile=True)
    fx = torch.compile(flex_attention, dynamic=False)
    qf, kf, vf, dof = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v, do))
    qf.requires_grad_(), kf.requires_grad_(), vf.requires_grad_()
    fx(qf, kf, vf, block_mask=bm).backward(dof)
    res["flex"] = round(triton.testing.do_bench(lambda: fx(qf, kf, vf, block_mask=bm).backward(dof), warmup=10,
                                                rep=rep, grad_to_none=[qf, kf, vf], return_mode="median"), 4)
    res["flex_fwd"] = round(triton.testing.do_bench(lambda: fx(qf, kf, vf, block_mask=bm), warmup=10, rep=rep,
                                                    return_mode="median"), 4)
    log(f"  modes n={n} d={d} flex fwd {res['flex_fwd']:.4f} fwd+bwd {res['flex']:.4f} ms")
    return res


def doubly_balanced(n, density, seed=0, device="cuda"):
    """(1, nb, nb) bool with exactly k = round(density * nb) blocks in every row and every column: row i
    keeps columns perm[(i + s) % nb] for s in a random k-subset, rows then shuffled."""
    from kernels.sparsity import BlockSparseLayout, cdiv

    nb = cdiv(n, 128)
    keep = max(1, round(density * nb))
    g = torch.Generator().manual_seed(seed)
    perm, shifts, rows = torch.randperm(nb, generator=g), torch.randperm(nb, generator=g)[:keep], torch.randperm(nb, generator=g)
    blocks = torch.zeros(nb, nb, dtype=torch.bool)
    i = torch.arange(nb).unsqueeze(1)
    blocks[i, perm[(i + shifts.unsqueeze(0)) % nb]] = True
    return BlockSparseLayout(blocks[rows].unsqueeze(0).to(device), 128, n, n)


def run_layouts(n, d, rep, log, specs, rounds=1):
    """fwd+bwd at one size for several layouts (kind:density:seed, kind random = rows balanced as in
    bench_blocksparse, doubly = rows and columns balanced), ours with the fused and split backward (and,
    at head dim 128, head dim 64's smaller tiles), FlexAttention beside, in one process; with rounds > 1
    every variant is timed once per round, interleaved, and the median kept. (Run bwd_layouts also timed
    a longest-first program order, FLASH_BS_ORDER=1 at commit 86af0a4: 2-7% slower, since removed.)"""
    import statistics

    import kernels.blocksparse as Bs
    from bench_blocksparse import balanced_random, capture_graph, flex_fn

    B, H = max(1, 16384 // n), 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, n, H, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    qf, kf, vf, dof = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v, do))
    qf.requires_grad_(), kf.requires_grad_(), vf.requires_grad_()
    saved_mode, saved_bwd = Bs.BWD_MODE, Bs.TILES[d]["bwd"]
    variants = [("fused", saved_bwd), ("split", saved_bwd)]
    if d == 128:
        variants += [("split", (64, 64, 64, 64, 4, 3)), ("fused", (64, 64, 64, 64, 4, 3))]
    res = {}
    for spec in specs:
        kind, dens, seed = spec.split(":")
        make = balanced_random if kind == "random" else doubly_balanced
        lay = make(n, float(dens), int(seed))
        colc = lay.blocks[0].sum(0).float()
        out = dict(col_mean=round(colc.mean().item(), 2), col_max=int(colc.max()), col_min=int(colc.min()))
        fx = flex_fn(lay, B, H, n)
        times = {}
        for _ in range(rounds):
            for mode, tiles in variants:
                Bs.BWD_MODE, Bs.TILES[d]["bwd"] = mode, tiles
                Bs.blocksparse_attn_func(q, k, v, lay).backward(do)
                ms = triton.testing.do_bench(lambda: Bs.blocksparse_attn_func(q, k, v, lay).backward(do),
                                             warmup=10, rep=rep, grad_to_none=[q, k, v], return_mode="median")
                times.setdefault(mode if tiles == saved_bwd else f"{mode} {tiles}", []).append(ms)
            Bs.BWD_MODE, Bs.TILES[d]["bwd"] = saved_mode, saved_bwd
            fx(qf, kf, vf).backward(dof)
            times.setdefault("flex", []).append(triton.testing.do_bench(
                lambda: fx(qf, kf, vf).backward(dof), warmup=10, rep=rep, grad_to_none=[qf, kf, vf],
                return_mode="median"))
        out.update({key: round(statistics.median(ts), 4) for key, ts in times.items()})
        if rounds > 1:
            out["spread"] = {key: round(max(ts) / min(ts), 3) for key, ts in times.items()}
        out["ours_fwd"] = round(bench(lambda: Bs.blocksparse_attn_func(q, k, v, lay), rep), 4)
        out["flex_fwd"] = round(bench(lambda: fx(qf, kf, vf), rep), 4)
        for name, step, params in (("ours", lambda: Bs.blocksparse_attn_func(q, k, v, lay).backward(do), (q, k, v)),
                                   ("flex", lambda: fx(qf, kf, vf).backward(dof), (qf, kf, vf))):
            try:
                graph = capture_graph(step, params)
                out[f"{name}_graphed"] = [round(bench(graph.replay, rep), 4) for _ in range(rounds)]
                del graph
            except Exception as e:  # capture not supported by a provider
                out[f"{name}_graphed"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        out["ours_profile"] = profile_kernels(lambda: Bs.blocksparse_attn_func(q, k, v, lay).backward(do))
        out["flex_profile"] = profile_kernels(lambda: fx(qf, kf, vf).backward(dof))
        res[spec] = out
        log(f"  layouts n={n} d={d} {spec}: " + json.dumps(out))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/blocksparse")
    ap.add_argument("--tag", default="bwd_variants")
    ap.add_argument("--rep", type=int, default=25)
    ap.add_argument("--cases", nargs="+", default=["16384:128", "16384:64"])
    ap.add_argument("--modes", action="store_true", help="compare the library's backward launch modes instead")
    ap.add_argument("--configs", default="modes", choices=sorted(MODE_CONFIGS), help="with --modes: which set")
    ap.add_argument("--layouts", nargs="+", help="instead: time these layouts (kind:density:seed, see run_layouts)")
    ap.add_argument("--rounds", type=int, default=1, help="with --layouts: interleaved timing rounds")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    p = torch.cuda.get_device_properties(0)
    meta = dict(gpu=p.name, torch=torch.__version__, triton=triton.__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command="python " + " ".join(sys.argv))
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    log(json.dumps(meta))
    cases = []
    if args.layouts:
        for c in args.cases:
            n, d = map(int, c.split(":"))
            cases.append(dict(seqlen=n, headdim=d, layouts=run_layouts(n, d, args.rep, log, args.layouts, args.rounds)))
        with open(os.path.join(args.out, args.tag + ".json"), "w") as f:
            json.dump(dict(meta=meta, cases=cases), f, indent=1)
        with open(os.path.join(args.out, args.tag + ".log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        return
    if args.modes:
        for c in args.cases:
            n, d = map(int, c.split(":"))
            cases.append(dict(seqlen=n, headdim=d, modes=run_modes(n, d, args.rep, log, args.configs)))
            with open(os.path.join(args.out, args.tag + ".json"), "w") as f:
                json.dump(dict(meta=meta, cases=cases), f, indent=1)
        with open(os.path.join(args.out, args.tag + ".log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        return
    for c in args.cases:
        n, d = map(int, c.split(":"))
        cases.append(run_case(n, d, args.rep, log))
        with open(os.path.join(args.out, args.tag + ".json"), "w") as f:
            json.dump(dict(meta=meta, cases=cases), f, indent=1)
    with open(os.path.join(args.out, args.tag + ".log"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
