"""GPT-2 training throughput: our Hydra + Lightning framework vs HuggingFace GPT2LMHeadModel, one GPU.

    python scripts/bench_training.py                                   # every row -> results/training/
    python scripts/bench_training.py --rows ours-sdpa,hf-sdpa --steps 20
    python scripts/bench_training.py --data-source corpus --data-dir data/corpus   # after scripts/prepare_corpus.py

GPT-2 small (124M), context 1024, micro-batch 16, bf16 autocast, AdamW (fused), gradient clipping
1.0, dropout 0.1, random initialisation, the same token windows for every row. Each row runs in its
own process (clean peak-memory numbers, no cross-talk between torch.compile caches), `--warmup`
optimizer steps untimed, then `--steps` timed with a device sync at both ends.

Rows: hf-eager / hf-sdpa (transformers' own training step: attn_implementation "eager" / "sdpa"),
ours-standard / ours-sdpa / ours-sdpa-compile / ours-flash / ours-flash-compile (the real `train/run.py` path: the
composed Hydra config, LMTask and LMDataModule driven by lightning.Trainer, with the checkpoint,
logger and progress-bar extras off so that only the training loop is timed), and ours-{sdpa,flash}-compile-graphs
(compile=true compile_mode=reduce-overhead: the compiled graphs replayed as CUDA graphs, GPT-2's fastest setting,
results/training/graphed_steps/). On request only: ours-{sdpa,flash}-step-graph (cuda_graph=step: the eager step
with its optimizer captured as one graph).
Writes bench_training.json and bench_training.md (GPU, versions, date, command) to --out; relative
paths (--out, --data-dir, --workdir) count from the repo root.
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import (LoopTimer, compose_config, every_row_failed, markdown_header, ours_row_overrides,
                     profile_markdown, rel, rel_arg, repo_path, repo_root, require_some_rows, run_metadata, run_row,
                     step_profiler, step_timer)

repo_root()

OURS = {"ours-standard": ("standard", False), "ours-sdpa": ("sdpa", False),
        "ours-sdpa-compile": ("sdpa", True), "ours-flash": ("flash", False), "ours-flash-compile": ("flash", True)}
# Rows that take the host out of the step: the compiled model replayed as CUDA graphs (torch.compile's
# reduce-overhead; in the default rows), and the eager step with its optimizer captured as one graph (cuda_graph=step;
# on request: slower than compiled, results/training/graphed_steps/).
GRAPHED = {f"ours-{attn}-{suffix}": (attn, compile_, extra) for attn in ("sdpa", "flash")
           for suffix, compile_, extra in (("compile-graphs", True, "compile_mode=reduce-overhead"),
                                           ("step-graph", False, "cuda_graph=step"))}
ROWS = ["hf-eager", "hf-sdpa", *OURS, "ours-sdpa-compile-graphs", "ours-flash-compile-graphs"]


def _windows(data_dir: str, seq_len: int, n: int, seed: int):
    from train.data import TrainWindows, load_tokens

    return TrainWindows(load_tokens(data_dir, "train"), seq_len, seed, n)


def run_hf(args, attn_impl: str) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    model = GPT2LMHeadModel._from_config(GPT2Config(n_positions=args.seq_len), attn_implementation=attn_impl)
    if model.config._attn_implementation != attn_impl:
        raise RuntimeError(f"asked for {attn_impl}, got {model.config._attn_implementation}")
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda or None)
    total = args.warmup + args.steps
    timer = LoopTimer(args.warmup, total, args.profile)
    ds = _windows(args.data_dir, args.seq_len, (total + args.profile) * args.batch, args.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=2, pin_memory=cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loss = None
    for step, batch in enumerate(loader):
        timer.at(step)
        batch = batch.to(dev, non_blocking=True)
        x = batch[:, :-1]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    timer.end()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return {"seconds": timer.seconds, "loss": float(loss), "peak_mem_gib": peak, "profile": timer.summary}


def run_ours(args, attn: str, compile_: bool, *extra: str) -> dict:
    import torch

    from train.run import build

    total = args.warmup + args.steps
    cuda = torch.cuda.is_available()

    overrides = [
        "model=gpt2", *ours_row_overrides(args.workdir, attn, compile_, *extra), f"seed={args.seed}",
        f"model.n_positions={args.seq_len}", f"data.batch_size={args.batch}", f"data.source={args.data_source}",
        f"data.data_dir={args.data_dir}", "data.num_workers=2", f"trainer.max_steps={total + args.profile}",
        "trainer.limit_val_batches=0", "trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
        f"trainer.log_every_n_steps={total}", "logger=none", "~callbacks.checkpoint", "~callbacks.lr_monitor",
        f"callbacks.speed.every={total}",
        "+trainer.enable_checkpointing=false", f"eval_every_steps={total}",
    ]
    cfg = compose_config(overrides)
    datamodule, task, trainer = build(cfg)
    timer = step_timer(args.warmup, total)
    profiler = step_profiler(total, total + args.profile)
    trainer.callbacks += [timer, profiler] if args.profile else [timer]
    trainer.fit(task, datamodule=datamodule)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return {"seconds": timer.t1 - timer.t0, "loss": timer.loss, "peak_mem_gib": peak,
            "overrides": [rel_arg(o) for o in overrides], "profile": profiler.summary}


def one_row(args) -> dict:
    name = args.row
    if name.startswith("hf-"):
        res = run_hf(args, name[3:])
    else:
        res = run_ours(args, *OURS[name]) if name in OURS else run_ours(args, *GRAPHED[name])
    tokens = args.steps * args.batch * args.seq_len
    res.update(row=name, steps=args.steps, warmup=args.warmup, batch=args.batch, seq_len=args.seq_len,
               tokens_per_s=tokens / res["seconds"], step_ms=1000 * res["seconds"] / args.steps)
    from train.callbacks import detect_peak_flops, flops_per_token

    peak = detect_peak_flops()
    n_params = 124_439_808 - args.seq_len * 768  # GPT-2 small without position embeddings
    if peak:
        res["mfu"] = flops_per_token(n_params, 12, 12, 64, args.seq_len) * res["tokens_per_s"] / peak
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: run one row, print JSON
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data-dir", default="data/cache/embedded", help="prepared train.bin/val.bin folder")
    ap.add_argument("--data-source", default="embedded", choices=["embedded", "corpus", "openwebtext"])
    ap.add_argument("--row-timeout", type=int, default=240)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, profile N more (torch.profiler) and add a table of where a "
                         "step's time goes (kernel categories, GPU-busy vs wall, top kernels and host ops)")
    ap.add_argument("--workdir", default="outputs/bench_training", help="scratch output of the ours-* rows")
    ap.add_argument("--out", default="results/training")
    args = ap.parse_args()
    args.data_dir, args.workdir = str(repo_path(args.data_dir)), str(repo_path(args.workdir))

    if args.row:
        print("ROWJSON " + json.dumps(one_row(args)), flush=True)
        return

    unknown = [n for n in args.rows.split(",") if n not in ROWS and n not in GRAPHED]
    if unknown:
        ap.error(f"unknown rows {unknown}: choose from {ROWS + list(GRAPHED)}")
    if args.data_source == "embedded":
        from train.data import prepare_embedded

        prepare_embedded(args.data_dir)
    env = dict(run_metadata(libs=("transformers",)), data=f"{args.data_source} ({rel(args.data_dir)})")
    rows = []
    for name in args.rows.split(","):
        cmd = [sys.executable, __file__, "--row", name, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--seed", str(args.seed),
               "--data-dir", args.data_dir, "--data-source", args.data_source, "--workdir", args.workdir,
               "--profile", str(args.profile)]
        rows.append(run_row(cmd, name, args.row_timeout))
        # Written after every row: a run cut short (a device call's time limit) keeps the rows it finished. Not while
        # every row so far failed, so that a broken run leaves the committed tables as they were.
        if not every_row_failed(rows):
            md = write_tables(args, env, rows)
    require_some_rows(rows)
    print("\n".join(md))


def write_tables(args, env, rows):
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_training.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    ref = {r["row"]: r for r in rows if "tokens_per_s" in r}
    md = markdown_header("GPT-2 small training throughput", env) + [
        f"Data: {env['data']}. GPT-2 small (124M), context {args.seq_len}, micro-batch {args.batch}, bf16 "
        f"autocast, fused AdamW, clip 1.0, dropout 0.1; {args.warmup} warm-up steps, then {args.steps} timed steps.",
        "",
        "| row | tokens/s | step (ms) | vs hf-sdpa | MFU | peak mem (GiB) | loss at end |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    base = ref.get("hf-sdpa", {}).get("tokens_per_s")
    for r in rows:
        if "error" in r:
            md.append(f"| {r['row']} | failed: {r['error'].splitlines()[-1][:120] if r['error'] else '?'} | | | | | |")
            continue
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        md.append(f"| {r['row']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {ratio} | {mfu} | "
                  f"{r['peak_mem_gib']:.1f} | {r['loss']:.3f} |")
    md += profile_markdown(rows)
    (out / "bench_training.md").write_text("\n".join(md) + "\n")
    return md


if __name__ == "__main__":
    main()
