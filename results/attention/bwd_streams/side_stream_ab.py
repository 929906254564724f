"""Device A/B of the shipped side-stream dQ (kernels/flash.py, FLASH_BWD_DQ_STREAM): forward+backward of
flash_attn_func with kernels.flash.BWD_DQ_SIDE_STREAM off / on, interleaved three times in one process, per shape.

    python results/attention/bwd_streams/side_stream_ab.py          # on a GPU
"""
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
from kernels import flash_attn_func  # noqa: E402

SHAPES = [(16, 1024, 12, 64, True, 0.1), (16, 1024, 12, 64, True, 0.0), (8, 512, 16, 64, False, 0.1),
          (16, 1024, 32, 64, False, 0.0), (4, 4096, 16, 128, True, 0.0), (4, 4096, 16, 128, False, 0.0)]


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    print(f"{'shape (b x n, heads, head dim)':38s} {'one stream (ms)':>24s} {'side stream (ms)':>24s} {'speedup':>8s}")
    for b, n, h, d, causal, p in SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)

        def step():
            flash_attn_func(q, k, v, dropout_p=p, causal=causal).backward(g)

        times = {False: [], True: []}
        for _ in range(3):
            for side in (False, True):
                F.BWD_DQ_SIDE_STREAM = side
                times[side].append(do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v]))
        one, two = (min(times[s]) for s in (False, True))
        name = f"{b}x{n} h{h} d{d} {'causal' if causal else 'full'} p{p}"
        print(f"{name:38s} {' '.join(f'{t:.3f}' for t in times[False]):>24s} "
              f"{' '.join(f'{t:.3f}' for t in times[True]):>24s} {one / two:7.3f}x", flush=True)


if __name__ == "__main__":
    main()
