"""A/B of `ctx.set_materialize_grads(False)` in kernels/flash.py's eager Functions: without it autograd allocates and
zeroes a gradient for the (non-differentiable) LSE at every backward. GPT-2 small's shape (16 x 1024, 12 heads of 64,
causal, dropout 0.1), five interleaved rounds of: host time a call (trace.host_us: 40 calls queued behind a GPU
sleep) and the do_bench median of the autograd forward+backward, shipped (False) against the old behaviour (True).
Prediction: 10-40 us less host time a call on the GPU machine's host (one allocation and one fill launch), no change
in device time.

    python results/attention/gpt2_shape/materialize_ab.py   # GPU
"""
import statistics
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "results/attention/gpt2_shape")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
from trace import B, D, H, N, host_us  # noqa: E402


class _Materialised(F._EagerFlash):
    @staticmethod
    def forward(ctx, *args):
        out = F._EagerFlash.forward(ctx, *args)
        ctx.set_materialize_grads(True)
        return out


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; B {B} N {N} H {H} D {D} causal dropout 0.1 bf16",
          flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    do = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = D ** -0.5
    fns = {name: (lambda fn=fn: torch.autograd.grad(fn.apply(q, k, v, None, None, N, N, scale, True, 0.1)[0],
                                                      (q, k, v), do))
           for name, fn in (("shipped (no LSE gradient)", F._EagerFlash), ("materialised", _Materialised))}
    for fn in fns.values():
        for _ in range(5):
            fn()
    host, dev = ({name: [] for name in fns} for _ in range(2))
    for r in range(5):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            host[name].append(host_us(fns[name]))
            dev[name].append(do_bench(fns[name], warmup=25, rep=100, return_mode="median"))
    for name in fns:
        print(f"{name:28s} | host us a call {statistics.median(host[name]):6.0f} | do_bench ms "
              f"{statistics.median(dev[name]):.3f} | rounds host {[round(x) for x in host[name]]} "
              f"ms {[round(x, 3) for x in dev[name]]}", flush=True)


if __name__ == "__main__":
    main()
