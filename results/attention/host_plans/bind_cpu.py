"""What launch() spends on a kept specialisation before its runner, against a bound Prepared, on a machine without a
GPU: the Gluon backward's three launches at GPT-2's per-head shape (as launchers_cpu.py builds them, recorded), each
launched through launch() and through a Prepared bound to the same entry (which hands a descriptor-taking runner the
descriptors' parts, not descriptor objects), the runner a no-op and the device / stream lookups answered without a
driver. Median of 7 rounds of 300 calls (scripts/bench_host_overhead.py's host_us).

    FLASH_AUTOTUNE=0 python results/attention/host_plans/bind_cpu.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
sys.path.insert(0, os.path.join(os.getcwd(), "results", "attention", "host_python"))
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.launch as L  # noqa: E402
from bench_host_overhead import host_us  # noqa: E402
from launchers_cpu import stub_launches  # noqa: E402


def main():
    prepared = []
    real_call = L.Prepared.__call__

    def record(self, *tensors):
        prepared.append((self, tensors))
    L.Prepared.__call__ = record
    stub_launches(lambda *a: None)
    n = 1024
    q, k, v, o, do = (torch.randn(1, n, 1, 64, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.randn(1, 1, n)
    F._flash_bwd(do, q, k, v, o, lse, lse, 0.125, True, 0.0, False, None, None, n, n)
    L.Prepared.__call__ = real_call
    L.launch = real_launch
    L._interpreting = lambda: False
    L._current_device = lambda: 0
    L._current_stream = lambda device: 0
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; us a launch, runner a no-op")
    for p, tensors in prepared:
        args = (*(make(t) for make, t in zip(p.descriptors, tensors)), *tensors[len(p.descriptors):], *p.numbers)
        device, cache, key, small, rest = L._slot(p.kernel, args, p.constexprs)
        def runner(*a):  # as if launched before: a no-op, taking descriptors' parts as Triton 3.6's does
            pass
        runner.from_parts = runner
        cache[key] = (runner, L._tail(p.kernel, len(args), p.constexprs))
        through_launch = host_us(lambda: L.launch(p.kernel, p.grid, args, p.constexprs), repeats=7)
        p._calls = 1
        p(*tensors)  # the second call: binds
        assert p._bound is not None
        bound = host_us(lambda: p(*tensors), repeats=7)
        p._bound = None
        unbound = host_us(lambda: (p.__setattr__("_calls", 0), p(*tensors)), repeats=7)
        print(f"{p.kernel.fn.__name__:24s} launch() {through_launch:6.1f}   Prepared unbound {unbound:6.1f}   "
              f"bound {bound:6.1f}")


real_launch = L.launch

if __name__ == "__main__":
    main()
