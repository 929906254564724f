"""Python time of a varlen forward + backward through the public function and autograd, as BERT calls it
(`flash_attn_varlen_qkvpacked_func` on packed projections, check_seqlens=False), on a machine without a GPU. One head
of 64 over 56 short sequences (the Python does not depend on the sizes; small tensors keep the CPU's own arithmetic
out of it), each call a new batch of lengths with the same count and longest sequence, as in training. Median of 7
rounds of 200 calls (scripts/bench_host_overhead.py's host_us). Two ways:
- "launches stubbed": kernels.launch.launch itself a no-op (launchers_cpu.py's stubs): the Python around it;
- "launch() kept": launch() as on the GPU, with each specialisation's compiled launcher a no-op (Triton's
  JITFunction.run returns a stand-in, kernels.launch._runner a no-op), so its key and the plans' binding count too.
--autotuned: FLASH_AUTOTUNE=1 with every key tuned (the lookup of the autotuner's choice), as benchmarks and training
run; without it, the fixed configs. --calls: instead of timing, the Python function calls a call makes (cProfile).

    FLASH_AUTOTUNE=0 python results/attention/host_plans/varlen_cpu.py [--kept] [--autotuned] [--calls]
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


class _Tuned(dict):
    """The autotuner's choices as after tuning: the same config for every key (FLASH_AUTOTUNE=1's lookup path)."""

    def get(self, key, default=None):
        return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def main():
    kept = "--kept" in sys.argv[1:]
    keep_launch() if kept else stub_launches(lambda *a: None)
    if "--autotuned" in sys.argv[1:]:  # as the benchmarks and training run: FLASH_AUTOTUNE=1, every key tuned
        os.environ["FLASH_AUTOTUNE"] = "1"
        F._TUNED_CONFIGS = _Tuned()
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

    if "--calls" in sys.argv[1:]:  # Python function calls a call makes (cProfile's count): no timing noise
        import cProfile
        import pstats

        for _ in range(20):
            step()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            step()
        profile.disable()
        stats = pstats.Stats(profile)
        print(f"tree {os.getcwd()}: {stats.total_calls / 100:.0f} function calls ({stats.prim_calls / 100:.0f} "
              f"primitive) a varlen forward + backward{' (launch() kept)' if kept else ''}")
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; tree {os.getcwd()}: varlen forward + backward "
          f"{host_us(step, calls=200, repeats=7):.1f} us a call ({'launch() kept' if kept else 'launches stubbed'}"
          f"{', autotuned' if '--autotuned' in sys.argv else ''})")


if __name__ == "__main__":
    main()
