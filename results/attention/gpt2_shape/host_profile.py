"""Where the host time of ours goes at the GPT-2 small shape (16 x 1024, 12 heads of 64, causal): trace.py found
ours at 550-920 us of host time per autograd forward+backward on the H100 machine's host against 300-430 us for
SDPA's cuDNN backend, both above their GPU time (0.42-0.62 ms), so the attention table's do_bench times there are
host times. Per dropout: host time a call (the GPU held busy by a sleep so no launch waits) for ours, cuDNN and
a bare autograd.Function that only allocates ours's outputs and gradients (the floor a Python Function has); then
cProfile of 100 calls of ours, top functions by own time and by cumulative time.

    python results/attention/gpt2_shape/host_profile.py   # GPU
"""
import cProfile
import io
import pstats
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "results/attention/gpt2_shape")
import torch  # noqa: E402
import triton  # noqa: E402

from trace import B, D, H, N, host_us, make  # noqa: E402


class _Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q), torch.empty(B, H, N, device=q.device)

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def bare():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    do = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return lambda: torch.autograd.grad(_Bare.apply(q, k, v)[0], (q, k, v), do)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; B {B} N {N} H {H} D {D} causal bf16", flush=True)
    for p in (0.1, 0.0):
        fns = {"ours": make("ours", p), "sdpa_cudnn": make("sdpa_cudnn", p), "bare autograd.Function": bare()}
        for fn in fns.values():
            for _ in range(5):
                fn()
        times = {name: sorted(host_us(fn) for _ in range(5))[2] for name, fn in fns.items()}
        print(f"dropout {p}: host us a call (median of 5 x 40 calls): "
              + ", ".join(f"{k} {v:.0f}" for k, v in times.items()), flush=True)
        fn = fns["ours"]
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(100):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(28)
            print(f"== ours dropout {p}, cProfile of 100 calls, by {key} (seconds for all 100)")
            print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000], flush=True)


if __name__ == "__main__":
    main()
