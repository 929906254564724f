"""Why ours at the GPT-2 small shape (16 x 1024, 12 heads of 64, causal) took 0.98 ms forward+backward without dropout
and 0.63 ms with dropout 0.1 in ../model_shapes_h100.md, while its kernels should take about 0.45 ms: per dropout and
provider (ours; SDPA's cuDNN backend, what attn=sdpa runs), in interleaved rounds,
  - bench: the do_bench median of the autograd forward+backward, as in the table;
  - host:  host time a call to enqueue 40 calls behind a 20 ms GPU sleep (the queue never drains, so launches never
           wait for the GPU);
  - gpu:   the kernels' time a call in a torch.profiler trace of 20 calls, and the kernels by name (last round).

    python results/attention/gpt2_shape/trace.py   # GPU
"""
import sys
import time
from collections import defaultdict

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import torch  # noqa: E402
import triton  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
from bench_attention import MODEL_SHAPES, model_setup  # noqa: E402

GPT2 = MODEL_SHAPES["gpt2-small"]
B, N, H, D = (GPT2[key] for key in "bnhd")


def make(provider, p):
    """The autograd forward+backward of `provider` (ours, sdpa_cudnn) at GPT-2's shape, as the model-shapes table
    builds it."""
    fn, q, k, v, do = model_setup(GPT2, provider, p, torch.full((B,), N))
    return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do)


def host_us(fn, calls=40):
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)  # ~20 ms of GPU clock cycles
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def kernels(fn, calls=20):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:70]] += e.device_time / calls
    return per


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; B {B} N {N} H {H} D {D} causal bf16; "
          f"autotune {'on' if F._autotuning() else 'off'}", flush=True)
    cases = [(prov, p) for p in (0.0, 0.1) for prov in ("ours", "sdpa_cudnn")]
    fns = {c: make(*c) for c in cases}
    for fn in fns.values():
        for _ in range(3):
            fn()
    results = defaultdict(lambda: defaultdict(list))
    for r in range(3):
        for c in (cases if r % 2 == 0 else cases[::-1]):
            fn = fns[c]
            results[c]["bench"].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
            results[c]["host"].append(host_us(fn))
            per = kernels(fn)
            results[c]["gpu"].append(sum(per.values()) / 1e3)
            results[c]["per"] = per
    print("provider, dropout | bench ms | host us a call | gpu ms a call (kernels) | rounds")
    for c in cases:
        m = {k: sorted(v)[1] for k, v in results[c].items() if k != "per"}
        print(f"{c[0]:10s} {c[1]:.1f} | {m['bench']:.3f} | {m['host']:.0f} | {m['gpu']:.3f} | "
              f"bench {[round(x, 3) for x in results[c]['bench']]} host {[round(x) for x in results[c]['host']]} "
              f"gpu {[round(x, 3) for x in results[c]['gpu']]}", flush=True)
    for c in cases:
        print(f"== {c[0]} dropout {c[1]} kernels (us a call, last round)")
        for name, us in sorted(results[c]["per"].items(), key=lambda x: -x[1]):
            print(f"   {us:8.1f}  {name}")


if __name__ == "__main__":
    main()
