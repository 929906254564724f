"""Why the autograd forward+backward with the Gluon kernels can take longer than its kernels (session 26: 1K causal
at head dim 128 in the attention table, 512 non-causal in short.py): a torch.profiler trace of 20 calls, summed per
kernel and per CUDA runtime call (a synchronising call would show here), against the calls' wall time.

    python results/attention/launch_direct/fb_trace.py   # GPU (sm_90)
"""
import sys
import time
from collections import defaultdict

sys.path.insert(0, ".")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import kernels.flash as F  # noqa: E402


def trace(n, causal, gluon, d=128, calls=20):
    b, h = 16384 // n, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    do = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    F.GLUON_KERNELS = gluon
    fb = lambda: torch.autograd.grad(F.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)  # noqa: E731
    for _ in range(5):
        fb()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fb()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    gpu, api = defaultdict(float), defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu[e.name[:60]] += e.device_time / calls
        elif e.name.startswith("cuda") or e.name.startswith("cu"):
            api[e.name][0] += 1
            api[e.name][1] += e.cpu_time_total / calls
    kind = f"n {n} {'causal' if causal else 'full'} {'gluon' if gluon else 'triton'}"
    print(f"== {kind}: wall {wall / calls * 1e3:.3f} ms "
          f"a call (host {host / calls * 1e3:.3f}), kernels {sum(gpu.values()) / 1e3:.3f} ms", flush=True)
    for name, us in sorted(gpu.items(), key=lambda x: -x[1]):
        print(f"   gpu {us:8.1f} us  {name}")
    for name, (count, us) in sorted(api.items(), key=lambda x: -x[1][1]):
        print(f"   api {us:8.1f} us  {count / calls:5.1f}x  {name}")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    for n, causal in ((1024, True), (512, False)):
        for gluon in (True, False):
            trace(n, causal, gluon)
