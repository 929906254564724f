"""Host time per attention call, and the first call's latency.

At the BERT and GPT-2 training shapes an eager model is launch-bound: the Python work of each call
(checks, allocation, Triton's launcher, autograd) costs as much as the kernels. This measures it at a
shape so small that the GPU finishes each kernel before the host issues the next (batch 1, 128 tokens,
4 heads of 64, bf16): the wall time of many calls back to back, with no synchronisation between them,
is then the host time. Forward alone, and forward + backward (`out.sum().backward()`, whose own ops
are included and the same for every provider). Rows: ours dense and varlen (kernels.flash), block-sparse
dense and varlen (kernels.blocksparse), PyTorch SDPA's flash and cuDNN backends (dense).

First call (--first-call): a new process, the BERT varlen shape (16 sequences up to 512, 16 heads of 64,
dropout 0.1), forward + backward, with an empty Triton cache (compile + autotune) and again with the
cache that run left (what every later process pays).

    python scripts/bench_host_overhead.py                       # about a minute; --first-call adds ~2
Writes host_overhead.{json,md} to --out (results/attention by default), GPU, versions, date, command.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from _common import markdown_header, repo_path, repo_root, require_gpu, run_metadata

REPO = repo_root()
B, N, H, D = 1, 128, 4, 64


def host_us(fn, calls: int = 300, repeats: int = 5) -> float:
    """Median over repeats of the wall time per call of `calls` back-to-back calls (microseconds); the device is
    drained between repeats where there is a GPU (results/attention/host_python/ times Python alone, on the CPU)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(20):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
        sync()
    return sorted(times)[len(times) // 2]


def providers():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.blocksparse import blocksparse_attn_func, blocksparse_attn_varlen_func
    from kernels.flash import flash_attn_func, flash_attn_varlen_func
    from kernels import sparsity

    dev, dt = "cuda", torch.bfloat16
    dense = [torch.randn(B, N, H, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    packed = [torch.randn(B * N, H, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    heads_first = [torch.randn(B, H, N, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    cu = torch.tensor([0, 50, N], dtype=torch.int32, device=dev)
    layout = sparsity.local(N, N, 64, window=1)

    def sdpa(backend):
        def call(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return call

    return {
        "ours dense": (lambda q, k, v: flash_attn_func(q, k, v), dense),
        "ours varlen": (lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, 78, 78, check_seqlens=False), packed),
        "blocksparse dense": (lambda q, k, v: blocksparse_attn_func(q, k, v, layout), dense),
        "blocksparse varlen": (lambda q, k, v: blocksparse_attn_varlen_func(q, k, v, layout, cu, cu, 78, 78,
                                                                           check_seqlens=False), packed),
        "sdpa_flash": (sdpa(SDPBackend.FLASH_ATTENTION), heads_first),
        "sdpa_cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), heads_first),
    }


def cprofile(fn, inputs, calls: int = 500):
    import cProfile
    import pstats

    host_us(lambda: fn(*inputs).sum().backward(), calls=20, repeats=1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*inputs).sum().backward()
    torch.cuda.synchronize()
    prof.disable()
    print(f"cProfile of {calls} fwd+bwd calls (cumulative seconds / {calls} = per call):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def first_call_child():
    """One BERT-shape varlen forward + backward in this (new) process; prints the seconds it took."""
    from kernels.flash import flash_attn_varlen_func

    g = torch.Generator().manual_seed(0)
    lengths = torch.where(torch.rand(16, generator=g) < 0.7, 512, torch.randint(60, 512, (16,), generator=g))
    cu = torch.zeros(17, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    q, k, v = (torch.randn(int(cu[-1]), 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    cu = cu.cuda()
    torch.cuda.synchronize()
    t = time.perf_counter()
    flash_attn_varlen_func(q, k, v, cu, cu, int(lengths.max()), int(lengths.max()), dropout_p=0.1).sum().backward()
    torch.cuda.synchronize()
    print(json.dumps({"seconds": time.perf_counter() - t}))


def first_call() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, FLASH_AUTOTUNE="1")
        out = {}
        for name in ("empty cache", "warm cache"):
            p = subprocess.run([sys.executable, __file__, "--first-call-child"], env=env, capture_output=True,
                               text=True, cwd=REPO, timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"first-call child failed:\n{p.stderr[-3000:]}")
            out[name] = json.loads(p.stdout.strip().splitlines()[-1])["seconds"]
            print(f"first call, {name}: {out[name]:.2f} s", flush=True)
        return out


def markdown(rows: list[dict], first: dict | None, meta: dict) -> str:
    lines = markdown_header("Host time per attention call", meta)
    lines += ["", f"Shape: batch {B}, {N} tokens, {H} heads of {D}, bf16 (varlen: the same tokens as two sequences,",
              "50 + 78); the GPU work per call is a few microseconds, so the wall time per call of back-to-back",
              "calls is the host's. fwd+bwd includes `out.sum().backward()`'s own ops (the same for every row).", "",
              "| provider | fwd (us) | fwd+bwd (us) |", "|---|---:|---:|"]
    lines += [f"| {r['provider']} | {r['fwd_us']:.0f} | {r['fwdbwd_us']:.0f} |" for r in rows]
    if first:
        lines += ["", "First call, BERT varlen shape (16 sequences up to 512, 16 x 64, dropout 0.1, fwd+bwd), a new "
                  "process (FLASH_AUTOTUNE=1):", ""]
        lines += [f"- {k}: {v:.1f} s" for k, v in first.items()]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/attention")
    ap.add_argument("--first-call", action="store_true", help="also time a new process's first call")
    ap.add_argument("--first-call-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cprofile", default=None, metavar="PROVIDER",
                    help="print where the host time of PROVIDER's fwd+bwd goes (cProfile, top functions by own "
                         "time) and stop")
    args = ap.parse_args()
    if args.first_call_child:
        return first_call_child()
    require_gpu("bench_host_overhead.py", "measures CUDA launches")
    if args.cprofile:
        return cprofile(*providers()[args.cprofile])
    rows = []
    for name, (fn, inputs) in providers().items():
        fwd = host_us(lambda: fn(*inputs))
        fwdbwd = host_us(lambda: fn(*inputs).sum().backward())
        rows.append({"provider": name, "fwd_us": fwd, "fwdbwd_us": fwdbwd})
        print(f"{name:20s} fwd {fwd:6.0f} us   fwd+bwd {fwdbwd:6.0f} us", flush=True)
    first = first_call() if args.first_call else None
    meta = run_metadata()
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead.json").write_text(json.dumps({"env": meta, "rows": rows, "first_call_s": first}, indent=1))
    md = markdown(rows, first, meta)
    (out / "host_overhead.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
