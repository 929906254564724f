"""The launch order of the Gluon kernels' programs (kernels/flash_gluon.py `_tile_and_head`): groups of 1 head (each
head's tiles back to back: its K, V or Q, dO shared in L2 by the programs in flight) up to all heads (the tiles of
equal work of every head together: under a causal mask the longest programs no longer trail in the last wave).

Prediction (written before the run): under a causal mask the backward's last wave holds the last head's first key
tile, 2x the mean program's work (8K: 128 query tiles against a mean of 65, ~1,000 a SM over the grid), so grouping
heads saves up to ~6% at 4K-16K causal; nothing non-causal, where every program does the same work, unless L2 misses
cost more with all heads in flight. The forward is reversed within a head already; smaller gain there.

    python results/attention/head_order/ab.py    # GPU (sm_90); ~2 minutes
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

ROUNDS = 2


def ms(fn):
    return do_bench(fn, warmup=25, rep=80, return_mode="median")


def cudnn_ms(q, k, v, do, causal):
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        fwd = ms(lambda: TF.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        fb = ms(lambda: torch.autograd.grad(TF.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                            (qt, kt, vt), dot))
    return fwd, fb - fwd


def shape_row(d, n, causal, groups):
    h = 2048 // d
    b = max(16384 // n, 1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    scale = d ** -0.5
    assert G.unsupported(q, k, v, causal, 0.0, False) is None
    assert G.bwd_unsupported(q, k, causal, 0.0, False) is None
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
    times = {g: [[], []] for g in groups}
    ref = None
    for r in range(ROUNDS):
        for g in (groups if r % 2 == 0 else groups[::-1]):
            G.launch_head_group = lambda seqlen, causal, g=g: g
            fwd = lambda: F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)  # noqa: E731
            bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n)  # noqa
            out = fwd()[0]
            if ref is None:
                ref = out
            assert torch.equal(out, ref), g
            times[g][0].append(ms(fwd))
            times[g][1].append(ms(bwd))
    cud_f, cud_b = cudnn_ms(q, k, v, do, causal)
    base = [min(x) for x in times[groups[0]]]
    cells = []
    for g in groups:
        f, bw = (min(x) for x in times[g])
        cells.append(f"g{g}: {f:.3f}/{bw:.3f} ({base[0] / f:.3f}x/{base[1] / bw:.3f}x, fb {(f + bw):.3f} = "
                     f"{(cud_f + cud_b) / (f + bw):.3f}x cuDNN)")
    print(f"hd{d} {n:>6} {'causal' if causal else 'full':6} b{b} h{h} | cuDNN {cud_f:.3f}/{cud_b:.3f} | "
          + " | ".join(cells), flush=True)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; bf16, 16K tokens, heads x head dim 2048; fwd/bwd "
          f"ms (best of {ROUNDS} do_bench medians, rounds in alternating order); (x): group 1 / this group; fb = "
          f"fwd + bwd against cuDNN's (its fwd+bwd)", flush=True)
    G.MIN_SEQLEN = dict.fromkeys(G.MIN_SEQLEN, 0)
    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)
    shapes = [(128, n, True) for n in (1024, 2048, 4096, 8192, 16384, 32768)]
    shapes += [(128, 4096, False), (128, 16384, False)]
    shapes += [(64, n, True) for n in (2048, 4096, 8192, 16384)]
    for d, n, causal in shapes:
        bh = max(16384 // n, 1) * (2048 // d)
        shape_row(d, n, causal, [g for g in (1, 2, 4, 8, 16) if g < bh])


if __name__ == "__main__":
    main()
