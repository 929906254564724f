"""The FlashAttention paper's Table 1 at lab scale: BERT pretrained with the same seed and data order once
per attention kind; masked-LM accuracy curves and wall-clock time to fixed accuracies.

    python scripts/bert_quality.py                                   # experiment=bert/medium-quality, standard + flash
    python scripts/bert_quality.py --budget 560 trainer.max_steps=600 scheduler.warmup_steps=60 eval_every_steps=100
    python scripts/bert_quality.py --collect                         # the table from the run folders only
    python scripts/bert_quality.py --combine results/bert/quality.json results/bert/quality_seed2/quality.json

Each kind is one `python train/run.py experiment=EXPERIMENT attn=KIND seed=SEED ...` process (extra
arguments are Hydra overrides given to every run) under RUNS/KIND-seedSEED. Resumable: a finished run
(its `done:` line) is skipped; one cut off by --budget continues from checkpoints/last.ckpt, its earlier
metrics.csv kept beside as metrics.partN.csv. Time is training wall-clock: the sum of SpeedMonitor's
windows (training steps and the evaluations between them; process start, checkpoint loading and the
first window's compilation included only as they fall inside a window), summed over every part of a run.
Writes quality.md, quality.json and quality.png to --out (GPU, versions, date, command).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from _common import markdown_header, metrics_files, pyplot, rel, repo_path, repo_root, run_metadata
from reproduce_lra import Runner, read_metrics, resume_checkpoint, show

REPO = repo_root()
LEVELS = (0.10, 0.11, 0.12, 0.13, 0.14, 0.15, 0.16, 0.18, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.72)


def run_dir(runs: Path, kind: str, seed: int) -> Path:
    return runs / f"{kind}-seed{seed}"


def command(experiment: str, kind: str, seed: int, folder: Path, overrides, ckpt: Path | None) -> list[str]:
    cmd = ["python", "train/run.py", f"experiment={experiment}", f"attn={kind}", f"seed={seed}",
           f"hydra.run.dir={rel(folder)}", "logger=csv", "trainer.enable_progress_bar=false", *overrides]
    return cmd + ([f"ckpt_path={rel(ckpt)}"] if ckpt else [])


def finished(folder: Path) -> bool:
    log = folder / "stdout.log"
    return log.exists() and any(ln.startswith("done: ") for ln in log.read_text(errors="replace").splitlines())


def read_parts(folder: Path) -> list[dict]:
    """Every part's metrics rows in order (metrics.part1.csv, ..., metrics.csv), each tagged with its part."""
    rows = []
    for i, path in enumerate(metrics_files(folder)):
        rows += [dict(r, part=i) for r in read_metrics(path)]
    return rows


def curve(rows: list[dict]) -> dict:
    """Evaluations as (step, seconds of training so far, val/mlm_acc, val/mlm_loss), and the steady speed."""
    elapsed, last_step, clock = 0.0, {}, []  # clock: (step, cumulative seconds) at each SpeedMonitor window
    for r in rows:
        if "perf/step_time_ms" in r:
            prev = last_step.get(r["part"], None)
            if prev is None:  # a part's first window runs from the resumed step (the previous part's last)
                prev = max((s for s, _ in clock), default=0.0)
            elapsed += r["perf/step_time_ms"] * (r["step"] - prev) / 1000
            last_step[r["part"]] = r["step"]
            clock.append((r["step"], elapsed))
    evals = []
    for r in rows:
        if "val/mlm_acc" in r:
            before = [t for s, t in clock if s <= r["step"]]
            evals.append({"step": int(r["step"]), "seconds": before[-1] if before else 0.0,
                          "mlm_acc": r["val/mlm_acc"], "mlm_loss": r.get("val/mlm_loss"),
                          "nsp_acc": r.get("val/nsp_acc")})
    tps = [r["perf/tokens_per_s"] for r in rows if "perf/tokens_per_s" in r][1:]
    return {"evals": evals, "seconds": elapsed, "steps": int(max((s for s, _ in clock), default=0)),
            "tokens_per_s": sum(tps) / len(tps) if tps else None}


def time_to(evals: list[dict], level: float, key: str = "mlm_acc") -> float | None:
    """Training seconds at the first evaluation reaching `level`: accuracy at or above it, loss at or below."""
    reached = (lambda v: v >= level) if key == "mlm_acc" else (lambda v: v <= level)  # noqa: E731
    return next((e["seconds"] for e in evals if e.get(key) is not None and reached(e[key])), None)


def summarize(curves: dict) -> dict:
    """Time to each accuracy level per kind and the speedup of every kind over standard."""
    levels = [lv for lv in LEVELS if all(time_to(c["evals"], lv) is not None for c in curves.values())]
    table = []
    for lv in levels:
        row = {"level": lv, **{k: time_to(c["evals"], lv) for k, c in curves.items()}}
        if "standard" in curves:
            row["speedup"] = {k: row["standard"] / row[k] for k in curves if k != "standard" and row[k]}
        table.append(row)
    gaps, loss_gaps, throughput = [], [], None  # differences at the evaluations both runs made
    if {"standard", "flash"} <= curves.keys():
        flash = {e["step"]: e for e in curves["flash"]["evals"]}
        both = [(e, flash[e["step"]]) for e in curves["standard"]["evals"] if e["step"] in flash]
        gaps = [abs(s["mlm_acc"] - f["mlm_acc"]) for s, f in both]
        loss_gaps = [abs(s["mlm_loss"] - f["mlm_loss"]) for s, f in both
                     if s.get("mlm_loss") is not None and f.get("mlm_loss") is not None]
        tps = curves["standard"]["tokens_per_s"], curves["flash"]["tokens_per_s"]
        throughput = tps[1] / tps[0] if all(tps) else None
    return {"levels": table, "max_acc_gap": max(gaps) if gaps else None, "evals_compared": len(gaps),
            "max_loss_gap": max(loss_gaps) if loss_gaps else None, "throughput_flash_over_standard": throughput}


def combine(paths: list[Path], acc_target: float, loss_target: float) -> str:
    """One row per seed (a quality.json each) and the mean: final quality, throughput and time to both targets.

    Accuracy moves in steps of a few evaluations on the plateau these short runs end on, so time to an accuracy
    level swings with where one evaluation lands; the masked-LM loss falls smoothly and is reported beside it."""
    fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    ratio = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    rows, ratios, sources = [], {"throughput": [], "time": [], "acc": [], "loss": []}, []
    for path in paths:
        d = json.loads(path.read_text())
        sources.append(f"- `{rel(path)}`: " + markdown_header("", d["env"])[2] + f" Command: `{d['env']['command']}`")
        fl, st = d["curves"]["flash"], d["curves"]["standard"]
        seed = re.search(r"--seed (\d+)", d["env"]["command"])
        acc = time_to(st["evals"], acc_target), time_to(fl["evals"], acc_target)
        loss = time_to(st["evals"], loss_target, "mlm_loss"), time_to(fl["evals"], loss_target, "mlm_loss")
        r = {"throughput": d["throughput_flash_over_standard"], "time": st["seconds"] / fl["seconds"],
             "acc": acc[0] / acc[1] if all(acc) else None, "loss": loss[0] / loss[1] if all(loss) else None}
        for k, v in r.items():
            if v is not None:
                ratios[k].append(v)
        times = (f"{fmt(fl['seconds'])} / {fmt(st['seconds'])} ({ratio(r['time'])})",
                 f"{fmt(acc[1])} / {fmt(acc[0])} ({ratio(r['acc'])})", f"{fmt(loss[1])} / {fmt(loss[0])} ({ratio(r['loss'])})")
        rows.append(f"| {seed.group(1) if seed else 1} | {fl['evals'][-1]['mlm_acc']:.4f} / {st['evals'][-1]['mlm_acc']:.4f} "
                    f"| {fl['evals'][-1]['mlm_loss']:.3f} / {st['evals'][-1]['mlm_loss']:.3f} | {ratio(r['throughput'])} | "
                    + " | ".join(times) + " |")
    mean = {k: sum(v) / len(v) if v else None for k, v in ratios.items()}
    return "\n".join([
        f"Flash / standard per seed ({len(paths)} seeds), each from one run pair on {d['env'].get('gpu', '?')}:", "",
        *sources, "",
        f"| seed | final val/mlm_acc | final val/mlm_loss | throughput | training time (s) | time to acc >= {acc_target} (s) "
        f"| time to loss <= {loss_target} (s) |", "|---:|---:|---:|---:|---:|---:|---:|", *rows,
        f"| mean | | | {ratio(mean['throughput'])} | {ratio(mean['time'])} | {ratio(mean['acc'])} | {ratio(mean['loss'])} |", ""])


def markdown(curves: dict, summary: dict, meta: dict, unfinished: list[str]) -> str:
    lines = markdown_header("BERT masked-LM accuracy and time to accuracy per attention kind (Table 1 at lab scale)",
                            meta)
    lines += ["| attention | steps | final val/mlm_acc | final val/mlm_loss | final val/nsp_acc | tokens/s (real) "
              "| training time (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for kind, c in curves.items():
        e = c["evals"][-1] if c["evals"] else {}
        f = lambda x, fmt: "-" if x is None else fmt.format(x)  # noqa: E731
        lines.append(f"| {kind} | {c['steps']} | {f(e.get('mlm_acc'), '{:.4f}')} | {f(e.get('mlm_loss'), '{:.3f}')} | "
                     f"{f(e.get('nsp_acc'), '{:.3f}')} | {f(c['tokens_per_s'], '{:,.0f}')} | {c['seconds']:.0f} |")
    if summary["max_acc_gap"] is not None:
        loss = summary.get("max_loss_gap")
        lines += ["", f"Largest |standard - flash| gap over the {summary['evals_compared']} evaluations both made: "
                      f"masked-LM accuracy {summary['max_acc_gap']:.4f}"
                      + (f", masked-LM loss {loss:.4f}." if loss is not None else ".")]
    if summary.get("throughput_flash_over_standard"):
        lines += ["", "Steady-state training throughput (real tokens/s, every logged window but the first), flash over "
                      f"standard: {summary['throughput_flash_over_standard']:.2f}x."]
    kinds = list(curves)
    others = [k for k in kinds if k != "standard"]
    lines += ["", "Training wall-clock (s) to reach each masked-LM accuracy (every level both runs reached):", "",
              "| val/mlm_acc >= | " + " | ".join(kinds) + " | " + " | ".join(f"speedup {k}" for k in others) + " |",
              "|---:|" + "---:|" * (len(kinds) + len(others))]
    for row in summary["levels"]:
        sp = [f"{row['speedup'][k]:.2f}x" if row.get("speedup", {}).get(k) else "-" for k in others]
        lines.append(f"| {row['level']:.2f} | " + " | ".join(f"{row[k]:.0f}" for k in kinds) + " | "
                     + " | ".join(sp) + " |")
    if not summary["levels"]:
        lines += ["", f"No accuracy level from {LEVELS[0]:.2f} up was reached by every run, so time to accuracy is not "
                      "measured: the runs need more steps (or a recipe that learns faster)."]
    if unfinished:
        lines += ["", "Not finished within the device budget (rerun the same command to continue):", "",
                  *[f"- `{c}`" for c in unfinished]]
    return "\n".join(lines) + "\n"


def plot(curves: dict, path: Path, meta: dict) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    for kind, c in curves.items():
        ev = c["evals"]
        ax[0].plot([e["step"] for e in ev], [e["mlm_acc"] for e in ev], marker=".", label=kind)
        ax[1].plot([e["seconds"] for e in ev], [e["mlm_acc"] for e in ev], marker=".", label=kind)
        loss = [(e["step"], e["mlm_loss"]) for e in ev if e.get("mlm_loss") is not None]
        ax[2].plot([s for s, _ in loss], [v for _, v in loss], marker=".", label=kind)
    ax[0].set_xlabel("optimizer step")
    ax[1].set_xlabel("training wall-clock (s)")
    ax[2].set_xlabel("optimizer step")
    for a in ax[:2]:
        a.set_ylabel("val masked-LM accuracy")
    ax[2].set_ylabel("val masked-LM loss")
    for a in ax:
        a.legend()
    fig.suptitle(f"BERT masked-LM accuracy per attention kind ({meta['gpu']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    ap.add_argument("--experiment", default="bert/medium-quality")
    ap.add_argument("--kinds", default="standard,flash")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", default="outputs/bert_quality")
    ap.add_argument("--out", default="results/bert")
    ap.add_argument("--budget", type=float, default=None, help="seconds this invocation may take")
    ap.add_argument("--collect", action="store_true", help="only build the table from the run folders")
    ap.add_argument("--combine", nargs="+", metavar="QUALITY_JSON",
                    help="only write quality_seeds.md to --out: one row per quality.json (one seed each) and the mean")
    ap.add_argument("--acc-target", type=float, default=0.15, help="accuracy target of --combine")
    ap.add_argument("--loss-target", type=float, default=6.10, help="masked-LM loss target of --combine")
    args = ap.parse_args(argv)
    meta = run_metadata([__file__, *(argv if argv is not None else sys.argv[1:])])
    if args.combine:
        md = (f"# BERT Table 1 at lab scale, every seed\n\nCommand: `{meta['command']}`\n\n"
              + combine([repo_path(p) for p in args.combine], args.acc_target, args.loss_target))
        repo_path(args.out).mkdir(parents=True, exist_ok=True)
        (repo_path(args.out) / "quality_seeds.md").write_text(md)
        print(md)
        return
    runs, out = repo_path(args.runs), repo_path(args.out)
    kinds = args.kinds.split(",")
    runner = Runner(None if args.budget is None else time.time() + args.budget, 60, False)
    unfinished = []
    for kind in kinds:
        folder = run_dir(runs, kind, args.seed)
        if not args.collect and not finished(folder):
            ckpt = resume_checkpoint(folder)  # resumed: train/run.py keeps the earlier metrics.csv as metrics.partK.csv
            status = runner.run(command(args.experiment, kind, args.seed, folder, args.overrides, ckpt),
                                folder / "stdout.log")
            print(f"{kind}: {status}", flush=True)
        if not finished(folder):
            unfinished.append(show(["python", "scripts/bert_quality.py", *(argv if argv is not None else sys.argv[1:])]))
    curves = {k: curve(read_parts(run_dir(runs, k, args.seed))) for k in kinds}
    summary = summarize(curves)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps({"env": meta, "curves": curves, **summary}, indent=1))
    md = markdown(curves, summary, meta, sorted(set(unfinished)))
    (out / "quality.md").write_text(md)
    plot(curves, out / "quality.png", meta)
    print(md)


if __name__ == "__main__":
    main()
