"""Python time of a varlen forward + backward through the public function and autograd, as BERT calls it
(`flash_attn_varlen_qkvpacked_func` on packed projections, check_seqlens=False), on a machine without a GPU. One head
of 64 over 56 short sequences (the Python does not depend on the sizes; small tensors keep the CPU's own arithmetic
out of it), each call a new batch of lengths with the same count and longest sequence, as in training. Median of 7
rounds of 200 calls (scripts/bench_host_overhead.py's host_us). Two ways:
- "launches stubbed": kernels.launch.launch itself a no-op (launchers_cpu.py's stubs): the Python around it;
- "launch() kept": launch() as on the GPU, with each specialisation's compiled launcher a no-op (Triton's
  JITFunction.run returns a stand-in, kernels.launch._runner a no-op), so its key and the plans' binding count too.

    FLASH_AUTOTUNE=0 python results/attention/host_plans/varlen_cpu.py [--kept]
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


class _Compiled:
    def _init_handles(self):
        pass


def keep_launch():
    """launch() as on the GPU, every compiled launcher a no-op."""
    from triton.runtime.jit import JITFunction

    JITFunction.run = lambda self, *args, **kwargs: _Compiled()
    L._runner = lambda compiled, leading: (lambda *args: None)
    L._current_device = lambda: 0
    L._current_stream = lambda device: 0
    stub_launches(L.launch)  # the Hopper checks as on the H100; launch() itself kept


def main():
    kept = sys.argv[1:] == ["--kept"]
    keep_launch() if kept else stub_launches(lambda *a: None)
    F._interpreting = L._interpreting = lambda: False  # the GPU's path through the launchers ...
    check = F.check_inputs

    def check_as_interpreted(*args, **kwargs):  # ... but for check_inputs' refusal of CPU tensors (both trees pay it)
        F._interpreting = lambda: True
        try:
            return check(*args, **kwargs)
        finally:
            F._interpreting = lambda: False
    F.check_inputs = check_as_interpreted
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(16):  # 56 sequences of 1-8 tokens, one of them 8: the same plan key, another packed length
        lengths = torch.randint(1, 8, (56,), generator=g)
        lengths[0] = 8
        cu = torch.zeros(57, dtype=torch.int32)
        cu[1:] = lengths.cumsum(0)
        qkv = torch.randn(int(cu[-1]), 3, 1, 64, generator=g).to(torch.bfloat16).requires_grad_()
        batches.append((qkv, cu, torch.ones(int(cu[-1]), 1, 64, dtype=torch.bfloat16)))
    turn = [0]

    def step():
        qkv, cu, grad = batches[turn[0] % len(batches)]
        turn[0] += 1
        out = F.flash_attn_varlen_qkvpacked_func(qkv, cu, 8, check_seqlens=False)
        torch.autograd.grad(out, qkv, grad)

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; tree {os.getcwd()}: varlen forward + backward "
          f"{host_us(step, calls=200, repeats=7):.1f} us a call ({'launch() kept' if kept else 'launches stubbed'})")


if __name__ == "__main__":
    main()
