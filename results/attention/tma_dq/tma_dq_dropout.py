"""Device A/B for session 16: the one-kernel backward (dQ shares through TMA reduce-add into a float32 buffer,
5 matmuls and ONE dropout-mask draw per tile pair) against the shipped two-kernel backward (7 matmuls, two
draws), with dropout 0.1 and without, at GPT-2's shape (hd 64 causal), Path-X's (hd 16) and LRA's (hd 32).
Dense, no GQA, bf16, seqlen a multiple of the tiles. `python results/attention/tma_dq/tma_dq_dropout.py compile`: sm_90 compile only (CPU); without arguments: the GPU A/B.
"""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, ".")
import torch
import triton
import triton.language as tl

import kernels.flash as F


@triton.jit
def _bwd_tma_dq(Q, K, V, DO, DK, DV, DQA, LSE, DELTA, SEED, seqlen, nheads, sm_scale, qk_scale, drop_thresh,
                drop_scale, stride_b, stride_m, stride_h, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                USE_TMA: tl.constexpr = True):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    nbatch = tl.num_programs(1) // nheads
    dqa = tl.make_tensor_descriptor(DQA, shape=[nbatch * seqlen, nheads * HEAD_DIM], strides=[nheads * HEAD_DIM, 1],
                                    block_shape=[BLOCK_M, HEAD_DIM])
    base = b.to(tl.int64) * stride_b + h * stride_h
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(K + base + cols[:, None].to(tl.int64) * stride_m + offs_d[None, :])
    v = tl.load(V + base + cols[:, None].to(tl.int64) * stride_m + offs_d[None, :])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    lse_base = LSE + bh.to(tl.int64) * seqlen
    delta_base = DELTA + bh.to(tl.int64) * seqlen
    seed = tl.load(SEED) if HAS_DROPOUT else 0
    lo = start_n if IS_CAUSAL else 0
    for start_m in range(lo, seqlen, BLOCK_M):
        rows = start_m + offs_m
        q = tl.load(Q + base + rows[:, None].to(tl.int64) * stride_m + offs_d[None, :])
        do = tl.load(DO + base + rows[:, None].to(tl.int64) * stride_m + offs_d[None, :])
        lse = tl.load(lse_base + rows)
        delta = tl.load(delta_base + rows)
        qkT = tl.dot(k, tl.trans(q))
        pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
        if IS_CAUSAL:
            pT = tl.where(cols[:, None] <= rows[None, :], pT, 0.0)
        dpT = tl.dot(v, tl.trans(do))
        if HAS_DROPOUT:
            keep = F.dropout_keep_tile(seed, bh, rows, start_n, drop_thresh, BLOCK_N)
            keepT = tl.trans(keep.to(tl.int8)) != 0
            dv = tl.dot(tl.where(keepT, pT * drop_scale, 0.0).to(do.dtype), do, dv)
            dpT = tl.where(keepT, dpT * drop_scale, 0.0)
        else:
            dv = tl.dot(pT.to(do.dtype), do, dv)
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
        dq = tl.dot(tl.trans(dsT), k)
        if USE_TMA:
            dqa.atomic_add([b * seqlen + start_m, h * HEAD_DIM], dq)
        else:  # the interpreter has no descriptor reduce: the same sums element-wise (CPU correctness check)
            ptrs = DQA + (b * seqlen + rows[:, None]).to(tl.int64) * (nheads * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
            tl.atomic_add(ptrs, dq)
    tl.store(DK + base + cols[:, None].to(tl.int64) * stride_m + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + base + cols[:, None].to(tl.int64) * stride_m + offs_d[None, :], dv.to(DV.dtype.element_ty))


# (batch, seqlen, heads, head dim, causal) and the configs tried at each head dim
SHAPES = [(16, 1024, 12, 64, True), (8, 512, 16, 64, False), (4, 16384, 4, 16, False), (32, 1024, 4, 32, False)]
CONFIGS = {64: [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (32, 128, 4, 3), (64, 64, 8, 3)],
           32: [(64, 128, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3), (64, 128, 8, 3)],
           16: [(64, 128, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3), (64, 128, 8, 3)]}


def compile_stats(hd, cfg, causal, dropout) -> str:
    """'regs R stack S smem M tma-reduce B' of one config compiled for sm_90 (CPU), or 'FAILED ...'."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    m, n, w, s = cfg
    names = _bwd_tma_dq.arg_names
    consts = dict(HEAD_DIM=hd, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=causal, HAS_DROPOUT=dropout, USE_TMA=True)
    sig = {a: ("constexpr" if a in consts else "*fp32" if a in ("DQA", "LSE", "DELTA") else "*i64"
               if a == "SEED" else "*bf16" if a.isupper() else "fp32" if "scale" in a else "i32")
           for a in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if sig[a].startswith("*") or a.startswith(("stride", "seqlen"))}
    src = ASTSource(fn=_bwd_tma_dq, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    try:
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": w, "num_stages": s})
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"]); f.flush()
            out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        r = re.search(r"REG:(\d+) STACK:(\d+)", out)
        return (f"regs {r.group(1)} stack {r.group(2)} smem {c.metadata.shared} "
                f"tma-reduce {'cp.reduce.async.bulk.tensor' in c.asm['ptx']}")
    except Exception as e:
        return f"FAILED {type(e).__name__} {str(e).splitlines()[-1][:150] if str(e) else ''}"


def compile_only():
    for hd in sorted(CONFIGS):
        for causal, dropout in ((False, False), (False, True), (True, True)):
            for cfg in CONFIGS[hd]:
                print(f"hd{hd} causal={causal} dropout={dropout} {cfg}: {compile_stats(hd, cfg, causal, dropout)}",
                      flush=True)

def main():
    from triton.testing import do_bench_cudagraph
    F._ensure_tma_allocator()
    print(f"{'shape':30s} {'variant':22s} {'ms':>8s} {'max|d| vs ours (dq,dk,dv)':>30s}", flush=True)
    for b, n, h, d, causal in SHAPES:
        for p in (0.0, 0.1):
            tag = f"{b}x{n} h{h} d{d} {'causal' if causal else 'full'} p{p}"
            q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d ** -0.5
            torch.manual_seed(0)
            o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n)
            ship = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n)
            ref = ship()
            t_ref = do_bench_cudagraph(ship, rep=100, return_mode="median")
            print(f"{tag:30s} {'ours two-kernel':22s} {t_ref:8.3f}", flush=True)
            thresh, drop_scale = F._drop_consts(p) if p > 0 else (0, 1.0)
            dqa = torch.zeros(b, n, h, d, device="cuda", dtype=torch.float32)
            dk, dv = torch.empty_like(k), torch.empty_like(v)

            def fused(cfg):
                m, nn, w, s = cfg
                delta = F.bwd_preprocess(o, do)  # the shipped time includes it; so does this one
                dqa.zero_()
                _bwd_tma_dq[(n // nn, b * h)](q, k, v, do, dk, dv, dqa, lse, delta, seed, n, h, scale, scale * F.LOG2E,
                                              thresh, drop_scale, q.stride(0), q.stride(1), q.stride(2), HEAD_DIM=d,
                                              BLOCK_M=m, BLOCK_N=nn, IS_CAUSAL=causal, HAS_DROPOUT=p > 0,
                                              num_warps=w, num_stages=s)
                return (dqa * scale).to(torch.bfloat16), dk, dv
            time_configs(f"{tag:30s}", fused, ref, t_ref, CONFIGS[d],
                         lambda fn: do_bench_cudagraph(fn, rep=100, return_mode="median"),
                         lambda x: float("%.3g" % x))


def time_configs(tag, run, ref, t_ref, configs, bench, rounded):
    """One line per config: `run(cfg)`'s (dq, dk, dv) timed with `bench`, its largest differences from `ref`
    (through `rounded`), and the shipped backward's time t_ref over it; a config that fails says so."""
    for cfg in configs:
        try:
            out = run(cfg)
            err = tuple(rounded((a.float() - r.float()).abs().max().item()) for a, r in zip(out, ref))
            t = bench(lambda: run(cfg))
        except Exception as e:
            print(f"{tag} {str(cfg):22s} failed {type(e).__name__}: {str(e)[:150]}", flush=True)
            continue
        print(f"{tag} {str(cfg):22s} {t:8.3f} {str(err):>30s}  ({t_ref / t:.2f}x ours)", flush=True)


if __name__ == "__main__":
    compile_only() if sys.argv[1:] == ["compile"] else main()
