"""Where the host time of one eager forward+backward goes (session 26): per call, unsynchronised, at head dim 128,
1K causal, 16K tokens: the launchers alone (_flash_fwd, _flash_bwd), flash_attn_func under no_grad and with autograd,
the full autograd forward+backward, and autograd's own cost on a trivial op of the same shapes (q * 1).

    python results/attention/launch_direct/host_split.py   # GPU
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
from short import host_us  # noqa: E402  (this folder's short.py)


def main(n=1024, d=128, causal=True):
    b, h = 16384 // n, 2048 // d
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    scale = d ** -0.5
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; {stamp}; d {d} n {n} causal {causal}; "
          "host us per call, unsynchronised, 100 calls", flush=True)
    for gluon in (True, False):
        F.GLUON_KERNELS = gluon
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)

        def nograd():
            with torch.no_grad():
                F.flash_attn_func(q, k, v, causal=causal)

        rows = {
            "_flash_fwd": lambda: F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n),
            "_flash_bwd": lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None,
                                               n, n),
            "bwd_preprocess": lambda: F.bwd_preprocess(o, do, False, None, n),
            "flash_attn_func, no_grad": nograd,
            "flash_attn_func, grad": lambda: F.flash_attn_func(qg, kg, vg, causal=causal),
            "autograd fwd+bwd": lambda: torch.autograd.grad(F.flash_attn_func(qg, kg, vg, causal=causal),
                                                            (qg, kg, vg), do),
            "autograd of q*1+k+v (baseline)": lambda: torch.autograd.grad(qg * 1 + kg + vg, (qg, kg, vg), do),
            "torch.empty x3": lambda: [torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3)],
        }
        for name, fn in rows.items():
            us = host_us(fn, calls=100, warmup=3)
            print(f"{'gluon ' if gluon else 'triton'} {name:32s} {us:7.1f} us", flush=True)
    F.GLUON_KERNELS = True


if __name__ == "__main__":
    main()
