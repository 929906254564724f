"""Device A/B (kept in results/attention/tma_dq/ as run): a one-kernel backward whose dQ shares go to a float32
buffer through TMA reduce-add (tensor descriptor atomic_add, Triton 3.6), 5 matmuls per tile pair, against the
shipped two-kernel backward (7 matmuls). Dense, no dropout, no GQA, head dim 128, bf16, seqlen a multiple of 128.
`python tma_dq.py compile` only compiles for sm_90 (CPU) and prints registers / spills."""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, ".")
import torch
import triton
import triton.language as tl


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The kernel as first measured, now with a dropout option (off here): tma_dq_dropout.py holds it.
from tma_dq_dropout import _bwd_tma_dq  # noqa: E402

HD = int(os.environ.get("HD", "128"))
CONFIGS = ([(32, 128, 8, 2), (64, 64, 8, 2), (64, 128, 8, 2), (64, 128, 8, 3)] if HD == 128 else
           [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (32, 128, 4, 3), (64, 64, 8, 3)])
SHAPES = ([(4, 4096, 16, False), (4, 4096, 16, True), (16, 1024, 16, False), (16, 1024, 16, True), (1, 16384, 16, False)]
          if HD == 128 else
          [(16, 1024, 12, True), (16, 1024, 12, False), (8, 512, 16, False), (4, 4096, 32, False), (4, 4096, 32, True)])


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = _bwd_tma_dq.arg_names
    for causal in (False, True):
        for m, n, w, s in CONFIGS:
            consts = dict(HEAD_DIM=HD, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=causal, HAS_DROPOUT=False, USE_TMA=True)
            sig = {a: ("constexpr" if a in consts else "*fp32" if a in ("DQA", "LSE", "DELTA") else "*i64" if a == "SEED" else "*bf16"
                       if a.isupper() else "fp32" if "scale" in a else "i32") for a in names}
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if sig[a].startswith("*") or a.startswith(("stride", "seqlen"))}
            src = ASTSource(fn=_bwd_tma_dq, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
            try:
                c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": w, "num_stages": s})
                tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(c.asm["cubin"]); f.flush()
                    out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
                r = re.search(r"REG:(\d+) STACK:(\d+)", out)
                print(f"causal={causal} {(m, n, w, s)}: regs {r.group(1)} stack {r.group(2)} smem {c.metadata.shared} "
                      f"tma-reduce {'cp.reduce.async.bulk.tensor' in c.asm['ptx']}", flush=True)
            except Exception as e:
                print(f"causal={causal} {(m, n, w, s)}: FAILED {type(e).__name__} {str(e).splitlines()[-1][:150] if str(e) else ''}")


def main():
    from triton.testing import do_bench
    import kernels.flash as F
    F._ensure_tma_allocator()
    print(f"{'shape':24s} {'variant':22s} {'ms':>8s} {'max|d| vs ours (dq,dk,dv)':>30s}", flush=True)
    for b, n, h, causal in SHAPES:
        d = HD
        tag = f"{b}x{n} h{h} {'causal' if causal else 'full'}"
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        ref = F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n)
        t_ref = do_bench(lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n),
                         warmup=25, rep=100, return_mode="median")
        print(f"{tag:24s} {'ours two-kernel':22s} {t_ref:8.3f}", flush=True)
        delta = F.bwd_preprocess(o, do)
        def fused(cfg):
            m, nn, w, s = cfg
            delta = F.bwd_preprocess(o, do)
            dqa = torch.zeros(b, n, h, d, device="cuda", dtype=torch.float32)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            _bwd_tma_dq[(n // nn, b * h)](q, k, v, do, dk, dv, dqa, lse, delta, seed, n, h, scale, scale * F.LOG2E,
                                          0, 1.0, q.stride(0), q.stride(1), q.stride(2), HEAD_DIM=d, BLOCK_M=m,
                                          BLOCK_N=nn, IS_CAUSAL=causal, HAS_DROPOUT=False, num_warps=w, num_stages=s)
            return (dqa * scale).to(torch.bfloat16), dk, dv
        for cfg in CONFIGS:
            try:
                out = fused(cfg)
                err = tuple(round((a.float() - r.float()).abs().max().item(), 4) for a, r in zip(out, ref))
                t = do_bench(lambda: fused(cfg), warmup=25, rep=100, return_mode="median")
            except Exception as e:
                print(f"{tag:24s} {str(cfg):22s} failed {type(e).__name__}: {str(e)[:150]}", flush=True)
                continue
            print(f"{tag:24s} {str(cfg):22s} {t:8.3f} {str(err):>30s}  ({t_ref / t:.2f}x ours)", flush=True)


if __name__ == "__main__":
    compile_only() if sys.argv[1:] == ["compile"] else main()
