"""Attention on a padded batch: what removing the padding saves, dense and block-sparse.

    python scripts/bench_padded.py                                   # -> results/blocksparse/padded.{json,md,png}
    python scripts/bench_padded.py --seqlens 1024 4096 --hdims 64 --rep 20

A batch of `--tokens` padded tokens (batch = tokens / seqlen, at least 2) whose sequence lengths are drawn
uniformly from [seqlen / 2, seqlen] (seeded), bf16, heads x head dim = 2048, non-causal, forward and
forward+backward times (triton.testing.do_bench medians; providers interleaved over `--rounds` rounds,
the median kept). Providers:
- flash_padded: our dense kernel on the padded (batch, seqlen) tensors, padding computed like real tokens
  (what a model without unpadding pays);
- flash_varlen: our dense kernel on the packed real tokens (kernels.flash.flash_attn_varlen_func);
- blocksparse_padded: the block-sparse kernel on the padded tensors, layout of the padded length;
- blocksparse_varlen: the block-sparse varlen kernel on the packed real tokens, the same layout applied
  to each sequence from its own start (what `attn=blocksparse` runs on padded batches).
Before timing, blocksparse_varlen's output is checked against the block-sparse kernel run on each of the
first sequences alone (the padded call differs at real tokens: it attends to the padding keys).
"""
from __future__ import annotations

import argparse
import json
import statistics

from _common import markdown_header, pyplot, rel, repo_path, repo_root, require_gpu, run_metadata

repo_root()

PROVIDERS = ["flash_padded", "flash_varlen", "blocksparse_padded", "blocksparse_varlen"]


def make_point(n: int, d: int, tokens: int, pattern: str, block_size: int, seed: int):
    """Inputs and one fwd+bwd closure per provider for seqlen n, head dim d."""
    import torch

    from kernels.blocksparse import blocksparse_attn_func, blocksparse_attn_varlen_func
    from kernels.flash import flash_attn_func, flash_attn_varlen_func
    from kernels.padding import PackedBatch, unpad
    from kernels.sparsity import make_layout

    batch, heads = max(2, tokens // n), 2048 // d
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(n // 2, n + 1, (batch,), generator=g).cuda()
    mask = torch.arange(n, device="cuda")[None] < lengths[:, None]
    packed = PackedBatch.from_mask(mask)
    layout = make_layout(pattern, n, n, block_size, device="cuda")
    padded = [torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(3)]
    packed_qkv = [unpad(t.detach(), packed).requires_grad_() for t in padded]
    cu, mx = packed.cu_seqlens, packed.max_seqlen
    fns = {
        "flash_padded": (lambda q, k, v: flash_attn_func(q, k, v), padded),
        "flash_varlen": (lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, check_seqlens=False),
                         packed_qkv),
        "blocksparse_padded": (lambda q, k, v: blocksparse_attn_func(q, k, v, layout), padded),
        "blocksparse_varlen": (lambda q, k, v: blocksparse_attn_varlen_func(q, k, v, layout, cu, cu, mx, mx,
                                                                            check_seqlens=False), packed_qkv),
    }
    with torch.no_grad():  # the varlen kernel equals the block-sparse kernel on each sequence alone
        from kernels.sparsity import BlockSparseLayout, cdiv

        out = fns["blocksparse_varlen"][0](*packed_qkv).float()
        err = 0.0
        for b in range(min(batch, 3)):
            length, start = int(lengths[b]), int(cu[b])
            nb = cdiv(length, block_size)
            own = BlockSparseLayout(layout.blocks[:, :nb, :nb], block_size, length, length)
            alone = blocksparse_attn_func(*(t[b:b + 1, :length] for t in padded), own)[0].float()
            err = max(err, (out[start:start + length] - alone).abs().max().item())
        if err > 2e-2:
            raise AssertionError(f"blocksparse varlen differs from the kernel on each sequence alone by {err} "
                                 f"(n={n}, d={d})")
    info = {"seqlen": n, "hdim": d, "batch": batch, "heads": heads, "pattern": pattern, "block_size": block_size,
            "density": layout.density(), "real_fraction": packed.total / (batch * n), "check_max_abs_err": err}
    return fns, info


def time_point(fns, rep: int, rounds: int) -> dict:
    import torch
    import triton

    times = {p: {"fwd": [], "fwdbwd": []} for p in fns}
    for _ in range(rounds):
        for name, (fn, qkv) in fns.items():
            do = torch.randn_like(qkv[0])

            def step():
                fn(*qkv).backward(do)

            times[name]["fwd"].append(triton.testing.do_bench(lambda: fn(*qkv), warmup=10, rep=rep,
                                                              return_mode="median"))
            times[name]["fwdbwd"].append(triton.testing.do_bench(step, warmup=10, rep=rep, grad_to_none=qkv,
                                                                 return_mode="median"))
    return {p: {"fwd_ms": statistics.median(t["fwd"]), "fwdbwd_ms": statistics.median(t["fwdbwd"]),
                "fwdbwd_spread": [min(t["fwdbwd"]), max(t["fwdbwd"])]} for p, t in times.items()}


def markdown(rows, meta) -> str:
    lines = markdown_header("Attention on a padded batch: padded vs packed, dense vs block-sparse", meta)
    lines += ["Lengths uniform in [seqlen/2, seqlen]; bf16, non-causal, heads x head dim = 2048; forward+backward ms "
              "(median of the rounds). `bs` = block-sparse; speedups divide the padded dense flash time.", "",
              "| seqlen | hdim | batch | real tokens | layout density | flash padded | flash varlen | bs padded | "
              "bs varlen | bs varlen vs flash padded | bs varlen vs bs padded |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = {p: r[p]["fwdbwd_ms"] for p in PROVIDERS}
        lines.append(f"| {r['seqlen']} | {r['hdim']} | {r['batch']} | {r['real_fraction']:.0%} | {r['density']:.3f} | "
                     f"{t['flash_padded']:.3f} | {t['flash_varlen']:.3f} | {t['blocksparse_padded']:.3f} | "
                     f"{t['blocksparse_varlen']:.3f} | {t['flash_padded'] / t['blocksparse_varlen']:.2f}x | "
                     f"{t['blocksparse_padded'] / t['blocksparse_varlen']:.2f}x |")
    lines += ["", "Forward only (ms):", "", "| seqlen | hdim | " + " | ".join(PROVIDERS) + " |",
              "|---:|---:|" + "---:|" * len(PROVIDERS)]
    for r in rows:
        lines.append(f"| {r['seqlen']} | {r['hdim']} | " + " | ".join(f"{r[p]['fwd_ms']:.3f}" for p in PROVIDERS) + " |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    plt = pyplot()
    hdims = sorted({r["hdim"] for r in rows})
    fig, axes = plt.subplots(1, len(hdims), figsize=(6 * len(hdims), 4), squeeze=False)
    for ax, d in zip(axes[0], hdims):
        sub = [r for r in rows if r["hdim"] == d]
        for p in PROVIDERS:
            ax.plot([r["seqlen"] for r in sub], [r[p]["fwdbwd_ms"] for r in sub], marker="o", label=p)
        ax.set(xscale="log", yscale="log", xlabel="padded sequence length", ylabel="fwd+bwd ms",
               title=f"head dim {d}, lengths in [N/2, N]")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tokens", type=int, default=32768, help="padded tokens per batch")
    ap.add_argument("--pattern", default="butterfly")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--rep", type=int, default=30, help="do_bench repetition time in ms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/blocksparse", help="output folder (relative to the repo root)")
    ap.add_argument("--tag", default="padded")
    args = ap.parse_args()
    require_gpu("bench_padded.py")
    meta = run_metadata()
    rows = []
    for d in args.hdims:
        for n in args.seqlens:
            fns, info = make_point(n, d, args.tokens, args.pattern, args.block_size, args.seed)
            row = {**info, **time_point(fns, args.rep, args.rounds)}
            rows.append(row)
            print(f"n={n} d={d}: " + ", ".join(f"{p} {row[p]['fwdbwd_ms']:.3f}" for p in PROVIDERS), flush=True)
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / f"{args.tag}.md").write_text(markdown(rows, meta))
    plot(rows, out / f"{args.tag}.png")
    print(f"wrote {rel(out / args.tag)}.{{json,md,png}}")


if __name__ == "__main__":
    main()
