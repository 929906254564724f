"""Prepared in session 26, not yet run: the shipped Gluon backward (kernels/flash_gluon.py, made for head dim 128) at
head dim 64, against the @triton.jit backward, both launched directly with host-built descriptors. Session 25
measured its prototype at 0.71-0.97x ours at head dim 64 with descriptors built on the device and every launch
through JITFunction.run; at head dim 64 the Gluon forward went from "gains only at 16K" to 1.03-1.12x from 2K once
both changed (hd64_fwd_h100.txt). It compiles for sm_90 at head dim 64 with 168 registers and no spills
(bwd_compile_sm90.txt). If it now wins at GPT-2's shape without dropout, dropout in it is the way to GPT-2's flash >=
sdpa; the bar is cuDNN's backward with dropout, timed here too (SDPA's cuDNN backend, p = 0.1, forward+backward minus
forward).

    python results/attention/launch_direct/hd64_bwd.py   # GPU (sm_90)
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


def ms(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=40, return_mode="median")


def cudnn_bwd_ms(b, n, h, d, causal, p):
    """cuDNN's backward alone: its forward+backward minus its forward (both timed with dropout p)."""
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        fwd = ms(lambda: TF.scaled_dot_product_attention(qg, kg, vg, dropout_p=p, is_causal=causal))
        fb = ms(lambda: torch.autograd.grad(TF.scaled_dot_product_attention(qg, kg, vg, dropout_p=p, is_causal=causal),
                                            (qg, kg, vg), do))
    return fb - fwd


def row(name, b, n, h, d, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = d ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
    out = {}
    for gluon in (True, False):
        fn = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n,  # noqa: E731
                                  gluon=gluon)
        grads = fn()
        out[gluon] = (ms(fn), grads)
    err = max((a.float() - b_.float()).abs().max().item() / b_.float().abs().max().item()
              for a, b_ in zip(out[True][1], out[False][1]))
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    cud0, cud1 = cudnn_bwd_ms(b, n, h, d, causal, 0.0), cudnn_bwd_ms(b, n, h, d, causal, 0.1)
    gl_ms, tr_ms = out[True][0], out[False][0]
    print(f"{name:22s} | gluon {gl_ms:.3f} ms ({flops / gl_ms * 1e-9:.0f} TFLOP/s) | triton {tr_ms:.3f} "
          f"({flops / tr_ms * 1e-9:.0f}) x{tr_ms / gl_ms:.2f} | cuDNN p=0 {cud0:.3f}, p=0.1 {cud1:.3f} | "
          f"max rel diff {err:.1e}", flush=True)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; head dim 64, bf16, no dropout in ours; backward GPU "
          "time (do_bench median); xN: triton / gluon; cuDNN: its forward+backward minus its forward", flush=True)
    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)
    row("GPT-2 (16x1K, 12 heads)", 16, 1024, 12, 64, True)
    for causal in (False, True):
        for n in (1024, 2048, 4096, 16384):
            row(f"{n} {'causal' if causal else 'full'} (32 heads)", 16384 // n, n, 32, 64, causal)


if __name__ == "__main__":
    main()
