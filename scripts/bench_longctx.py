"""Long context: step time and peak memory of one training step of the Path-X / Path-256 model, per
attention kind, at 16K and 64K tokens.

    python scripts/bench_longctx.py                                  # every row at 16K and 64K -> results/longctx/
    python scripts/bench_longctx.py --seqlens 65536 --rows flash,blocksparse --merge   # add rows to an earlier run
    python scripts/bench_longctx.py --model tiny --seqlens 256 --rows standard,sdpa --out /tmp/lc   # CPU check

The model is the experiments' own (configs/model/lra-pathx.yaml, composed through experiment=lra/pathx at
16,384 tokens and experiment=lra/path256 at 65,536; any other R * R length uses lra/pathx's config at
that length); `--model tiny` shrinks it for a CPU. One step = forward + backward + the experiment's AdamW
step (+ its gradient clipping), bf16 autocast on a GPU (float32 on a CPU), dropout on as in training,
random pixels and labels, `--tokens` tokens per step (batch = tokens / seqlen, at least 1; or `--batch`).

Rows, each in its own process (clean peak memory) and at each length:
  standard        attn=standard: scores, probabilities and the dropout mask in HBM (the paper's baseline)
  standard-ckpt   attn=standard model.activation_checkpointing=true: each block recomputed in the backward
  sdpa            attn=sdpa: torch's scaled_dot_product_attention (it picks its backend)
  flash           attn=flash: our Triton FlashAttention
  blocksparse     attn=blocksparse with the experiment's blocksparse_layout (lra/path256: butterfly + local)
A row that runs out of GPU memory is reported as OOM (the error is caught in the row's process).
Reported: median step time over `--steps` timed steps after `--warmup` (the first calls autotune the
Triton kernels), tokens/s, and the peak memory allocated by torch during the timed steps (weights,
AdamW state and activations; max_memory_allocated). Writes bench_longctx.{json,md,png} (GPU, versions,
date, command) to --out; relative paths count from the repo root.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from _common import (compose_config, markdown_header, pyplot, repo_path, repo_root, require_some_rows, run_metadata,
                     run_row)

repo_root()

ROWS = {  # name -> (attn kind, Hydra overrides)
    "standard": ("standard", []),
    "standard-ckpt": ("standard", ["model.activation_checkpointing=true"]),
    "sdpa": ("sdpa", []),
    "flash": ("flash", []),
    "blocksparse": ("blocksparse", []),
}
EXPERIMENT = {65536: "lra/path256"}  # any other length: lra/pathx at that length
MODELS = {
    "chosen": [],  # the experiments' model as configured
    "tiny": ["model.d_model=16", "model.n_layer=1", "model.n_head=1", "model.d_ff=32"],  # CPU checks of the script
}


def overrides_for(row: str, seqlen: int, model: str) -> list[str]:
    side = math.isqrt(seqlen)
    if side * side != seqlen:
        raise ValueError(f"seqlen {seqlen} is not an R x R image")
    kind, extra = ROWS[row]
    return [f"experiment={EXPERIMENT.get(seqlen, 'lra/pathx')}", f"attn={kind}", f"model.max_positions={seqlen}",
            "init_from=null", *MODELS[model], *extra]


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def one_row(args) -> dict:
    """Build the configured model and optimizer, run warmup + timed steps; OOM becomes {"oom": True}."""
    import torch
    from hydra.utils import instantiate

    from train.optim import no_decay_names, param_groups

    overrides = overrides_for(args.row, args.seqlen, args.model)
    cfg = compose_config([*overrides, "output_dir=outputs/bench_longctx"])
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    batch = args.batch or max(1, args.tokens // args.seqlen)
    out = dict(row=args.row, seqlen=args.seqlen, batch=batch, model=args.model, overrides=overrides,
               steps=args.steps, warmup=args.warmup)
    torch.manual_seed(args.seed)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        model = instantiate(cfg.model, attention_factory=instantiate(cfg.attn)).to(dev).train()
        out.update(params=sum(p.numel() for p in model.parameters()), d_model=cfg.model.d_model,
                   n_layer=cfg.model.n_layer, n_head=cfg.model.n_head)
        if args.row == "blocksparse":
            core = model.transformer.blocks[0].attn.core
            lay = core.layout(args.seqlen, args.seqlen, dev)
            out.update(layout=f"{'+'.join([core.pattern] if isinstance(core.pattern, str) else core.pattern)} "
                              f"block {core.block_size} {core.pattern_kwargs or ''}".strip(), density=lay.density())
        opt = instantiate(cfg.optimizer)(param_groups(model, no_decay_names(model)))
        clip = cfg.trainer.get("gradient_clip_val")
        ids = torch.randint(0, cfg.model.vocab_size, (batch, args.seqlen), device=dev)
        labels = torch.randint(0, cfg.model.num_classes, (batch,), device=dev)
        times = []
        for step in range(args.warmup + args.steps):
            if step == args.warmup and cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        times.sort()
        out.update(step_ms=1000 * times[len(times) // 2], min_step_ms=1000 * times[0], loss=float(loss.detach()),
                   tokens_per_s=batch * args.seqlen / times[len(times) // 2],
                   peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
    except Exception as e:  # noqa: BLE001 - an OOM is a result; anything else is reported as the row's error
        if not is_oom(e):
            raise
        out.update(oom=True, error=str(e).strip().splitlines()[0][:300])
    return out


# ---------------------------------------------------------------------------------------------- report

def cell(r: dict | None) -> tuple[str, str, str]:
    """(step ms, tokens/s, peak GiB) of a row, 'OOM' or 'failed' when it did not run."""
    if r is None:
        return "-", "-", "-"
    if r.get("oom"):
        return "OOM", "-", "-"
    if "step_ms" not in r:
        return "failed", "-", "-"
    mem = f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") is not None else "-"
    return f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:,.0f}", mem


def markdown(rows: list[dict], env: dict) -> str:
    seqlens = sorted({r["seqlen"] for r in rows})
    names = [n for n in ROWS if any(r["row"] == n for r in rows)]
    by = {(r["row"], r["seqlen"]): r for r in rows}
    first = max((r for r in rows if "params" in r), key=lambda r: r["seqlen"], default={})
    batch = {r["seqlen"]: r.get("batch", "?") for r in rows}
    lines = markdown_header("Long context: one training step of the Path-X / Path-256 model per attention kind", env)
    lines += [
        f"Model: {first.get('model', '?')} (configs/model/lra-pathx.yaml{' shrunk' if first.get('model') == 'tiny' else ''}"
        f": n_layer {first.get('n_layer')}, d_model {first.get('d_model')}, n_head {first.get('n_head')}, "
        f"{first.get('params', 0):,} parameters at the longest length). One step: forward + backward + AdamW, "
        f"bf16 autocast on the GPU, dropout on; median of {first.get('steps')} timed steps after "
        f"{first.get('warmup')} warm-up. Peak: torch's max_memory_allocated over the timed steps (weights, "
        "optimizer state, activations). Sequences per step: "
        + ", ".join(f"{batch[n]} x {n:,} tokens" for n in seqlens) + ".",
        "",
        "| attention | " + " | ".join(f"{n:,}: step (ms) | tokens/s | peak (GiB)" for n in seqlens) + " |",
        "|---|" + "---:|---:|---:|" * len(seqlens),
    ]
    for name in names:
        cells = [c for n in seqlens for c in cell(by.get((name, n)))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = []
    for r in rows:
        if r.get("layout"):
            notes.append(f"blocksparse at {r['seqlen']:,}: {r['layout']}, density {r['density']:.4f}")
        if "step_ms" not in r and not r.get("oom"):
            err = (r.get("error") or "?").strip().splitlines() or ["?"]
            notes.append(f"{r['row']} at {r['seqlen']:,} failed: {err[-1][:200]}")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], env: dict, path) -> None:
    plt = pyplot()
    seqlens = sorted({r["seqlen"] for r in rows})
    names = [n for n in ROWS if any(r["row"] == n for r in rows)]
    by = {(r["row"], r["seqlen"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(names))
    for ax, key, label in ((axes[0], "step_ms", "step time (ms)"), (axes[1], "peak_mem_gib", "peak memory (GiB)")):
        for i, name in enumerate(names):
            for j, n in enumerate(seqlens):
                r = by.get((name, n))
                x = j + (i - (len(names) - 1) / 2) * width
                value = r.get(key) if r else None
                if value:
                    ax.bar(x, value, width, color=f"C{i}", label=name if j == 0 else None)
                elif r is not None:  # x in data units, y in axes units: at the bottom whatever the scale
                    ax.text(x, 0.02, "OOM" if r.get("oom") else "failed", ha="center", va="bottom", rotation=90,
                            fontsize=8, color=f"C{i}", transform=ax.get_xaxis_transform())
        ax.set_xticks(range(len(seqlens)), [f"{n:,}" for n in seqlens])
        ax.set_xlabel("tokens per sequence")
        ax.set_ylabel(label)
        ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Path-X / Path-256 model, one training step ({env.get('gpu', '?')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merge_rows(old: dict, new_rows: list[dict], env: dict) -> tuple[list[dict], dict]:
    """The earlier run's rows that this one did not redo, plus this run's; both commands recorded."""
    if old["env"].get("gpu") != env.get("gpu"):
        raise ValueError(f"--merge: the earlier rows ran on {old['env'].get('gpu')}, this run on {env.get('gpu')}")
    redone = {(r["row"], r["seqlen"]) for r in new_rows}
    rows = [r for r in old["rows"] if (r["row"], r["seqlen"]) not in redone] + new_rows
    order = {name: i for i, name in enumerate(ROWS)}
    rows.sort(key=lambda r: (r["seqlen"], order.get(r["row"], len(order))))
    return rows, dict(env, command=f"{old['env']['command']}; {env['command']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {list(ROWS)}")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[16384, 65536], help="R * R tokens each")
    ap.add_argument("--model", default="chosen", choices=sorted(MODELS))
    ap.add_argument("--tokens", type=int, default=65536, help="tokens per step: batch = tokens / seqlen (at least 1)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step at every length (instead of --tokens)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row-timeout", type=int, default=240)
    ap.add_argument("--out", default="results/longctx")
    ap.add_argument("--merge", action="store_true", help="keep the rows of an existing bench_longctx.json in --out "
                                                         "that this run does not redo (rows split over device calls)")
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: one row, printed as JSON
    ap.add_argument("--seqlen", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.row:
        print("ROWJSON " + json.dumps(one_row(args)), flush=True)
        return None

    names = args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    for n in args.seqlens:
        overrides_for(names[0], n, args.model)  # an R x R length, before any row runs
    env = run_metadata(None if argv is None else [__file__, *argv])
    rows = []
    for n in args.seqlens:
        for name in names:
            cmd = [sys.executable, __file__, "--row", name, "--seqlen", str(n), "--model", args.model,
                   "--tokens", str(args.tokens), "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--seed", str(args.seed)] + (["--batch", str(args.batch)] if args.batch else [])
            row = run_row(cmd, f"{name}@{n}", args.row_timeout)
            row.setdefault("seqlen", n)
            row.setdefault("batch", args.batch or max(1, args.tokens // n))
            rows.append(row)
    require_some_rows(rows)
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge and (out / "bench_longctx.json").exists():
        rows, env = merge_rows(json.loads((out / "bench_longctx.json").read_text()), rows, env)
    (out / "bench_longctx.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    md = markdown(rows, env)
    (out / "bench_longctx.md").write_text(md)
    plot(rows, env, out / "bench_longctx.png")
    print(md)
    return {"env": env, "rows": rows}


if __name__ == "__main__":
    main()
