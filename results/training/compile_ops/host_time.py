"""Host time of a compiled stack of 12 flash attention layers (forward + backward, causal, dropout 0.1, one head of
64), at a shape so small that the GPU's work is a few microseconds a layer: the wall time per step is the host's.
Run from a repo tree; prints one JSON line.

    python results/training/compile_ops/host_time.py [--steps 300] [--rounds 5] [--seqlen 128] [--eager]

--seqlen 1024 takes the Gluon backward (it starts at 1K with dropout), so FLASH_GLUON=0 against the default prices
the Gluon path's host time against the @triton.jit one's. --eager times the same layers uncompiled.
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
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--eager", action="store_true")
    a = ap.parse_args()
    n = a.seqlen
    w = torch.randn(12, 64, 64, device="cuda", dtype=torch.bfloat16) * 0.1

    def layers(x):
        for i in range(12):
            qkv = (x @ w[i]).view(1, n, 1, 1, 64).expand(1, n, 3, 1, 64).reshape(1, n, 3, 1, 64)
            x = x + flash_attn_qkvpacked_func(qkv, dropout_p=0.1, causal=True).view(1, n, 64)
        return x.float().sum()

    x = torch.randn(1, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step = layers if a.eager else torch.compile(layers, fullgraph=True)
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
    print(json.dumps(dict(label=a.label, seqlen=n, eager=a.eager, gluon=os.environ.get("FLASH_GLUON", "1"),
                          us_per_step=sorted(per_step), median=sorted(per_step)[a.rounds // 2],
                          attention_calls_per_step=24)), flush=True)


if __name__ == "__main__":
    main()
