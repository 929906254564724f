"""Host cost of the Gluon backward at short causal lengths: autograd fwd+bwd, _flash_bwd with and without Gluon (GPU
time by do_bench, host enqueue time per call over 50 unsynchronised calls). Ran with MIN_SEQLEN and BWD_MIN_SEQLEN
causal at 1024; with the shipped 2048, gluon=True at 1K causal runs the @triton.jit backward.

    python results/attention/gluon_hostdesc/short_causal.py   # GPU
"""
import sys, time
sys.path.insert(0, ".")
import torch
from triton.testing import do_bench
import kernels.flash as F
for n in (1024, 512):
    b, h, d = 16384 // n, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    fb = lambda: torch.autograd.grad(F.flash_attn_func(qg, kg, vg, causal=True), (qg, kg, vg), do)
    fb(); torch.cuda.synchronize()
    t_fb = do_bench(fb, warmup=25, rep=30, return_mode="median")
    o, lse, seed = F._flash_fwd(q, k, v, d ** -0.5, True, 0.0, False, None, None, n, n)
    res = {}
    for gl_ in (True, False):
        bw = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, d ** -0.5, True, 0.0, False, None, None, n, n, gluon=gl_)
        bw(); torch.cuda.synchronize()
        res[gl_] = do_bench(bw, warmup=25, rep=30, return_mode="median")
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(50):
            bw()
        host = (time.perf_counter() - t0) / 50
        torch.cuda.synchronize()
        res[(gl_, "host")] = host * 1e3
    print(f"n {n} causal: autograd fwd+bwd {t_fb:.3f} ms | _flash_bwd gluon {res[True]:.3f} ms (host enqueue {res[(True, 'host')]:.3f}) | triton {res[False]:.3f} ms (host enqueue {res[(False, 'host')]:.3f}) | gluon taken: {F._gluon_bwd_unsupported(q, k, v, do, lse, lse, (q, k, v), True, 0.0, False)}", flush=True)
