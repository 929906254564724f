"""Python time of the backward's launcher, `kernels.flash._flash_bwd`, per call, on a machine without a GPU.

Every Triton / Gluon launch is replaced by a no-op (kernels.launch.launch), the Hopper-only checks answer as on the
H100, and flash_gluon's dQ zero-fill becomes an empty allocation (on the GPU it is an asynchronous memset, here a CPU
one). So what is timed is the Python between the launches: the Gluon path's checks, allocations and descriptors,
against the @triton.jit path's. One head of 1,024 tokens (the Gluon backward takes dropout from 1K), head dim 64,
causal, dropout 0.1 (the forwards: without dropout); median of 7 rounds of 300 calls (scripts/bench_host_overhead.py's
host_us); then the Gluon backward's cProfile.

    FLASH_AUTOTUNE=0 python results/attention/host_python/launchers_cpu.py
"""
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch  # noqa: E402

import kernels.blocksparse as B  # noqa: E402
import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402
import kernels.launch as L  # noqa: E402
from bench_host_overhead import host_us  # noqa: E402

launched = []


def _no_launch(kernel, grid, args, constexprs):
    launched.append(getattr(kernel, "__name__", str(kernel)))


class _TorchZerosAsEmpty:
    def __getattr__(self, name):
        return torch.empty if name == "zeros" else getattr(torch, name)


def stub_launches(launch):
    """Every Triton / Gluon launch of kernels.flash, kernels.flash_gluon and kernels.blocksparse goes to `launch` (kernel, grid, args,
    constexprs) instead; the Hopper-only checks answer as on the H100 (sm_90, 132 SMs); flash_gluon's zero-fills are
    empty allocations (on the GPU an asynchronous memset, here a CPU one). launch_records.py uses it too."""
    # kernels.launch's own too: the launchers' prepared launches (L.Prepared)
    F.launch = G.launch = B.launch = L.launch = launch
    F._ws_platform_unsupported = lambda q: None
    G._sm_count = lambda device: 132
    G.torch = _TorchZerosAsEmpty()

b, n, h, d = 1, 1024, 1, 64
q, k, v, o, do = (torch.randn(b, n, h, d, dtype=torch.bfloat16) for _ in range(5))
lse = torch.randn(b, h, n)
seed = torch.zeros(1, dtype=torch.int64)


def backward(gluon: bool):
    return F._flash_bwd(do, q, k, v, o, lse, seed, 0.125, True, 0.1, False, None, None, n, n, gluon=gluon)


def forward(warp_spec):  # no dropout: the Gluon forward takes GPT-2's causal 1K from 4K tokens with dropout
    return F._flash_fwd(q, k, v, 0.125, True, 0.0, False, None, None, n, n, warp_spec=warp_spec)


def main():
    stub_launches(_no_launch)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; Python time per call, launches stubbed")
    for label, call in (("Gluon backward", lambda: backward(True)), ("@triton.jit backward", lambda: backward(False)),
                        ("Gluon forward", lambda: forward(None)), ("@triton.jit forward", lambda: forward(False))):
        launched.clear()
        call()
        names = ", ".join(launched)
        print(f"{label:22s} {host_us(call, repeats=7):7.1f} us   launches: {names}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        backward(True)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(16)


if __name__ == "__main__":
    main()
