"""Why bench_attention's forward for ours at head dim 128, 1K non-causal (339 TFLOP/s) is below gluon_fwd.py short's
(443) for the same call: both ways of timing it, in one process (fwd_gap_h100.txt; the profiler lines it also prints
are left out there)."""
import sys
sys.path.insert(0, ".")
import torch, triton
from triton.testing import do_bench
import kernels.flash as F

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
for d, n, causal in ((128, 1024, False), (128, 2048, True), (256, 512, True), (128, 4096, False)):
    b, h = 16384 // n, 2048 // d
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    fn = lambda q, k, v: F.flash_attn_func(q, k, v, causal=causal)

    def nograd():
        with torch.no_grad():
            fn(qg, kg, vg)
    res = {}
    for name, run, kw in (("plain mean", lambda: fn(q, k, v), {}),
                          ("plain median rep30", lambda: fn(q, k, v), dict(warmup=25, rep=30, return_mode="median")),
                          ("table-style", nograd, dict(warmup=25, rep=30, return_mode="median")),
                          ("plain again", lambda: fn(q, k, v), {})):
        run(); torch.cuda.synchronize()
        res[name] = do_bench(run, **kw)
    print(f"hd {d} n {n} causal {causal}: " + " | ".join(f"{k} {v:.3f} ms ({flops / v * 1e-9:.0f})" for k, v in res.items()), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            nograd()
        torch.cuda.synchronize()
    print("  kernels (table-style):", [(e.key[:40], round(e.device_time / max(e.count, 1), 1), e.count) for e in prof.key_averages() if e.device_time > 0][:6], flush=True)
