"""Attention benchmark: runtime (forward, forward+backward), TFLOP/s and peak extra memory vs sequence length.

Providers: ours (kernels.flash), standard (plain PyTorch, the paper's baseline), PyTorch SDPA's flash,
efficient and cuDNN backends (torch.nn.attention.sdpa_kernel), FlexAttention (torch.compile'd).
Shapes follow the issue: batch x seqlen = 16K tokens, nheads x headdim = 2048, bf16.
FLOPs: 4 * B * H * N^2 * D forward (halved when causal), 3.5x that for forward+backward.

Full run (about 8 minutes on an H100):
    python scripts/bench_attention.py --out results/attention --tag h100
Quick tuning run:
    python scripts/bench_attention.py --seqlens 1024 4096 --hdims 128 --providers ours sdpa_flash --no-memory
Fused-dropout A/B at the GPT-2 small training shape (B 16, N 1024, H 12, D 64, causal, bf16), dropout 0 and
0.1: our kernel with each dropout RNG (FLASH_DROPOUT_RNG, one process each, own Triton cache) and SDPA-flash:
    python scripts/bench_attention.py --dropout-ab philox1 philox4 --out results/attention --tag dropout_ab
Writes <tag>.csv, <tag>.json (rows + GPU, versions, date, command, autotune picks), <tag>.md, <tag>.png.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

PROVIDERS = ["ours", "standard", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex"]
TOKENS, WIDTH = 16384, 2048


def flops(b, h, n, d, causal, mode):
    f = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def make_provider(name, causal, n):
    """Return (fn(q, k, v) -> out, layout) where layout 'bnhd' or 'bhnd' is the provider's native one."""
    if name == "ours":
        from kernels.flash import flash_attn_func
        return (lambda q, k, v: flash_attn_func(q, k, v, causal=causal)), "bnhd"
    if name == "standard":
        from kernels.standard import standard_attention
        return (lambda q, k, v: standard_attention(q, k, v, causal=causal)), "bnhd"
    if name.startswith("sdpa_"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[name]

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn, "bhnd"
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        compiled = _compiled_flex(flex_attention)
        mask = None
        if causal:
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cuda")
        return (lambda q, k, v: compiled(q, k, v, block_mask=mask)), "bhnd"
    raise ValueError(name)


_FLEX = {}


def _compiled_flex(fa):
    if "fn" not in _FLEX:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 256
        _FLEX["fn"] = torch.compile(fa, dynamic=False)
    return _FLEX["fn"]


def bench_one(name, b, h, n, d, causal, modes, memory, rep):
    import triton.testing
    fn, layout = make_provider(name, causal, n)
    shape = (b, n, h, d) if layout == "bnhd" else (b, h, n, d)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    row = {"provider": name, "hdim": d, "seqlen": n, "batch": b, "heads": h, "causal": causal}
    for mode in modes:
        if mode == "fwd":
            def run():
                with torch.no_grad():
                    fn(q, k, v)
        else:
            def run():
                torch.autograd.grad(fn(q, k, v), (q, k, v), do)
        run()  # compile / autotune outside the timing
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median")
        row[f"{mode}_ms"] = ms
        row[f"{mode}_tflops"] = flops(b, h, n, d, causal, mode) / ms * 1e-9
    if memory:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)
        torch.cuda.synchronize()
        row["peak_extra_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    del q, k, v, do
    torch.cuda.empty_cache()
    return row


GPT2_SMALL = dict(b=16, n=1024, h=12, d=64)


def dropout_ab_worker(rep):
    """One process, one dropout RNG (set by the parent in FLASH_DROPOUT_RNG): ours and SDPA-flash at the
    GPT-2 small shape, dropout 0 and 0.1, forward and forward+backward. Prints one JSON line per row."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.flash import flash_attn_func
    b, n, h, d = GPT2_SMALL["b"], GPT2_SMALL["n"], GPT2_SMALL["h"], GPT2_SMALL["d"]
    rng = os.environ.get("FLASH_DROPOUT_RNG", "philox4")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for prov in ("ours", "sdpa_flash"):
        layout = (b, n, h, d) if prov == "ours" else (b, h, n, d)
        q, k, v = (torch.randn(layout, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                   for _ in range(3))
        do = torch.randn(layout, device="cuda", dtype=torch.bfloat16, generator=gen)
        for p in (0.0, 0.1):
            if prov == "ours":
                fn = lambda: flash_attn_func(q, k, v, dropout_p=p, causal=True)  # noqa: E731
            else:
                def fn():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            row = {"kind": "dropout_ab", "provider": f"ours-{rng}" if prov == "ours" else f"sdpa_flash@{rng}", "dropout": p,
                   "batch": b, "seqlen": n, "heads": h, "hdim": d, "causal": True}
            for mode in ("fwd", "fwdbwd"):
                if mode == "fwd":
                    def run():
                        with torch.no_grad():
                            fn()
                else:
                    def run():
                        torch.autograd.grad(fn(), (q, k, v), do)
                run()  # autotune / compile outside the timing
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median")
                row[f"{mode}_ms"] = ms
                row[f"{mode}_tflops"] = flops(b, h, n, d, True, mode) / ms * 1e-9
            print("ABROW " + json.dumps(row), flush=True)
    print("ABTUNE " + json.dumps(autotune_picks()), flush=True)


def dropout_ab(args, meta):
    """Run one worker per RNG variant (fresh process; non-default variants get their own TRITON_CACHE_DIR)."""
    import subprocess
    rows, tunes = [], {}
    for rng in args.dropout_ab:
        env = dict(os.environ, FLASH_DROPOUT_RNG=rng)
        if rng != "philox4":  # the default variant keeps the default cache (bench_training's ours-flash reuses it)
            env["TRITON_CACHE_DIR"] = f"/tmp/triton_cache_{rng}"
        cmd = [sys.executable, os.path.abspath(__file__), "--dropout-ab-worker", "--rep", str(args.rep)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        got = [json.loads(ln[6:]) for ln in p.stdout.splitlines() if ln.startswith("ABROW ")]
        tunes[rng] = [json.loads(ln[7:]) for ln in p.stdout.splitlines() if ln.startswith("ABTUNE ")]
        if p.returncode != 0 or not got:
            rows.append({"kind": "dropout_ab", "provider": f"ours-{rng}", "error": (p.stderr or p.stdout)[-1500:]})
        rows += got
        print(p.stdout[-3000:], p.stderr[-1500:] if p.returncode else "", flush=True)
    meta["autotune"] = tunes
    base = os.path.join(args.out, args.tag)
    with open(base + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    ok = [r for r in rows if "error" not in r]
    ref = {(r["provider"], r["dropout"]): r for r in ok}
    lines = [f"# Fused dropout A/B at the GPT-2 small attention shape ({meta['gpu']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}. Command: `{meta['command']}`", "",
             "B 16, N 1024, H 12, D 64, causal, bf16; median ms of triton.testing.do_bench (forward under no_grad; "
             "forward+backward = autograd.grad of q, k, v). ours-philox1: one Philox4x32-10 call per score "
             "element (the previous kernel); ours-philox4: one call per 4 keys. Each variant ran in its own "
             "process (own autotune; philox1 with its own Triton cache); SDPA-flash was measured in each "
             "process (sdpa_flash@<variant>).", "",
             "| provider | dropout | fwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | dropout cost fwd+bwd (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in ok:
        base0 = ref.get((r["provider"], 0.0))
        cost = f"{r['fwdbwd_ms'] - base0['fwdbwd_ms']:+.3f}" if base0 and r["dropout"] > 0 else ""
        lines.append(f"| {r['provider']} | {r['dropout']} | {r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | "
                     f"{r['fwdbwd_tflops']:.0f} | {cost} |")
    lines += [f"| {r['provider']} | failed: {r['error'].strip().splitlines()[-1][:150]} | | | | |"
              for r in rows if "error" in r]
    md = "\n".join(lines) + "\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)


def standard_fits(b, h, n):
    # scores in bf16 plus their float32 copy for the log-sum-exp, softmax output and grads: ~12 bytes/score.
    free = torch.cuda.mem_get_info()[0]
    return 12 * b * h * n * n < 0.8 * free


def autotune_picks():
    try:
        from kernels import flash
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for name, k in (("fwd", flash._fwd_tuned), ("dkdv", flash._dkdv_tuned), ("dq", flash._dq_tuned)):
        out[name] = {str(key): str(cfg) for key, cfg in getattr(k, "cache", {}).items()}
    return out


def _ratio(o, p, key):
    return f"{p[key] / o[key]:.2f}" if o and p and key in o and key in p else "-"


def markdown(rows, meta):
    lines = [f"# Attention benchmark ({meta['gpu']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}. Command: `{meta['command']}`", "",
             "batch x seqlen = 16K tokens, nheads x headdim = 2048, bf16. Cells: TFLOP/s forward / forward+backward "
             "(4BHN^2D forward, halved causal, x3.5 fwd+bwd; median of do_bench). 'x peer' = peer time / our time "
             "(> 1: we are faster), fwd, fwd+bwd. mem = peak extra MiB during fwd+bwd.", ""]
    keys = sorted({(r["hdim"], r["causal"]) for r in rows if r.get("kind") != "gpt2"})
    provs = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    peers = [p for p in ("sdpa_flash", "flex", "sdpa_cudnn", "standard") if p in provs]
    for d, causal in keys:
        lines += [f"## head dim {d}, {'causal' if causal else 'non-causal'}", ""]
        head = "| seqlen | " + " | ".join(provs) + " | " + " | ".join(f"x {p}" for p in peers) + \
            " | mem ours | mem sdpa_flash | mem standard |"
        lines += [head, "|" + "---|" * (1 + len(provs) + len(peers) + 3)]
        for n in sorted({r["seqlen"] for r in rows if r["hdim"] == d and r["causal"] == causal}):
            by = {r["provider"]: r for r in rows if r["hdim"] == d and r["causal"] == causal and r["seqlen"] == n
                  and r.get("kind") != "gpt2"}
            cells = []
            for p in provs:
                r = by.get(p)
                cells.append("-" if r is None else f"{r.get('fwd_tflops', float('nan')):.0f} / "
                             f"{r.get('fwdbwd_tflops', float('nan')):.0f}")
            o = by.get("ours")
            ratios = [f"{_ratio(o, by.get(p), 'fwd_ms')}, {_ratio(o, by.get(p), 'fwdbwd_ms')}" for p in peers]
            mem = [f"{by[p]['peak_extra_MiB']:.0f}" if p in by and "peak_extra_MiB" in by[p] else "-"
                   for p in ("ours", "sdpa_flash", "standard")]
            lines.append(f"| {n} | " + " | ".join(cells + ratios + mem) + " |")
        lines.append("")
    g = [r for r in rows if r.get("kind") == "gpt2"]
    if g:
        lines += ["## GPT-2 medium attention (seq 1024, hdim 64, 16 heads, batch 64, causal)", "",
                  "| provider | fwd+bwd ms | fwd ms |", "|---|---|---|"]
        lines += [f"| {r['provider']} | {r['fwdbwd_ms']:.2f} | {r['fwd_ms']:.2f} |" for r in g]
        lines += ["", "Paper (A100, Dao et al. 2022): 7.3 ms FlashAttention vs 41.7 ms standard.", ""]
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r.get("kind") != "gpt2"]
    keys = sorted({(r["hdim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 7), squeeze=False)
    for j, (d, causal) in enumerate(keys):
        sel = [r for r in rows if r["hdim"] == d and r["causal"] == causal]
        ns = sorted({r["seqlen"] for r in sel})
        std = {r["seqlen"]: r for r in sel if r["provider"] == "standard"}
        for p in PROVIDERS:
            if p == "standard":
                continue
            pr = {r["seqlen"]: r for r in sel if r["provider"] == p}
            xs = [n for n in ns if n in pr and n in std and "fwdbwd_ms" in pr[n]]
            if xs:
                axes[0, j].plot(xs, [std[n]["fwdbwd_ms"] / pr[n]["fwdbwd_ms"] for n in xs], "o-", label=p)
            xs = [n for n in ns if n in pr and n in std and "peak_extra_MiB" in pr[n] and "peak_extra_MiB" in std[n]]
            if xs:
                axes[1, j].plot(xs, [std[n]["peak_extra_MiB"] / max(pr[n]["peak_extra_MiB"], 1e-3) for n in xs],
                                "o-", label=p)
        axes[0, j].set_title(f"hdim {d}, {'causal' if causal else 'non-causal'}")
        axes[0, j].set_ylabel("fwd+bwd speedup over standard")
        axes[1, j].set_ylabel("memory saved (standard / provider)")
        for i in range(2):
            axes[i, j].set_xscale("log", base=2)
            axes[i, j].set_xlabel("sequence length")
            axes[i, j].grid(True, alpha=0.3)
        axes[0, j].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--providers", nargs="+", default=PROVIDERS, choices=PROVIDERS)
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    ap.add_argument("--flex-seqlens", type=int, nargs="*", default=None,
                    help="run FlexAttention only at these lengths (it compiles per shape: ~15 s each)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2-medium shape row")
    ap.add_argument("--rep", type=int, default=60, help="do_bench repetition time in ms")
    ap.add_argument("--out", default="results/attention")
    ap.add_argument("--tag", default="bench")
    ap.add_argument("--dropout-ab", nargs="+", default=None, choices=["philox1", "philox4"],
                    help="only the fused-dropout A/B at the GPT-2 small shape, one process per RNG variant")
    ap.add_argument("--dropout-ab-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dropout_ab_worker:
        dropout_ab_worker(args.rep)
        return

    import triton
    os.makedirs(args.out, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": "python " + " ".join(sys.argv)}
    if args.dropout_ab:
        dropout_ab(args, meta)
        return
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    rows = []
    t0 = time.time()
    base = os.path.join(args.out, args.tag)
    fields = ["kind", "provider", "hdim", "seqlen", "batch", "heads", "causal", "fwd_ms", "fwdbwd_ms", "fwd_tflops",
              "fwdbwd_tflops", "peak_extra_MiB", "error"]

    def save():  # after every row, so a run cut off at its time limit still leaves its numbers
        meta["seconds"] = time.time() - t0
        meta["autotune"] = autotune_picks()
        with open(base + ".json", "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in fields})

    def record(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
        save()

    for d in args.hdims:
        h = WIDTH // d
        for causal in causals:
            for n in args.seqlens:
                b = max(1, TOKENS // n)
                for p in args.providers:
                    if p == "standard" and not standard_fits(b, h, n):
                        continue
                    if p == "flex" and args.flex_seqlens and n not in args.flex_seqlens:
                        continue
                    try:
                        r = bench_one(p, b, h, n, d, causal, args.modes, not args.no_memory, args.rep)
                    except Exception as e:  # noqa: BLE001  (a peer without this shape: record and go on)
                        r = {"provider": p, "hdim": d, "seqlen": n, "batch": b, "heads": h, "causal": causal,
                             "error": f"{type(e).__name__}: {str(e)[:200]}"}
                        torch.cuda.empty_cache()
                    record(r)
    if not args.no_gpt2:
        for p in ["ours", "standard", "sdpa_flash"]:
            if p in args.providers:
                r = bench_one(p, 64, 16, 1024, 64, True, ["fwd", "fwdbwd"], False, args.rep)
                r["kind"] = "gpt2"
                record(r)
    save()
    md = markdown([r for r in rows if "error" not in r], meta)
    with open(base + ".md", "w") as f:
        f.write(md)
    try:
        plot([r for r in rows if "error" not in r], base + ".png")
    except Exception as e:  # noqa: BLE001
        print("plot failed:", e)
    print(md)
    print(f"total {meta['seconds']:.0f} s")


if __name__ == "__main__":
    main()
