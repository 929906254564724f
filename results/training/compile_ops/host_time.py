"""Host time of a compiled stack of 12 flash attention layers (forward + backward), at a shape so small that the
GPU's work is a few microseconds: the wall time per step is the host's. Run from a repo tree; prints one JSON line.

    python results/training/compile_ops/host_time.py [--steps 300] [--rounds 5]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())  # the tree this runs in: this repo's, or the shipped copy the A/B makes

import torch  # noqa: E402

from kernels.flash import flash_attn_qkvpacked_func  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    w = torch.randn(12, 64, 64, device="cuda", dtype=torch.bfloat16) * 0.1

    def layers(x):
        for i in range(12):
            qkv = (x @ w[i]).view(1, 128, 1, 1, 64).expand(1, 128, 3, 1, 64).reshape(1, 128, 3, 1, 64)
            x = x + flash_attn_qkvpacked_func(qkv, dropout_p=0.1, causal=True).view(1, 128, 64)
        return x.float().sum()

    x = torch.randn(1, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step = torch.compile(layers, fullgraph=True)
    for _ in range(20):
        torch.autograd.grad(step(x), x)
    torch.cuda.synchronize()
    per_step = []
    for _ in range(a.rounds):
        t = time.perf_counter()
        for _ in range(a.steps):
            torch.autograd.grad(step(x), x)
        torch.cuda.synchronize()
        per_step.append((time.perf_counter() - t) / a.steps * 1e6)
    print(json.dumps(dict(label=a.label, us_per_step=sorted(per_step), median=sorted(per_step)[a.rounds // 2],
                          attention_calls_per_step=24)), flush=True)


if __name__ == "__main__":
    main()
