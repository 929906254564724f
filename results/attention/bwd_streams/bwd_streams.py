"""Device A/B (not yet run): does running the backward's two kernels at the same time pay?

FlexAttention's backward is one launch whose grid holds both the dK/dV programs and the dQ programs, so the two
share the SMs; ours launches dK/dV, then dQ. At head dim 128 Flex's backward is 1.02-1.22x faster than ours with the
same tile shapes (results/attention/h100.md). The cheapest test of whether that concurrency is what pays: the
shipped kernels, unchanged, with dQ launched on a second stream after the preprocess, so the GPU may overlap it with
dK/dV. Same autotuned configs, same results (checked below). Prediction: at most a few percent where one kernel's
last wave leaves SMs idle (4K), nothing at 16K; more than that would justify a one-launch backward.

    python results/attention/bwd_streams/bwd_streams.py          # on a GPU
"""
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402

SHAPES = [(4, 4096, 16, 128, False, 0.0), (4, 4096, 16, 128, True, 0.0), (1, 16384, 16, 128, False, 0.0),
          (1, 16384, 16, 128, True, 0.0), (16, 1024, 12, 64, True, 0.0), (16, 1024, 12, 64, True, 0.1),
          (8, 512, 16, 64, False, 0.1)]


def bwd_two_streams(do, q, k, v, o, lse, seed, scale, causal, dropout_p, side):
    """_flash_bwd's two-kernel path for dense inputs (no varlen, no fused dropout backward), dQ on `side`."""
    n, nheads, headdim = q.shape[1], q.shape[2], q.shape[3]
    batch, nheads_k = q.shape[0], k.shape[2]
    slb, slh = F.lse_strides(lse, False)
    delta = F.bwd_preprocess(o, do, False, None, n)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    thresh, drop_scale = F._drop_consts(dropout_p)
    common = (lse, lse, n, n, nheads, nheads // nheads_k, scale, scale * F.LOG2E, thresh, drop_scale,
              *F._strides(q, False), *F._strides(k, False), *F._strides(v, False), *F._strides(do, False))
    consts = dict(HEAD_DIM=headdim, BLOCK_D=F._block_d(headdim), IS_CAUSAL=causal, VARLEN=False,
                  HAS_DROPOUT=dropout_p > 0)
    tune = (F._bucket(n), F._bucket(n))
    main = torch.cuda.current_stream()
    side.wait_stream(main)  # dQ needs delta (and q, k, v, do) from the main stream
    F._launch("dkdv", F._bwd_dkdv_kernel, F._dkdv_tuned, lambda m: (F.cdiv(n, m["BLOCK_N"]), batch * nheads_k),
              (q, k, v, do, dk, dv, dk, lse, delta, seed, *common, *F._strides(dk, False), *F._strides(dv, False),
               slb, slh, 0, *tune), consts, (q.dtype, do.dtype, dk.dtype))
    with torch.cuda.stream(side):
        F._launch("dq", F._bwd_dq_kernel, F._dq_tuned, lambda m: (F.cdiv(n, m["BLOCK_M"]), batch * nheads),
                  (q, k, v, do, dq, lse, delta, seed, *common, *F._strides(dq, False), slb, slh, *tune),
                  dict(consts, REVERSE=causal), (q.dtype, do.dtype, dq.dtype))
    main.wait_stream(side)
    for t in (dq, delta):  # allocated on main, used on side: keep the allocator from reusing them early
        t.record_stream(side)
    return dq, dk, dv


def main():
    side = torch.cuda.Stream()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, FLASH_FUSED_DROPOUT_BWD default", flush=True)
    print(f"{'shape':34s} {'one stream':>11s} {'two streams':>12s} {'speedup':>8s}  max|d| (dq, dk, dv)", flush=True)
    for b, n, h, d, causal, p in SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n)
        if F._fused_bwd(q, p, F._block_d(d)):
            print(f"{b}x{n} h{h} d{d}: takes the fused backward here, skipped", flush=True)
            continue

        def one():
            return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n)

        def two():
            return bwd_two_streams(do, q, k, v, o, lse, seed, scale, causal, p, side)

        ref, got = one(), two()  # also autotunes both kernels for this shape before timing
        torch.cuda.synchronize()
        diff = tuple(round((a.float() - r.float()).abs().max().item(), 6) for a, r in zip(got, ref))
        t_one, t_two = [], []
        for _ in range(3):  # alternating rounds: the machines are shared and noisy
            t_one.append(do_bench(one, rep=200))
            t_two.append(do_bench(two, rep=200))
        a, c = sorted(t_one)[1], sorted(t_two)[1]
        tag = f"{b}x{n} h{h} d{d} {'causal' if causal else 'full'} p{p}"
        print(f"{tag:34s} {a:9.3f}ms {c:10.3f}ms {a / c:7.3f}x  {diff}", flush=True)


if __name__ == "__main__":
    main()
