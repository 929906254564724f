"""Where the host time of one attention forward+backward goes, on the GPU machine's host.

Twelve layers of self-attention on packed projections (batch 1, 1,024 tokens, one head of 64, causal, dropout 0.1 or
--dropout: GPT-2's per-head shape, so the Gluon backward runs, and without dropout the Gluon forward too) are so small on the GPU that a step's wall time is the host's.
Prints, per provider (ours, and SDPA as `attn=sdpa` calls it, in alternating turns), the median microseconds a step
of 5 rounds, and a JSON line with both and their ratio; with --profile, then ours under cProfile: the functions, C
calls included, by their own time per attention call.

    python results/attention/host_profile/host_profile.py [--steps 200] [--dropout 0.1] [--profile] [--top 35]
        [--label NAME]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.flash import flash_attn_qkvpacked_func  # noqa: E402

N, LAYERS = 1024, 12
DROPOUT = 0.1  # --dropout


def ours(qkv):
    return flash_attn_qkvpacked_func(qkv, dropout_p=DROPOUT, causal=True)


def sdpa(qkv):
    q, k, v = qkv.unbind(2)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=DROPOUT,
                                          is_causal=True).transpose(1, 2)


def make_step(attn):
    w = torch.randn(LAYERS, 64, 64, device="cuda", dtype=torch.bfloat16) * 0.1
    x = torch.randn(1, N, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        h = x
        for i in range(LAYERS):
            qkv = (h @ w[i]).view(1, N, 1, 1, 64).expand(1, N, 3, 1, 64).reshape(1, N, 3, 1, 64)
            h = h + attn(qkv).reshape(1, N, 64)
        torch.autograd.grad(h.float().sum(), x)
    return step


def per_step_us(step, steps, rounds=5):
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / steps * 1e6)
    return sorted(times)[rounds // 2], sorted(times)


def main():
    global DROPOUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dropout", type=float, default=DROPOUT)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    DROPOUT = a.dropout
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    steps = {name: make_step(fn) for name, fn in (("ours", ours), ("sdpa", sdpa))}
    medians = {"ours": [], "sdpa": []}
    for name in ("ours", "sdpa", "ours", "sdpa"):
        med, all_ = per_step_us(steps[name], a.steps)
        medians[name].append(med)
        print(f"{name}: {med:8.0f} us a step ({med / LAYERS:6.1f} a layer), rounds {[round(t) for t in all_]}",
              flush=True)
    ours_us, sdpa_us = min(medians["ours"]), min(medians["sdpa"])
    print(json.dumps(dict(label=a.label, dropout=a.dropout, ours_us_per_layer=round(ours_us / LAYERS, 1),
                          sdpa_us_per_layer=round(sdpa_us / LAYERS, 1), ours_over_sdpa=round(ours_us / sdpa_us, 3))),
          flush=True)
    if not a.profile:
        return
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        steps["ours"]()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
    print(f"--- ours under cProfile, {a.steps} steps = {a.steps * LAYERS} attention forward+backward calls; divide "
          f"tottime by {a.steps * LAYERS} for seconds a call")
    print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
