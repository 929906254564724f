"""Device A/B (kept in results/attention/ws_bwd/ as run): the warp-specialised backward kernels vs the two-stage ones,
head dim 128, bf16. Per kernel: ms (do_bench median) of the plain kernels with the autotuner's pick and of each WS
config; then fwd+bwd of flash_attn_func with the WS backward forbidden vs allowed (autotuned) vs SDPA cuDNN."""
import os, sys
sys.path.insert(0, ".")
import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench
import kernels.flash as F

orig_launch = F._launch
orig_kinds = F._bwd_kinds
def only(kinds):
    F._launch = lambda kind, *a, **kw: orig_launch(kind, *a, **kw) if kind in kinds else None
def ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")
def tflops(b, n, h, d, causal, t, mult):
    return 4 * b * h * n * n * d * (0.5 if causal else 1) * mult / t / 1e9

print(f"{'shape':28s} {'variant':26s} {'ms':>8s}", flush=True)
rows = []
for b, n, h, causal in [(4, 4096, 16, False), (4, 4096, 16, True), (16, 1024, 16, False), (16, 1024, 16, True),
                        (1, 16384, 16, False), (1, 16384, 16, True)]:
    d = 128
    tag = f"{b}x{n} h{h} {'causal' if causal else 'full'}"
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = d ** -0.5
    os.environ["FLASH_AUTOTUNE"] = "1"
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
    bwd = lambda ws: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n, warp_spec=ws)
    for kind in ("dkdv", "dq"):
        only({kind}); t = ms(lambda: bwd(False)); print(f"{tag:28s} {kind + ' plain tuned':26s} {t:8.3f}", flush=True)
        rows.append((tag, kind + " plain tuned", t))
    os.environ["FLASH_AUTOTUNE"] = "0"
    for kind, shapes in (("dkdv_ws", F._DKDV_WS_SHAPES), ("dq_ws", F._DQ_WS_SHAPES)):
        for cfg in shapes:
            F._DEFAULT_128[kind] = cfg
            only({kind})
            try:
                t = ms(lambda: bwd(True))
            except Exception as e:
                t = float("nan"); print("  failed:", type(e).__name__, str(e)[:200])
            print(f"{tag:28s} {kind + ' ' + str(cfg):26s} {t:8.3f}", flush=True)
            rows.append((tag, f"{kind} {cfg}", t))
    F._launch = orig_launch
    os.environ["FLASH_AUTOTUNE"] = "1"
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    def fb():
        out = F.flash_attn_func(qg, kg, vg, causal=causal)
        torch.autograd.grad(out, (qg, kg, vg), do)
    F._bwd_kinds = lambda q, k, v, do, p, varlen, ws: orig_kinds(q, k, v, do, p, varlen, False)
    t_off = ms(fb)
    F._bwd_kinds = orig_kinds
    t_on = ms(fb)
    qh, kh, vh, doh = (x.transpose(1, 2).contiguous() for x in (q, k, v, do))
    qh, kh, vh = (x.requires_grad_() for x in (qh, kh, vh))
    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = Fn.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
        torch.autograd.grad(out, (qh, kh, vh), doh)
    t_cud = ms(cud)
    t_off2 = (F.__setattr__("_bwd_kinds", lambda q, k, v, do, p, varlen, ws: orig_kinds(q, k, v, do, p, varlen, False)), ms(fb))[1]
    F._bwd_kinds = orig_kinds
    for name, t in (("fwd+bwd WS bwd off", t_off), ("fwd+bwd WS bwd auto", t_on), ("fwd+bwd WS bwd off (again)", t_off2), ("fwd+bwd cuDNN", t_cud)):
        print(f"{tag:28s} {name:26s} {t:8.3f}  {tflops(b, n, h, d, causal, t, 3.5):6.0f} TFLOP/s", flush=True)
        rows.append((tag, name, t))
    print(f"{tag:28s} auto/cuDNN speed {t_cud / t_on:.2f}x, off/cuDNN {t_cud / t_off:.2f}x", flush=True)
