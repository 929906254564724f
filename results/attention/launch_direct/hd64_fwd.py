"""The Gluon forward at head dim 64 (session 26): its tile configs against the @triton.jit forward (autotuned), both
launched directly, at the attention table's shapes (16K tokens a batch, 32 heads). Session 24 found it gaining only
at 16K, with descriptors built on the device and every launch through JITFunction.run; both have changed since.

    python results/attention/launch_direct/hd64_fwd.py   # GPU (sm_90)
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

CONFIGS = [(128, 128, 3), (128, 128, 4), (128, 64, 4)]


def main(d=64):
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; head dim {d}, bf16, 16K tokens, 2048 / d heads; "
          "forward TFLOP/s (do_bench median), x: against the @triton.jit forward; err: max |O - O_triton|", flush=True)
    for causal in (False, True):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            b, h = 16384 // n, 2048 // d
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            scale = d ** -0.5
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
            F.GLUON_KERNELS = False
            ref, _, _ = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
            fn = lambda: F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)  # noqa: E731
            fn()
            base = do_bench(fn, warmup=25, rep=40, return_mode="median")
            cells = [f"triton {flops / base * 1e-9:4.0f}"]
            for cfg in CONFIGS:
                o, lse = torch.empty_like(q), torch.empty(b, h, n, device="cuda")
                run = lambda: G.gluon_forward(q, k, v, o, lse, scale * F.LOG2E, causal, tiles=cfg)  # noqa: E731
                run()
                err = (o.float() - ref.float()).abs().max().item()
                ms = do_bench(run, warmup=25, rep=40, return_mode="median")
                cells.append(f"{cfg} {flops / ms * 1e-9:4.0f} x{base / ms:.2f} err {err:.1e}")
            print(f"n {n:5d} {'causal' if causal else 'full  '} | " + " | ".join(cells), flush=True)
    F.GLUON_KERNELS = True


if __name__ == "__main__":
    main()
