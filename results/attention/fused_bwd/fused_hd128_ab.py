"""GPU A/B (prepared): the shipped fused backward (`_bwd_dkdv_kernel` with FUSED_DQ: dQ added through Hopper's TMA
reduce, 5 matmuls per tile pair instead of 7) at head dim 128 WITHOUT dropout, against the two-kernel backward.

Why now: the one-kernel prototype reached 1.01-1.06x the two-kernel backward at head dim 128 from 4K while
spilling 64 bytes per thread (../tma_dq/README.md). Since the dK/dV kernel lost its runtime GQA loop, the shipped
fused kernel compiles at (64, 128, 8, 3) with no spill (sm_90: registers 255, stack 0; (64, 128, 8, 2) and
(32, 128, 8, 2) too: `kernel_resources.py --head-dim 128 --kernels fused --extra 64,128,8,2 32,128,8,2`).
Prediction: 1.03-1.10x at 4K-16K non-causal, about even causal and at 1K. More than 1.05x at 4K-16K would make it
the default there (dQ then varies by float32 summation order from run to run; deterministic mode keeps two kernels).

    python results/attention/fused_bwd/fused_hd128_ab.py                    # on a GPU
    TRITON_INTERPRET=1 python results/attention/fused_bwd/fused_hd128_ab.py check   # CPU: same gradients
"""
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402

SHAPES = [(4, 4096, 16, 128, False), (4, 4096, 16, 128, True), (1, 16384, 16, 128, False), (1, 16384, 16, 128, True),
          (16, 1024, 16, 128, False), (16, 1024, 16, 128, True), (16, 1024, 12, 64, True)]
_SHIPPED = F._fused_bwd


def run_bwd(fused, do, q, k, v, o, lse, seed, scale, causal):
    F._fused_bwd = (lambda q_, p_, d_: True) if fused else (lambda q_, p_, d_: False)
    try:
        return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, q.shape[1], q.shape[1])
    finally:
        F._fused_bwd = _SHIPPED


def check():
    for b, n, h, d, causal in [(1, 64, 2, 128, False), (1, 80, 2, 128, True)]:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        two, one = (run_bwd(f, do, q, k, v, o, lse, seed, scale, causal) for f in (False, True))
        err = [float((a - r).abs().max()) for a, r in zip(one, two)]
        print((b, n, h, d, causal), "max|d| (dq, dk, dv)", err, flush=True)
        assert max(err) < 1e-4, err


def main():
    from triton.testing import do_bench_cudagraph

    F._ensure_tma_allocator()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, p 0", flush=True)
    for b, n, h, d, causal in SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        times, grads = {}, {}
        for fused in (False, True, False, True):  # twice each, interleaved; the better of the two counts
            grads[fused] = run_bwd(fused, do, q, k, v, o, lse, seed, scale, causal)  # tunes outside the graph
            F._fused_bwd = (lambda q_, p_, d_: True) if fused else (lambda q_, p_, d_: False)
            try:
                t = do_bench_cudagraph(lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None,
                                                            None, n, n), rep=100, return_mode="median")
            finally:
                F._fused_bwd = _SHIPPED
            times[fused] = min(times.get(fused, t), t)
        err = tuple(float("%.3g" % (a.float() - r.float()).abs().max().item()) for a, r in zip(grads[True], grads[False]))
        picks = {kk[0]: vv for kk, vv in F._TUNED_CONFIGS.items() if kk[0] in ("dkdv", "dq", "fused")}
        tag = f"{b}x{n} h{h} d{d} {'causal' if causal else 'full'}"
        print(f"{tag:28s} two-kernel {times[False]:.3f} ms  fused {times[True]:.3f} ms  "
              f"({times[False] / times[True]:.3f}x)  max|d| (dq, dk, dv) {err}", flush=True)
        print(f"    picks {picks}", flush=True)
        F._TUNED_CONFIGS.clear()


if __name__ == "__main__":
    {"check": check}.get(sys.argv[1] if len(sys.argv) > 1 else "", main)()
