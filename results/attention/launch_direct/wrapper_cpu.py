"""Host cost of kernels.flash's Python wrapper alone, on a machine without a GPU (session 27): `_flash_fwd` /
`_flash_bwd` stubbed to allocate their outputs, `flash_attn_func` forward+backward (autograd.grad) against a bare
autograd.Function doing the same allocations, and `flash_attn_func` under no_grad; best of 5 x 500 calls; then the
cProfile of 2,000 wrapper calls.

    TRITON_INTERPRET=1 python results/attention/launch_direct/wrapper_cpu.py
"""
import sys
import timeit

sys.path.insert(0, ".")
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402

b, n, h, d = 1, 128, 2, 64
q, k, v, do = (torch.randn(b, n, h, d) for _ in range(4))
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
lse0 = torch.empty(b, h, n)
def fake_fwd(q, k, v, scale, causal, p, varlen, cu_q, cu_k, mq, mk, out_dtype=None, warp_spec=None):
    return torch.empty_like(q), torch.empty(b, h, n), lse0
def fake_bwd(do, q, k, v, o, lse, seed, *a, **kw):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
F._flash_fwd = fake_fwd; F._flash_bwd = fake_bwd
class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse, seed = fake_fwd(q, k, v, 0.1, True, 0.0, False, None, None, n, n)
        ctx.save_for_backward(q, k, v, o, lse, seed)
        return o
    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, seed = ctx.saved_tensors
        return fake_bwd(do, q, k, v, o, lse, seed)
def ours(): torch.autograd.grad(F.flash_attn_func(qg, kg, vg, causal=True), (qg, kg, vg), do)
def bare(): torch.autograd.grad(Bare.apply(qg, kg, vg), (qg, kg, vg), do)
def ours_fwd():
    with torch.no_grad(): F.flash_attn_func(q, k, v, causal=True)
for name, fn in [("flash_attn_func fwd+bwd (stub kernels)", ours), ("bare autograd.Function (same stubs)", bare), ("flash_attn_func no_grad", ours_fwd)]:
    fn()
    print(f"{name:45s} {min(timeit.repeat(fn, number=500, repeat=5)) / 500 * 1e6:7.1f} us")
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): ours()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
