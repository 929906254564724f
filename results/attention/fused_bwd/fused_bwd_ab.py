"""GPU A/B of the fused dropout backward as integrated in kernels/flash.py (`_fused_bwd`: the dK/dV kernel adds
dQ through the TMA reduce, one mask draw) against the two-kernel backward, both autotuned, CUDA-graph GPU time of
`_flash_bwd` (delta preprocessing included in both). Shapes: GPT-2 small, BERT-like, Path-X, LRA (head dim 32), and
one varlen batch. Prints the tuned config of each and the largest differences from the two-kernel gradients.

    python results/attention/fused_bwd/fused_bwd_ab.py
"""
import sys

sys.path.insert(0, ".")
import torch
from triton.testing import do_bench_cudagraph

import kernels.flash as F

# (batch, seqlen, heads, head dim, causal, varlen lengths or None)
SHAPES = [(16, 1024, 12, 64, True, None), (8, 512, 16, 64, False, None), (4, 16384, 4, 16, False, None),
          (32, 1024, 4, 32, False, None), (1, 0, 16, 64, False, [512, 301, 499, 128, 512, 77, 512, 390])]


def main(p=0.1):
    default = F.FUSED_DROPOUT_BWD_MAX_D
    F._ensure_tma_allocator()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, p {p}", flush=True)
    for b, n, h, d, causal, lengths in SHAPES:
        if lengths:
            total, n = sum(lengths), max(lengths)
            cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
            q, k, v, do = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            tag = f"varlen {len(lengths)} seqs <= {n} h{h} d{d}"
        else:
            cu = None
            q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            tag = f"{b}x{n} h{h} d{d} {'causal' if causal else 'full'}"
        scale = d ** -0.5
        varlen = cu is not None
        torch.manual_seed(0)
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, varlen, cu, cu, n, n)
        times, grads = {}, {}
        for fused in (False, True):
            F.FUSED_DROPOUT_BWD_MAX_D = 64 if fused else 0
            bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, varlen, cu, cu, n, n)  # noqa: E731
            grads[fused] = bwd()  # tunes outside the graph
            times[fused] = do_bench_cudagraph(bwd, rep=100, return_mode="median")
        err = tuple(float("%.3g" % (a.float() - r.float()).abs().max().item()) for a, r in zip(grads[True], grads[False]))
        picks = {kk[0]: vv for kk, vv in F._TUNED_CONFIGS.items() if kk[0] in ("dkdv", "dq", "fused")}
        print(f"{tag:34s} two-kernel {times[False]:.3f} ms  fused {times[True]:.3f} ms  ({times[False] / times[True]:.2f}x)"
              f"  max|d| (dq, dk, dv) {err}", flush=True)
        print(f"    last picks {picks}", flush=True)
        F._TUNED_CONFIGS.clear()
    F.FUSED_DROPOUT_BWD_MAX_D = default


if __name__ == "__main__":
    main()
