"""Short sequences after the launch fix of session 26: the Gluon kernels against the @triton.jit ones where the host
cost of a call decides, with every launch on kernels/launch.py's direct path (which Triton 3.6's HookChain had kept
every launch off until then) and, for one row, on Triton's own path as before.

Per (head dim, seqlen, causal), 16K tokens a batch and heads x head dim = 2048 (the attention table's shapes):
  GPU time (do_bench median) of _flash_fwd and _flash_bwd with the Gluon kernel and without, and of the autograd
  forward+backward (flash_attn_func) both ways; host enqueue time per call (wall time of 50 calls, unsynchronised).
The Gluon limits are lifted for the run, so each row says where the kernels should start.

    python results/attention/launch_direct/short.py   # GPU (sm_90)
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402
import kernels.launch as L  # noqa: E402


def host_us(fn, calls=50, warmup=1):
    """Host time per call of fn, in us: the wall time of `calls` calls without synchronising."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    out = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return out


def gpu_ms(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=40, return_mode="median")


def row(d, n, causal):
    b, h = 16384 // n, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    scale = d ** -0.5
    flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    out = {}
    for gluon in (True, False):
        F.GLUON_KERNELS = gluon
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        fwd = lambda: F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)  # noqa: E731
        bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False,  # noqa: E731
                                   None, None, n, n)
        fb = lambda: torch.autograd.grad(F.flash_attn_func(qg, kg, vg, causal=causal), (qg, kg, vg), do)  # noqa: E731
        out[gluon] = [gpu_ms(fwd), host_us(fwd), gpu_ms(bwd), host_us(bwd), gpu_ms(fb), host_us(fb)]
    F.GLUON_KERNELS = True
    name = f"d {d} n {n:5d} {'causal' if causal else 'full  '}"
    gl_, tr = out[True], out[False]
    print(f"{name} | fwd gluon {gl_[0]:.3f} ms (host {gl_[1]:.0f} us) triton {tr[0]:.3f} ({tr[1]:.0f}) "
          f"x{tr[0] / gl_[0]:.2f} | bwd gluon {gl_[2]:.3f} ({gl_[3]:.0f}) triton {tr[2]:.3f} ({tr[3]:.0f}) "
          f"x{tr[2] / gl_[2]:.2f} | fwd+bwd gluon {gl_[4]:.3f} ({gl_[5]:.0f}) {3.5 * flops / gl_[4] / 1e9:.0f} TFLOP/s "
          f"triton {tr[4]:.3f} ({tr[5]:.0f}) {3.5 * flops / tr[4] / 1e9:.0f} x{tr[4] / gl_[4]:.2f}", flush=True)


def hooked_row(d=128, n=1024):
    """The same autograd fwd+bwd with every launch on Triton's path (what ran before the fix)."""
    b, h = 16384 // n, 2048 // d
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    fb = lambda: torch.autograd.grad(F.flash_attn_func(qg, kg, vg, causal=True), (qg, kg, vg), do)  # noqa: E731
    res = {}
    unpatched = L._launch_hooked
    for gluon in (True, False):
        F.GLUON_KERNELS = gluon
        for hooked in (True, False):
            L._launch_hooked = (lambda: True) if hooked else (lambda: False)
            res[gluon, hooked] = (gpu_ms(fb), host_us(fb))
    L._launch_hooked = unpatched
    F.GLUON_KERNELS = True
    for (gluon, hooked), (ms, us) in res.items():
        print(f"d {d} n {n} causal fwd+bwd, {'gluon ' if gluon else 'triton'} {'triton path' if hooked else 'direct'}: "
              f"{ms:.3f} ms, host {us:.0f} us a call", flush=True)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    print("# ms: GPU time (do_bench median); (us): host enqueue per call; xN: triton / gluon time", flush=True)
    G.MIN_SEQLEN = dict.fromkeys(G.MIN_SEQLEN, 0)
    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)
    hooked_row()
    for d, n, causal in [(128, 512, False), (128, 512, True), (128, 1024, False), (128, 1024, True),
                         (128, 2048, True), (256, 512, False), (256, 512, True)]:
        row(d, n, causal)


if __name__ == "__main__":
    main()
