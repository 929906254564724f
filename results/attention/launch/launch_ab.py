"""Device A/B (kept in results/attention/launch/ as run): Triton's launch path vs kernels/launch.py's direct path,
alternating in one process. do_bench (median ms) of fwd+bwd at the GPT-2 shape and a tiny shape, and the host time
per call of back-to-back calls at the tiny shape."""
import sys, time
sys.path.insert(0, ".")
import torch
from triton.testing import do_bench
import kernels.launch as L
from kernels.flash import flash_attn_func, flash_attn_qkvpacked_func
from kernels.blocksparse import blocksparse_attn_func
from kernels import sparsity

def host_us(fn, calls=300, reps=5):
    for _ in range(20): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls): fn()
        ts.append((time.perf_counter() - t) / calls * 1e6); torch.cuda.synchronize()
    return sorted(ts)[len(ts) // 2]

def mk(b, n, h, d):
    return torch.randn(b, n, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

cases = []
for name, (b, n, h, d), causal, p in [("gpt2 p0", (16, 1024, 12, 64), True, 0.0), ("gpt2 p0.1", (16, 1024, 12, 64), True, 0.1),
                                      ("bert-ish 8x512 h16", (8, 512, 16, 64), False, 0.1), ("tiny", (1, 128, 4, 64), False, 0.0)]:
    qkv = mk(b, n, h, d)
    cases.append((name, lambda qkv=qkv, causal=causal, p=p: flash_attn_qkvpacked_func(qkv, dropout_p=p, causal=causal).sum().backward()))
q, k, v = [torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
lay = sparsity.local(128, 128, 64, window=1)
cases.append(("tiny blocksparse", lambda: blocksparse_attn_func(q, k, v, lay).sum().backward()))
print(f"{'case':22s} {'path':7s} {'do_bench fwd+bwd ms':>20s} {'host us/call':>13s}")
for name, fn in cases:
    for rnd in range(2):
        for path in ("triton", "direct"):
            L._launch_hooked = (lambda: True) if path == "triton" else (lambda: False)
            ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
            hu = host_us(fn, calls=100) if "tiny" in name else float("nan")
            print(f"{name:22s} {path:7s} {ms:20.4f} {hu:13.0f}", flush=True)
