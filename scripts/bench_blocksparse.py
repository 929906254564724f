"""Block-sparse attention benchmark: forward and forward+backward time against sequence length and density.

Providers, all in bf16 on the same inputs and the same block layout:
  ours      kernels.blocksparse.blocksparse_attn_func
  flash     our dense kernel (kernels.flash.flash_attn_func): what density 1 costs
  flex      FlexAttention (torch.compile'd) with create_block_mask built from the same layout
  standard  plain PyTorch with the dense token mask (only where the N x N scores fit)
Shapes: batch x seqlen = 16K tokens (batch 1 from 16K up), nheads x headdim = 2048, block_size 128.
Sequence-length sweep: the paper's butterfly pattern (density (1 + log2 n) / n for n blocks).
Density sweep (at 4K and 16K): random layouts with exactly round(density * n) key blocks per query block.

Each point times its providers in --rounds interleaved rounds (default 3) and keeps the medians.
Full run (about 8 minutes on an H100):
    python scripts/bench_blocksparse.py --rep 25 --tag h100
Quick run / tile sweep:
    python scripts/bench_blocksparse.py --seqlens 4096 16384 --hdims 64 --densities --sweep
Plot again from the JSON (no GPU needed):
    python scripts/bench_blocksparse.py --plot-only results/blocksparse/h100.json
Writes <tag>.csv, <tag>.json (rows + GPU, versions, date, command, tile configs), <tag>.md, <tag>.png to
--out, by default results/blocksparse/.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time

import torch

from _common import (capture_graph, compiled_flex_attention, markdown_header, pyplot, repo_path, repo_root,
                     require_gpu, run_metadata)

repo_root()

TOKENS, WIDTH, BLOCK = 16384, 2048, 128
CAUSAL = False  # --causal: every provider also applies the token-level causal mask
PROVIDERS = ["ours", "flash", "flex", "standard"]


def shape(n, d):
    return max(1, TOKENS // n), WIDTH // d  # batch, nheads


def balanced_random(n, density, seed=0, device="cuda"):
    """(1, nb, nb) bool with exactly max(1, round(density * nb)) random key blocks per query block."""
    from kernels.sparsity import BlockSparseLayout, cdiv

    nb = cdiv(n, BLOCK)
    keep = max(1, round(density * nb))
    g = torch.Generator().manual_seed(seed)
    ranks = torch.rand(nb, nb, generator=g).argsort(-1).argsort(-1)
    return BlockSparseLayout((ranks < keep).unsqueeze(0).to(device), BLOCK, n, n)


_FLEX = {}  # seqlen -> (layout buffer, mask_mod)


def flex_fn(layout, b, h, n):
    """Compiled flex_attention with a BlockMask made by create_block_mask from the same block layout.

    One mask_mod (reading one layout buffer) per sequence length, refilled in place for each layout, so
    the density sweep does not recompile for every new mask.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if n not in _FLEX:
        buf = torch.zeros(layout.blocks.shape[1:], dtype=torch.bool, device="cuda")

        def mask_mod(bi, hi, qi, ki):
            allowed = buf[qi // BLOCK, ki // BLOCK]
            return (allowed & (ki <= qi)) if CAUSAL else allowed

        _FLEX[n] = (buf, mask_mod)
    buf, mask_mod = _FLEX[n]
    buf.copy_(layout.blocks[0])
    bm = create_block_mask(mask_mod, None, None, n, n, device="cuda", BLOCK_SIZE=BLOCK, _compile=True)
    compiled = compiled_flex_attention()
    return lambda q, k, v: compiled(q, k, v, block_mask=bm)


def standard_fits(b, h, n):
    return b * h * n * n <= 2**31  # scores + probabilities + their grads stay well inside 80 GB


def make(name, layout, b, h, n):
    """(fn(q, k, v) -> out, 'bnhd' | 'bhnd')."""
    if name == "ours":
        from kernels.blocksparse import blocksparse_attn_func

        return (lambda q, k, v: blocksparse_attn_func(q, k, v, layout, causal=CAUSAL)), "bnhd"
    if name == "flash":
        from kernels.flash import flash_attn_func

        return (lambda q, k, v: flash_attn_func(q, k, v, causal=CAUSAL)), "bnhd"
    if name == "flex":
        return flex_fn(layout, b, h, n), "bhnd"
    if name == "standard":
        from kernels.standard import standard_attention

        mask = layout.to_dense().unsqueeze(0)
        if CAUSAL:
            mask = mask & torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
        return (lambda q, k, v: standard_attention(q, k, v, mask=mask)), "bnhd"
    raise ValueError(name)


class Timed:
    """One provider at one point: its inputs, warmed up (compiled) on creation; `round()` times it once
    more. Same numbers for every provider: drawn (b, n, h, d), copied to (b, h, n, d) for FlexAttention.

    With `graphed`, fwd+bwd is also captured once in a CUDA graph and each round times its replay: the
    device's time alone. The plain times include the host's launch path (Python, autograd, compile
    guards), which at a fraction of a millisecond of kernel time decides much of the total and varies
    with the machine's CPU load."""

    def __init__(self, name, layout, b, h, n, d, graphed=False):
        self.fn, self.order = make(name, layout, b, h, n)
        g = torch.Generator(device="cuda").manual_seed(0)
        fix = (lambda t: t) if self.order == "bnhd" else (lambda t: t.transpose(1, 2).contiguous())
        q, k, v, self.do = (fix(torch.randn(b, n, h, d, generator=g, device="cuda", dtype=torch.bfloat16))
                            for _ in range(4))
        self.qkv = [t.requires_grad_() for t in (q, k, v)]
        self.step()  # compile / warm up
        torch.cuda.synchronize()
        self.fwd, self.fwdbwd, self.graphed, self.graph = [], [], [], None
        if graphed:
            try:
                self.graph = capture_graph(self.step, self.qkv)
            except Exception as e:  # a provider that cannot be captured keeps its plain times
                print(f"  {name}: CUDA graph capture failed: {type(e).__name__}: {str(e)[:200]}", flush=True)

    def zero_grads(self):
        for t in self.qkv:
            t.grad = None

    def step(self):
        self.fn(*self.qkv).backward(self.do)

    def round(self, rep):
        import triton.testing

        self.fwd.append(triton.testing.do_bench(lambda: self.fn(*self.qkv), warmup=10, rep=rep,
                                                return_mode="median"))
        self.fwdbwd.append(triton.testing.do_bench(self.step, warmup=10, rep=rep, grad_to_none=self.qkv,
                                                   return_mode="median"))
        if self.graph is not None:
            self.graphed.append(triton.testing.do_bench(self.graph.replay, warmup=10, rep=rep, return_mode="median"))

    def finish(self):
        """Median over rounds, the spread (max / min of fwd+bwd over rounds), peak extra memory of one
        step, and the output for the cross-provider check."""
        row = dict(fwd_ms=statistics.median(self.fwd), fwdbwd_ms=statistics.median(self.fwdbwd),
                   rounds=len(self.fwdbwd), round_spread=max(self.fwdbwd) / min(self.fwdbwd))
        if self.graphed:
            row["graphed_ms"] = statistics.median(self.graphed)
        self.graph = None
        self.zero_grads()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.step()
        torch.cuda.synchronize()
        row["peak_extra_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        with torch.no_grad():
            o = self.fn(*self.qkv)
            row["out"] = o if self.order == "bnhd" else o.transpose(1, 2)
        return row


def run_point(kind, pattern, n, d, layout, providers, rep, rows, rounds=3):
    """Time every provider at one point in `rounds` interleaved rounds (ours, flash, flex, standard,
    ours, ...) and keep each one's median: the GPU is shared, and interference that lands on one
    provider's only measurement would otherwise decide a ratio. Providers slower than 20 ms fwd+bwd get
    one round (long runs average it out)."""
    b, h = shape(n, d)
    base = dict(sweep=kind, pattern=pattern, seqlen=n, headdim=d, batch=b, nheads=h,
                density=round(layout.density(), 5))
    timed, t0 = {}, {}
    for name in providers:
        if name == "standard" and not standard_fits(b, h, n):
            continue
        if name == "flash" and kind == "density" and any(r["provider"] == "flash" and r["seqlen"] == n and
                                                         r["headdim"] == d for r in rows):
            continue  # dense time does not depend on the layout
        t0[name] = time.time()
        try:
            timed[name] = Timed(name, layout, b, h, n, d, graphed=name in ("ours", "flex"))
            timed[name].round(rep)
        except Exception as e:  # OOM, or a peer failing: must not lose the rest of the run
            timed.pop(name, None)
            torch.cuda.empty_cache()
            err = "OOM" if isinstance(e, torch.OutOfMemoryError) else type(e).__name__
            print(f"  {name} n={n} d={d}: {err}: {str(e)[:300]}", flush=True)
            rows.append(dict(base, provider=name, error=err))
    for _ in range(rounds - 1):
        for t in timed.values():
            if t.fwdbwd[0] < 20:
                t.round(rep)
    ref = None
    for name, t in timed.items():
        r = t.finish()
        out = r.pop("out")
        if name == "ours":
            ref = out.float()
        diff = float((out.float() - ref).abs().max()) if ref is not None and name in ("flex", "standard") else None
        del out
        rows.append(dict(base, provider=name, max_diff_vs_ours=diff, wall_s=round(time.time() - t0[name], 1),
                         **{k: round(v, 4) for k, v in r.items()}))
        print(f"  {kind:8s} {pattern:10s} n={n:6d} d={d:3d} dens={layout.density():.4f} {name:8s} "
              f"fwd {r['fwd_ms']:9.3f} ms  fwd+bwd {r['fwdbwd_ms']:9.3f} ms (x{r['round_spread']:.2f} over "
              f"{r['rounds']}, graphed {r.get('graphed_ms', float('nan')):8.3f})  mem {r['peak_extra_mb']:8.0f} MB  "
              f"diff {diff}", flush=True)
    del timed
    torch.cuda.empty_cache()


def tile_sweep(rep, apply=False):
    """Time tile candidates per kernel at 16K butterfly for hd 64 and 128; with apply, keep the fastest."""
    import triton.testing

    import kernels.blocksparse as B
    from kernels.sparsity import butterfly

    cands = {
        64: {"fwd": [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 4)],
             "bwd": [(64, 64, 64, 64, 4, 2), (64, 64, 64, 64, 4, 3), (32, 128, 64, 64, 4, 3)]},
        128: {"fwd": [(128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)],
              "bwd": [(64, 128, 128, 128, 8, 2), (64, 64, 64, 64, 4, 2), (64, 128, 128, 64, 8, 2)]},
    }
    out = []
    n = 16384
    lay = butterfly(n, n, BLOCK, device="cuda")
    for d in (64, 128):
        b, h = shape(n, d)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        do = torch.randn_like(q)
        start = dict(B.TILES[d])
        for kind, cs in cands[d].items():
            best = None
            for c in cs:
                B.TILES[d][kind] = c
                try:
                    if kind == "fwd":
                        ms = triton.testing.do_bench(lambda: B.blocksparse_attn_func(q, k, v, lay), warmup=10,
                                                     rep=rep, return_mode="median")
                    else:
                        ms = triton.testing.do_bench(lambda: B.blocksparse_attn_func(q, k, v, lay).backward(do),
                                                     warmup=10, rep=rep, grad_to_none=[q, k, v],
                                                     return_mode="median")
                except Exception as e:  # out of shared memory / registers for this tile
                    print(f"  sweep d={d} {kind} {c}: failed ({type(e).__name__})", flush=True)
                    continue
                out.append(dict(headdim=d, kernel=kind, config=list(c), ms=round(ms, 4)))
                print(f"  sweep d={d} {kind:5s} {c}: {ms:.3f} ms ({'fwd' if kind == 'fwd' else 'fwd+bwd'})",
                      flush=True)
                if best is None or ms < best[0]:
                    best = (ms, c)
            # Later kernels are timed with the earlier kernels' picks (apply) or the defaults.
            B.TILES[d][kind] = best[1] if (apply and best) else start[kind]
    return out


def markdown(rows, meta, sweep):
    lines = markdown_header("Block-sparse attention benchmark", meta) + [
        f"- bf16, batch x seqlen = {TOKENS} tokens, nheads x headdim = {WIDTH}, block_size {BLOCK}, "
        f"{'causal' if meta.get('causal') else 'non-causal'}; times in ms: each a triton.testing.do_bench median; with rounds, the median over "
        "rounds that interleave the providers (spread: max / min fwd+bwd over the rounds); graphed: "
        "fwd+bwd replayed from a CUDA graph, the device time without the host's launch path",
        f"- tiles per head-dim class (fwd: BLOCK_M, BLOCK_N, warps, stages; bwd: BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, warps, stages; bwd_mode, see kernels/blocksparse.py): {meta.get('tiles')}",
        "- speedup = our dense flash time / block-sparse time (same run); target at 16K, density <= 1/8: "
        ">= 0.7 / density for fwd+bwd", ""]
    for kind in ("seqlen", "density"):
        sel = [r for r in rows if r["sweep"] == kind]
        if not sel:
            continue
        lines += [f"## Against {'sequence length (butterfly)' if kind == 'seqlen' else 'density (random, balanced rows)'}",
                  "", "| seqlen | hdim | density | provider | fwd ms | fwd+bwd ms | peak extra MB | "
                  "fwd+bwd speedup vs flash | target | ours vs flex (fwd+bwd) | fwd+bwd graphed ms | "
                  "ours vs flex (graphed) | rounds | spread |",
                  "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sel:
            if "error" in r:
                lines.append(f"| {r['seqlen']} | {r['headdim']} | {r['density']:.4f} | {r['provider']} | "
                             f"{r['error']} | {r['error']} | | | | | | | | |")
                continue
            dense = next((x for x in rows if x["provider"] == "flash" and x["seqlen"] == r["seqlen"]
                          and x["headdim"] == r["headdim"] and "error" not in x), None)
            flex = next((x for x in sel if x["provider"] == "flex" and x["seqlen"] == r["seqlen"]
                         and x["headdim"] == r["headdim"] and x["density"] == r["density"] and "error" not in x), None)
            sp = f"{dense['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}x" if dense and r["provider"] == "ours" else ""
            tgt = f"{0.7 / r['density']:.1f}x" if r["provider"] == "ours" and r["density"] <= 0.125 else ""
            vf = f"{flex['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}x" if flex and r["provider"] == "ours" else ""
            gr = f"{r['graphed_ms']:.3f}" if "graphed_ms" in r else ""
            vg = (f"{flex['graphed_ms'] / r['graphed_ms']:.2f}x" if flex and r["provider"] == "ours"
                  and "graphed_ms" in r and "graphed_ms" in flex else "")
            lines.append(f"| {r['seqlen']} | {r['headdim']} | {r['density']:.4f} | {r['provider']} | "
                         f"{r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | {r.get('peak_extra_mb', 0):.0f} | {sp} | "
                         f"{tgt} | {vf} | {gr} | {vg} | {r.get('rounds', 1)} | {r.get('round_spread', 1):.2f} |")
        lines.append("")
    if sweep:
        lines += ["## Tile sweep (16K butterfly; fwd ms for fwd configs, fwd+bwd ms for the others)", "",
                  "| hdim | kernel | (BLOCK_M, BLOCK_N, warps, stages) | ms |", "|---:|---|---|---:|"]
        lines += [f"| {s['headdim']} | {s['kernel']} | {tuple(s['config'])} | {s['ms']:.3f} |" for s in sweep]
        lines.append("")
    return "\n".join(lines)


def targets(rows):
    """The issue's targets, checked on this run's rows."""
    ok = [r for r in rows if "fwdbwd_ms" in r]
    lines = ["targets (fwd+bwd):"]
    for r in ok:
        if r["provider"] != "ours":
            continue
        dense = next((x for x in ok if x["provider"] == "flash" and x["seqlen"] == r["seqlen"]
                      and x["headdim"] == r["headdim"]), None)
        flex = next((x for x in ok if x["provider"] == "flex" and x["seqlen"] == r["seqlen"] and x["sweep"] == r["sweep"]
                     and x["headdim"] == r["headdim"] and x["density"] == r["density"]), None)
        msg = f"  {r['sweep']:8s} n={r['seqlen']:6d} d={r['headdim']:3d} density={r['density']:.4f}"
        if dense:
            sp = dense["fwdbwd_ms"] / r["fwdbwd_ms"]
            need = 0.7 / r["density"]
            mark = ("PASS" if sp >= need else "MISS") if r["seqlen"] == 16384 and r["density"] <= 0.125 else "-"
            msg += f"  vs flash {sp:6.2f}x (0.7/density = {need:5.1f}x: {mark})"
        if flex:
            vf = flex["fwdbwd_ms"] / r["fwdbwd_ms"]
            msg += f"  vs flex {vf:5.2f}x ({'PASS' if vf >= 1 else 'MISS'})"
            if "graphed_ms" in r and "graphed_ms" in flex:
                vg = flex["graphed_ms"] / r["graphed_ms"]
                msg += f"  graphed {vg:5.2f}x ({'PASS' if vg >= 1 else 'MISS'})"
        lines.append(msg)
    return "\n".join(lines)


def plot(rows, path):
    plt = pyplot()
    rows = [r for r in rows if "error" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    colors = {"ours": "C0", "flash": "C1", "flex": "C2", "standard": "C3"}
    for d, ls in ((64, "-"), (128, "--")):
        for p in PROVIDERS:
            sel = [r for r in rows if r["sweep"] == "seqlen" and r["provider"] == p and r["headdim"] == d]
            if sel:
                axes[0].plot([r["seqlen"] for r in sel], [r["fwdbwd_ms"] for r in sel], ls, marker="o",
                             color=colors[p], label=f"{p} d={d}")
    axes[0].set(xscale="log", yscale="log", xlabel="sequence length", ylabel="fwd+bwd ms",
                title="butterfly layout vs sequence length")
    axes[0].legend(fontsize=7)
    for ax, n in zip(axes[1:], (4096, 16384)):
        for d, ls in ((64, "-"), (128, "--")):
            for p in ("ours", "flex", "standard"):
                sel = sorted((r for r in rows if r["sweep"] == "density" and r["provider"] == p
                              and r["headdim"] == d and r["seqlen"] == n), key=lambda r: r["density"])
                if sel:
                    ax.plot([r["density"] for r in sel], [r["fwdbwd_ms"] for r in sel], ls, marker="o",
                            color=colors[p], label=f"{p} d={d}")
            dense = [r for r in rows if r["provider"] == "flash" and r["seqlen"] == n and r["headdim"] == d]
            if dense:
                ax.axhline(dense[0]["fwdbwd_ms"], ls=ls, color=colors["flash"], label=f"dense flash d={d}")
        ax.set(xscale="log", yscale="log", xlabel="density (fraction of blocks kept)", ylabel="fwd+bwd ms",
               title=f"random layouts at {n // 1024}K")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--hdims", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--densities", type=float, nargs="*", default=[1.0, 0.5, 0.25, 0.125, 0.0625])
    ap.add_argument("--density-seqlens", type=int, nargs="*", default=[4096, 16384])
    ap.add_argument("--providers", nargs="*", default=PROVIDERS)
    ap.add_argument("--rep", type=int, default=30, help="do_bench repetition time in ms")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per point (median kept)")
    ap.add_argument("--causal", action="store_true", help="causal attention on top of every layout")
    ap.add_argument("--sweep", action="store_true", help="also time tile candidates for each kernel")
    ap.add_argument("--apply", action="store_true", help="with --sweep: use the fastest tiles for the run")
    ap.add_argument("--out", default="results/blocksparse", help="output folder (relative: from the repo root)")
    ap.add_argument("--tag", default="bench")
    ap.add_argument("--plot-only", default=None, help="re-plot (and re-write markdown) from a JSON")
    args = ap.parse_args()

    if args.plot_only:
        data = json.load(open(args.plot_only))
        base = os.path.splitext(args.plot_only)[0]
        plot(data["rows"], base + ".png")
        print("wrote", base + ".png")
        return
    require_gpu("bench_blocksparse.py", "times CUDA kernels (--plot-only works anywhere)")

    from kernels.sparsity import butterfly

    args.out = str(repo_path(args.out))
    os.makedirs(args.out, exist_ok=True)
    global CAUSAL
    CAUSAL = args.causal
    meta = dict(run_metadata(), tokens=TOKENS, width=WIDTH, block_size=BLOCK, dtype="bfloat16", causal=CAUSAL)
    print(meta, flush=True)
    t0 = time.time()
    sweep = tile_sweep(args.rep, apply=args.apply) if args.sweep else []
    import kernels.blocksparse as B

    meta["tiles"] = {str(d): {k: (c if isinstance(c, str) else list(c)) for k, c in t.items()}
                     for d, t in B.TILES.items()}
    rows = []
    base = os.path.join(args.out, args.tag)
    points = [("seqlen", "butterfly", n, d) for d in args.hdims for n in args.seqlens]
    points += [("density", dens, n, d) for d in args.hdims for n in args.density_seqlens for dens in args.densities]
    for kind, what, n, d in points:
        lay = butterfly(n, n, BLOCK, device="cuda") if kind == "seqlen" else balanced_random(n, what)
        run_point(kind, "butterfly" if kind == "seqlen" else "random", n, d, lay, args.providers, args.rep, rows,
                  args.rounds)
        meta["total_s"] = round(time.time() - t0, 1)
        save(base, rows, meta, sweep)  # after every point, so a cut-off run keeps what it measured
    md = save(base, rows, meta, sweep)
    try:
        if rows:
            plot(rows, base + ".png")
    except ImportError:
        print("matplotlib missing: plot later with --plot-only", flush=True)
    print(md)
    print(targets(rows))


def save(base, rows, meta, sweep):
    with open(base + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, tile_sweep=sweep), f, indent=1)
    if rows:
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
            w.writeheader()
            w.writerows(rows)
    md = markdown(rows, meta, sweep)
    with open(base + ".md", "w") as f:
        f.write(md + "\n")
    return md


if __name__ == "__main__":
    main()
