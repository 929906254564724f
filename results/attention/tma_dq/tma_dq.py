"""Device A/B (kept in results/attention/tma_dq/ as run): a one-kernel backward whose dQ shares go to a float32
buffer through TMA reduce-add (tensor descriptor atomic_add, Triton 3.6), 5 matmuls per tile pair, against the
shipped two-kernel backward (7 matmuls). Dense, no dropout, no GQA, head dim 128, bf16, seqlen a multiple of 128.
`python tma_dq.py compile` only compiles for sm_90 (CPU) and prints registers / spills."""
import os, sys
sys.path.insert(0, ".")
import torch
import triton


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The kernel as first measured, now with a dropout option (off here): tma_dq_dropout.py holds it.
from tma_dq_dropout import _bwd_tma_dq, compile_stats, time_configs  # noqa: E402

HD = int(os.environ.get("HD", "128"))
CONFIGS = ([(32, 128, 8, 2), (64, 64, 8, 2), (64, 128, 8, 2), (64, 128, 8, 3)] if HD == 128 else
           [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (32, 128, 4, 3), (64, 64, 8, 3)])
SHAPES = ([(4, 4096, 16, False), (4, 4096, 16, True), (16, 1024, 16, False), (16, 1024, 16, True), (1, 16384, 16, False)]
          if HD == 128 else
          [(16, 1024, 12, True), (16, 1024, 12, False), (8, 512, 16, False), (4, 4096, 32, False), (4, 4096, 32, True)])


def compile_only():
    for causal in (False, True):
        for cfg in CONFIGS:
            print(f"causal={causal} {cfg}: {compile_stats(HD, cfg, causal, False)}", flush=True)

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
        def fused(cfg):
            m, nn, w, s = cfg
            delta = F.bwd_preprocess(o, do)
            dqa = torch.zeros(b, n, h, d, device="cuda", dtype=torch.float32)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            _bwd_tma_dq[(n // nn, b * h)](q, k, v, do, dk, dv, dqa, lse, delta, seed, n, h, scale, scale * F.LOG2E,
                                          0, 1.0, q.stride(0), q.stride(1), q.stride(2), HEAD_DIM=d, BLOCK_M=m,
                                          BLOCK_N=nn, IS_CAUSAL=causal, HAS_DROPOUT=False, num_warps=w, num_stages=s)
            return (dqa * scale).to(torch.bfloat16), dk, dv
        time_configs(f"{tag:24s}", fused, ref, t_ref, CONFIGS,
                     lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median"), lambda x: round(x, 4))


if __name__ == "__main__":
    compile_only() if sys.argv[1:] == ["compile"] else main()
