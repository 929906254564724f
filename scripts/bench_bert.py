"""BERT pretraining throughput on real padded batches: HuggingFace BertForPreTraining vs ours, one GPU.

    python scripts/bench_bert.py                                  # every row -> results/bert/bench_bert.{md,json}
    python scripts/bench_bert.py --rows ours-flash,hf-sdpa --steps 20
    python scripts/bench_bert.py --data-dir data/cache/bert/corpus-512   # after prepare_bert.py --source corpus
    python scripts/bench_bert.py --batch 56 --accumulate 8        # the recipe's LAMB step (448 sequences)

The batches: MLPerf-style examples of the committed corpus (train/bert_data.py, prepared on first use;
sequence 512, natural length mix, every batch padded to 512 as MLPerf's records are), the same stream
for every row. Model: BERT-large (--model), random initialisation, dropout 0.1, bf16 autocast, LAMB
(pytorch_optimizer, MLPerf's numbers), gradient clipping 1.0, loss = masked LM + next sentence. A timed
step is one LAMB step over --accumulate micro-batches (1: a LAMB step per micro-batch; the recipe,
experiment=bert/large-mlperf, accumulates 8 micro-batches of 56).

Rows (each in its own process: clean peak memory, no shared compile caches), with and without torch.compile:
  hf-eager, hf-sdpa[-compile]   transformers.BertForPreTraining (attn_implementation eager / sdpa): padded
                                batches, attention mask, prediction logits at every position, labels -100
                                except at the masked positions (HF's own pretraining loss)
  ours-standard/sdpa/flash[-compile]   the real train/run.py path (experiment=bert/large-mlperf, MLMTask,
                                BertDataModule, lightning.Trainer; checkpoints, loggers, progress bar off):
                                padding removed once per forward, MLM logits only at the masked positions
tokens/s counts real tokens only (attention_mask), the same count for every row; the padding fraction
of the timed batches is stated. MFU uses the same model FLOPs for every row (6N per real token + the
attention term of the real lengths). Writes bench_bert.json and bench_bert.md (GPU, versions, date,
command) to --out; relative paths count from the repo root.
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import (LoopTimer, compose_config, markdown_header, ours_row_overrides, profile_markdown, pyplot, rel,
                     rel_arg, repo_path, repo_root, require_some_rows, run_metadata, run_row, step_profiler,
                     step_timer)

repo_root()

HF_ROWS = ["hf-eager", "hf-sdpa", "hf-eager-compile", "hf-sdpa-compile"]
OURS = {"ours-standard": ("standard", False), "ours-sdpa": ("sdpa", False), "ours-flash": ("flash", False),
        "ours-standard-compile": ("standard", True), "ours-sdpa-compile": ("sdpa", True),
        "ours-flash-compile": ("flash", True),
        "ours-flash-compile-model": ("flash", "model")}  # compile=model: the whole encoder as one graph
ROWS = HF_ROWS + list(OURS)
DEFAULT_ROWS = [r for r in ROWS if not r.endswith("-model")]  # the compile-scope A/B row on request
MODELS = {  # name -> encoder sizes (models/bert.py keyword names)
    "large": dict(d_model=1024, n_layer=24, n_head=16, d_ff=4096),
    "base": dict(d_model=768, n_layer=12, n_head=12, d_ff=3072),
    "tiny": dict(d_model=64, n_layer=2, n_head=4, d_ff=256),  # CPU checks of the script itself
}


DATA_CONFIG = {"embedded": "bert", "corpus": "bert-corpus", "wikipedia": "wikipedia"}


def data_overrides(args) -> list[str]:
    """The data config of every row, HF's included: one config means one prepared folder and one stream
    (two configs with other preparation settings would rebuild the same folder under each other)."""
    return [f"data={DATA_CONFIG[args.data_source]}", f"data.data_dir={args.data_dir}",
            f"data.batch_size={args.batch}", f"seed={args.seed}", f"model.max_positions={args.seq_len}"]


def datamodule(args, num_samples: int):
    from hydra.utils import instantiate

    cfg = compose_config(["experiment=bert/large-mlperf", *data_overrides(args)])
    dm = instantiate(cfg.data, num_samples=num_samples)
    dm.prepare_data()
    dm.setup()
    return dm


def timed_lengths(args):
    """Real lengths of the timed steps' sequences (samples warmup*S .. (warmup+steps)*S of the stream, S the
    sequences per LAMB step)."""
    import numpy as np

    from train.bert_data import Shuffled

    per_step = args.batch * args.accumulate
    dm = datamodule(args, (args.warmup + args.steps) * per_step)
    stream = Shuffled(dm.train_set, args.seed, (args.warmup + args.steps) * per_step)
    idx = range(args.warmup * per_step, (args.warmup + args.steps) * per_step)
    return np.array([len(stream[i]["input_ids"]) for i in idx])


def folder_meta(data_dir) -> dict:
    """A prepared folder's meta.json (train/bert_data.py), read now; {} before it is prepared."""
    meta = repo_path(data_dir) / "meta.json"
    return json.loads(meta.read_text()) if meta.exists() else {}


def data_source_of(data_dir: str | None, given: str | None) -> str:
    """The data config's source: the one given, else the one the prepared folder records (a config of another
    source would not read that folder: train/bert_data.py refuses to rebuild it from its own text)."""
    if given is not None:
        return given
    return (folder_meta(data_dir) if data_dir else {}).get("source", "embedded")


def data_stamp(args) -> str:
    """The prepared folder's stamp (its inputs and settings): rows compare only on one stamp."""
    return folder_meta(args.data_dir).get("stamp", "?")


def check_same_data(rows: list[dict], env: dict):
    """Every timed row must have read the same prepared examples; a mix does not compare."""
    for r in rows:
        if "seconds" in r and r.get("data_stamp") != env["data_stamp"]:
            raise RuntimeError(f"row {r['row']} read data stamp {r.get('data_stamp')}, the run {env['data_stamp']}: "
                               f"the prepared folder {env['data']} changed during the run")


def bert_sizes(args) -> dict:
    return dict(vocab_size=30522, max_positions=args.seq_len, **MODELS[args.model])


def run_hf(args, attn_impl: str, compile_: bool) -> dict:
    import torch
    import transformers
    from pytorch_optimizer import Lamb

    from models.bert import BertConfig
    from train.optim import no_decay_names, param_groups

    torch.manual_seed(args.seed)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    s = bert_sizes(args)
    ours_cfg = BertConfig(vocab_size=s["vocab_size"], hidden_size=s["d_model"], num_hidden_layers=s["n_layer"],
                          num_attention_heads=s["n_head"], intermediate_size=s["d_ff"],
                          max_position_embeddings=s["max_positions"])
    cfg = transformers.BertConfig(**{k: v for k, v in ours_cfg.to_hf_dict().items() if k != "architectures"})
    model = transformers.BertForPreTraining._from_config(cfg, attn_implementation=attn_impl)
    if model.config._attn_implementation != attn_impl:
        raise RuntimeError(f"asked for {attn_impl}, got {model.config._attn_implementation}")
    model = model.to(dev).train()
    opt = Lamb(param_groups(model, no_decay_names(model)), lr=3.5e-4, betas=(0.9, 0.999), weight_decay=0.01, eps=1e-6)
    fwd = torch.compile(model) if compile_ else model
    total = args.warmup + args.steps
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loss = None
    timer = LoopTimer(args.warmup, total, args.profile)
    accum = args.accumulate
    for micro, batch in enumerate(datamodule(args, (total + args.profile) * args.batch * accum).train_dataloader()):
        if micro % accum == 0:
            timer.at(micro // accum)
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        labels = torch.full_like(batch["input_ids"], -100)
        valid = batch["mlm_labels"] != -100
        labels.scatter_(1, batch["mlm_positions"].masked_fill(~valid, 0), batch["mlm_labels"].masked_fill(~valid, -100))
        labels[:, 0] = -100  # slot 0 of an empty prediction row pointed at [CLS]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            out = fwd(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(),
                      token_type_ids=batch["token_type_ids"], labels=labels,
                      next_sentence_label=batch["nsp_labels"])
        (out.loss / accum).backward()  # Lightning's accumulation scales the same way
        if (micro + 1) % accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        loss = out.loss
    timer.end()
    return {"seconds": timer.seconds, "loss": float(loss.detach()), "profile": timer.summary,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0}


def run_ours(args, attn: str, compile_: bool, *extra: str) -> dict:
    import torch

    from train.run import build

    total = args.warmup + args.steps
    cuda = torch.cuda.is_available()

    sizes = [f"model.{k}={v}" for k, v in bert_sizes(args).items() if k != "max_positions"]
    overrides = [
        "experiment=bert/large-mlperf", *ours_row_overrides(args.workdir, attn, compile_, *extra), *data_overrides(args),
        *sizes, f"global_batch_size={args.batch * args.accumulate}",
        f"trainer.max_steps={total + args.profile}", "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
        f"trainer.log_every_n_steps={total}", "logger=none", "~callbacks.checkpoint", "~callbacks.lr_monitor",
        f"callbacks.speed.every={total}",
        "+trainer.enable_checkpointing=false", f"eval_every_steps={total}", "scheduler.warmup_steps=0",
    ]
    if not cuda:
        overrides.append("trainer.accelerator=cpu")
    cfg = compose_config(overrides)
    datamodule_, task, trainer = build(cfg)
    timer = step_timer(args.warmup, total, per_step=args.accumulate > 1)
    profiler = step_profiler(total, total + args.profile)
    trainer.callbacks += [timer, profiler] if args.profile else [timer]
    trainer.fit(task, datamodule=datamodule_)
    return {"seconds": timer.t1 - timer.t0, "loss": timer.loss, "profile": profiler.summary,
            "step_ms_each": [round(t, 1) for t in timer.step_ms or []],
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
            "overrides": [rel_arg(o) for o in overrides]}


def one_row(args) -> dict:
    name = args.row
    if name.startswith("hf-"):
        res = run_hf(args, name.split("-")[1], name.endswith("-compile"))
    else:
        res = run_ours(args, *OURS[name])
    lengths = timed_lengths(args)
    res.update(row=name, data_stamp=data_stamp(args), steps=args.steps, warmup=args.warmup, batch=args.batch,
               accumulate=args.accumulate, seq_len=args.seq_len,
               model=args.model, real_tokens=int(lengths.sum()), sum_sq_len=int((lengths ** 2).sum()))
    return res


def derive(rows: list[dict], peak_flops: float | None = None, flops_of=None) -> list[dict]:
    """tokens/s (real tokens), step time, ratio to hf-sdpa, MFU (when the peak and a FLOP count are known)."""
    base = next((r["real_tokens"] / r["seconds"] for r in rows if r["row"] == "hf-sdpa" and "seconds" in r), None)
    for r in rows:
        if "seconds" not in r:
            continue
        r["tokens_per_s"] = r["real_tokens"] / r["seconds"]
        r["step_ms"] = 1000 * r["seconds"] / r["steps"]
        r["vs_hf_sdpa"] = r["tokens_per_s"] / base if base else None
        if peak_flops and flops_of:
            r["mfu"] = flops_of(r) / r["seconds"] / peak_flops
    return rows


def merge_rows(old: dict, new_rows: list[dict], env: dict) -> tuple[list[dict], dict]:
    """Rows of an earlier run that this one did not redo, plus this run's, in ROWS order; the commands of
    both runs are recorded. Runs with other data or sizes are refused (their numbers do not compare)."""
    keys = ("data", "data_stamp", "padding_fraction", "accumulate")
    if any(old["env"].get(k) != env.get(k) for k in keys):
        raise ValueError(f"--merge: {args_of(old['env'])} differs from this run's {args_of(env)}")
    redone = {r["row"] for r in new_rows}
    rows = [r for r in old["rows"] if r["row"] not in redone] + new_rows
    order = {name: i for i, name in enumerate(ROWS)}
    rows.sort(key=lambda r: order.get(r["row"], len(order)))
    env = dict(env, command=f"{old['env']['command']}; {env['command']}")
    return rows, env


def args_of(env: dict) -> str:
    return f"data {env.get('data')}, padding fraction {env.get('padding_fraction')}"


def failure(row: dict) -> str:
    """The last line of a failed row's error (the exception), for the table and the plot."""
    return ((row.get("error") or "?").strip().splitlines() or ["?"])[-1]


def markdown(rows: list[dict], env: dict) -> str:
    first = next((r for r in rows if "real_tokens" in r), {})
    lines = markdown_header(f"BERT-{first.get('model', '?')} pretraining throughput, real padded batches", env) + [
        f"Data: {env['data']}. Micro-batch {first.get('batch')}, {first.get('accumulate', 1)} per LAMB step "
        f"(a step below), every batch padded to {first.get('seq_len')} tokens; "
        f"padding fraction of the timed batches {env['padding_fraction']:.3f} (mean real length "
        f"{env['mean_length']:.0f}). bf16 autocast, LAMB, clip 1.0, dropout 0.1; {first.get('warmup')} warm-up "
        f"steps, then {first.get('steps')} timed. tokens/s counts real tokens only.",
        "",
        "| row | tokens/s (real) | step (ms) | vs hf-sdpa | MFU | peak mem (GiB) | loss at end |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['row']} | failed: {failure(r)[:120]} | | | | | |")
            continue
        ratio = f"{r['vs_hf_sdpa']:.2f}x" if r.get("vs_hf_sdpa") else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        lines.append(f"| {r['row']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {ratio} | {mfu} | "
                     f"{r['peak_mem_gib']:.1f} | {r['loss']:.3f} |")
    flash = next((r for r in rows if r["row"] == "ours-flash" and r.get("vs_hf_sdpa")), None)
    if flash:
        lines += ["", f"Target (issue 10): ours-flash >= 2x hf-sdpa in real tokens/s: {flash['vs_hf_sdpa']:.2f}x, "
                      f"{'PASS' if flash['vs_hf_sdpa'] >= 2 else 'MISS'}."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], env: dict, path) -> None:
    """Real tokens/s per row as bars, the ratio to hf-sdpa on each; rows that failed are named with their error."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.6))
    names = [r["row"] for r in rows][::-1]
    for i, r in enumerate(rows[::-1]):
        if "tokens_per_s" not in r:
            ax.text(0, i, f"  failed: {failure(r).split(':')[0][:40]}", va="center", fontsize=8, color="gray")
            continue
        color = "tab:blue" if r["row"].startswith("ours") else "tab:gray"
        ax.barh(i, r["tokens_per_s"] / 1e3, color=color)
        ratio = f"  {r['vs_hf_sdpa']:.2f}x" if r.get("vs_hf_sdpa") else ""
        ax.text(r["tokens_per_s"] / 1e3, i, ratio, va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.margins(x=0.1)
    first = next((r for r in rows if "batch" in r), {})
    ax.set(xlabel="real tokens/s (thousands)", title=f"BERT-{first.get('model', '?')} training, micro-batch "
           f"{first.get('batch')} x {first.get('accumulate', 1)}, {100 * env['padding_fraction']:.0f}% padding "
           f"({env.get('gpu', '?')})")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: run one row, print JSON
    ap.add_argument("--model", default="large", choices=sorted(MODELS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="sequences per micro-batch")
    ap.add_argument("--accumulate", type=int, default=1,
                    help="micro-batches per LAMB step (gradient accumulation; the recipe: 8 of 56)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data-dir", default=None, help="prepared BERT examples (default data/cache/bert/embedded-<seq-len>)")
    ap.add_argument("--data-source", default=None, choices=["embedded", "corpus", "wikipedia"],
                    help="default: the source recorded in --data-dir's meta.json, else embedded")
    ap.add_argument("--row-timeout", type=int, default=300)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, profile N more (torch.profiler) and add a table of where a "
                         "step's time goes (kernel categories, GPU-busy vs wall, top kernels and host ops)")
    ap.add_argument("--workdir", default="outputs/bench_bert", help="scratch output of the ours-* rows")
    ap.add_argument("--out", default="results/bert")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an existing bench_bert.json in --out that this run does not redo "
                         "(split the rows over several device calls)")
    args = ap.parse_args()
    if args.accumulate < 1 or args.batch < 1:
        ap.error(f"--batch {args.batch} and --accumulate {args.accumulate} must be at least 1")
    args.data_source = data_source_of(args.data_dir, args.data_source)
    args.data_dir = str(repo_path(args.data_dir or f"data/cache/bert/{args.data_source}-{args.seq_len}"))
    args.workdir = str(repo_path(args.workdir))

    if args.row:
        print("ROWJSON " + json.dumps(one_row(args)), flush=True)
        return

    lengths = timed_lengths(args)  # prepares the data first where the source prepares on first use
    env = dict(run_metadata(libs=("transformers",)), data=f"{args.data_source} ({rel(args.data_dir)})",
               data_stamp=data_stamp(args), accumulate=args.accumulate,
               padding_fraction=float(1 - lengths.mean() / args.seq_len), mean_length=float(lengths.mean()))
    rows = []
    for name in args.rows.split(","):
        cmd = [sys.executable, __file__, "--row", name, "--model", args.model, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch), "--accumulate", str(args.accumulate),
               "--seq-len", str(args.seq_len),
               "--seed", str(args.seed), "--data-dir", args.data_dir, "--data-source", args.data_source,
               "--workdir", args.workdir, "--profile", str(args.profile)]
        rows.append(run_row(cmd, name, args.row_timeout))

    from models.bert import BertForPreTraining
    from train.callbacks import detect_peak_flops

    require_some_rows(rows)
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge and (out / "bench_bert.json").exists():
        rows, env = merge_rows(json.loads((out / "bench_bert.json").read_text()), rows, env)
    check_same_data(rows, env)
    ref = BertForPreTraining(**bert_sizes(args))
    derive(rows, detect_peak_flops(), lambda r: ref.flops(r["real_tokens"], r["sum_sq_len"]))
    (out / "bench_bert.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    md = markdown(rows, env) + "\n".join(profile_markdown(rows) + [""])
    (out / "bench_bert.md").write_text(md)
    plot(rows, env, out / "bench_bert.png")
    print(md)


if __name__ == "__main__":
    main()
