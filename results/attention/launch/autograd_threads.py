"""Device probe (prepared, not yet run): is the autograd device thread where our host time goes?

host_overhead.md: a tiny flash fwd+bwd (batch 1, 128 tokens, 4 x 64) costs 1,325 us of host time against SDPA
flash's 581, while our own Python is ~80 us a fwd+bwd (host_python_cpu.txt). For CUDA tensors the autograd engine runs
backward on a device thread. A Python autograd.Function's backward (ours) must then take the GIL on that thread,
which cProfile on the main thread never sees. SDPA's backward is C++ and needs no GIL.
`torch.autograd.set_multithreading_enabled(False)` runs backward on the calling thread. If the GIL handoff is the
cost, ours drops toward SDPA's with it off, and SDPA barely moves. Prediction: ours 1.3 ms -> 0.5-0.7 ms.

    python results/attention/launch/autograd_threads.py        # on a GPU
"""
import sys

sys.path[:0] = [".", "scripts"]
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_host_overhead import host_us  # noqa: E402  (the measurement of host_overhead.md)
from kernels.flash import flash_attn_func  # noqa: E402


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    dev, dt = "cuda", torch.bfloat16
    dense = [torch.randn(1, 128, 4, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    heads_first = [torch.randn(1, 4, 128, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    gpt2 = [torch.randn(16, 1024, 12, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    gpt2_hf = [torch.randn(16, 12, 1024, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    cases = {
        "ours tiny": (lambda: flash_attn_func(*dense).sum().backward()),
        "sdpa tiny": (lambda: F.scaled_dot_product_attention(*heads_first).sum().backward()),
        # GPU-bound: wall time per call is the GPU's, the check that the setting does not slow real work
        "ours GPT-2 causal p0.1": (lambda: flash_attn_func(*gpt2, dropout_p=0.1, causal=True).sum().backward()),
        "sdpa GPT-2 causal p0.1": (lambda: F.scaled_dot_product_attention(*gpt2_hf, dropout_p=0.1,
                                                                           is_causal=True).sum().backward()),
    }
    for rnd in (1, 2):
        for threads in (True, False):
            torch.autograd.set_multithreading_enabled(threads)
            for name, fn in cases.items():
                calls = 300 if "tiny" in name else 30
                print(f"round {rnd} device thread {'on ' if threads else 'off'} {name:24s} "
                      f"{host_us(fn, calls=calls):8.1f} us per fwd+bwd", flush=True)
    torch.autograd.set_multithreading_enabled(True)


if __name__ == "__main__":
    main()
