"""Train one config once per attention kind and tabulate speed, memory and perplexity.

    python scripts/compare_attention.py experiment=gpt2/small-embedded             # standard, sdpa, flash
    python scripts/compare_attention.py --attn standard,sdpa debug=smoke --out outputs/cmp

Every extra argument is a Hydra override passed to each `train/run.py` run unchanged; only `attn=`
differs. Each run writes its own folder under --runs-dir/<attn>/ (metrics.csv, .hydra, run.log, console.log: the
run's whole output, whose progress lines are echoed here as they come; default
outputs/compare_attention/). The table (compare_attention.md, .json) and plot (compare_attention.png) go
to --out (default results/training/) with the GPU, library versions, date and command; relative paths
count from the repo root. Tokens/s and step time are the SpeedMonitor windows after the first
(compilation and warm-up excluded); peak memory is the largest logged; val/ppl is the last
validation pass (exp of the mean token NLL over the whole validation split).

Quality parity (the FlashAttention paper's Table 2 at lab scale): with the same seed and data order every
kind computes the same function, so validation perplexity must agree at every evaluation up to dropout
draws and rounding. The table lists val/ppl per evaluation and kind, and each kind's largest relative gap
to the first kind (normally standard) against --parity-tol. --reuse keeps a kind whose run folder already
holds a finished run (its metrics.csv reaches trainer.max_steps), so a sweep longer than one sitting (or one
GPU call) is finished by running the same command again:

    python scripts/compare_attention.py --attn standard,flash --reuse --name gpt2_parity experiment=gpt2/small-corpus ...

--tabulate runs nothing: it writes the table and plot from the run folders already under --runs-dir (the same
overrides name max_steps), e.g. after the GPU machine was taken back mid-sweep. A run that stopped short is
kept and labelled with the step it reached; parity then compares the evaluations both kinds made.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from pathlib import Path

from _common import markdown_header, metrics_files, pyplot, rel_arg, repo_path, repo_root, run_in_group, run_metadata

REPO = repo_root()


SPEED_KEYS = ("perf/tokens_per_s", "perf/step_time_ms", "perf/mfu")


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Every series of a run's metrics.csv (path) and of the metrics.partK.csv beside it, in call order: a run
    chained over calls (ckpt_path=last) keeps each earlier call's file as a part (train/run.py), and its
    evaluations before the last resume live there. A later call resumes from a checkpoint at or before where
    the earlier one stopped, so what the earlier one logged from that step on is superseded. Each call's first
    speed window (compilation and warm-up, again after a resume) is left out of the speed series when the call
    logged more than one."""
    series: dict[str, list[tuple[int, float]]] = {}
    for part in metrics_files(path.parent):
        if not part.exists():
            continue
        with open(part) as f:
            rows = list(csv.DictReader(f))
        if rows:
            resumed_at = min(int(float(r.get("step") or 0)) for r in rows)
            series = {k: [(s, v) for s, v in vals if s < resumed_at] for k, vals in series.items()}
        windows = [r for r in rows if r.get("perf/tokens_per_s") not in ("", None)]
        warmup = windows[0] if len(windows) > 1 else None
        for row in rows:
            step = int(float(row.get("step") or 0))
            for k, v in row.items():
                if k in ("step", "epoch") or v in ("", None) or (row is warmup and k in SPEED_KEYS):
                    continue
                series.setdefault(k, []).append((step, float(v)))
    return series


def summarize(series) -> dict:
    """Mean speed over the steady windows (read_metrics leaves the warm-up ones out), peak memory, last values."""
    tps = [v for _, v in series.get("perf/tokens_per_s", [])]
    stm = [v for _, v in series.get("perf/step_time_ms", [])]
    out = {}
    if tps:
        out["tokens_per_s"] = sum(tps) / len(tps)
        out["step_time_ms"] = sum(stm) / len(stm)
    if series.get("perf/peak_mem_gib"):
        out["peak_mem_gib"] = max(v for _, v in series["perf/peak_mem_gib"])
    if series.get("perf/mfu"):
        m = [v for _, v in series["perf/mfu"]]
        out["mfu"] = sum(m) / len(m)
    for key in ("val/ppl", "val/loss", "train/loss"):
        if series.get(key):
            out[key] = series[key][-1][1]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", default="standard,sdpa,flash")
    ap.add_argument("--out", default="results/training")
    ap.add_argument("--name", default="compare_attention", help="file stem of the table and plot")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    ap.add_argument("--runs-dir", default="outputs/compare_attention", help="where each run's folder goes")
    ap.add_argument("--reuse", action="store_true", help="keep kinds whose run folder holds a finished run")
    ap.add_argument("--parity-tol", type=float, default=0.01,
                    help="largest relative val/ppl gap to the first kind, at any evaluation, that passes")
    ap.add_argument("--tabulate", action="store_true",
                    help="run nothing: tabulate the run folders under --runs-dir, unfinished ones included")
    args, overrides = ap.parse_known_args(argv)
    max_steps = configured_max_steps(overrides) if args.reuse or args.tabulate else None
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    env = run_metadata([__file__, *(argv if argv is not None else sys.argv[1:])])
    if args.tabulate:  # the machine that trained, not this one
        env = runs_env(env, [repo_path(args.runs_dir) / attn for attn in args.attn.split(",")])
    rows = []
    for attn in args.attn.split(","):
        run_dir = repo_path(args.runs_dir) / attn
        cmd = [sys.executable, "train/run.py", f"attn={attn}", *overrides,
               f"hydra.run.dir={run_dir}", "logger=csv", "trainer.enable_progress_bar=false"]
        metrics = run_dir / "metrics.csv"
        row = {"attn": attn, "command": " ".join(["python", *(rel_arg(c) for c in cmd[1:])])}
        if args.tabulate:
            rows.append(tabulated(row, metrics, max_steps))
            continue
        if args.reuse and finished(metrics, max_steps):
            series = read_metrics(metrics)
            row.update(reused=True, **summarize(series), series=series)
            rows.append(row)
            print(attn, "finished run reused:", rel_arg(str(run_dir)), flush=True)
            continue
        t = time.time()
        log = run_dir / "console.log"  # a run chained over calls keeps every call's output
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        returncode, output, timed_out = run_in_group(
            cmd, log, args.timeout, echo=lambda line: f"[{attn}] {line}" if PROGRESS.match(line) else None)
        row["wall_s"] = round(time.time() - t, 1)
        if timed_out:
            row["error"] = (f"timed out after {args.timeout} s; its last checkpoint stays in {rel_arg(str(run_dir))}: "
                            "the same command with ckpt_path=last (and --reuse) continues it")
        elif returncode != 0 or not metrics.exists():
            lines = [ln for ln in output if ln.strip() and "HYDRA_FULL_ERROR" not in ln]
            # the exception's own line (the last "...Error: ..."), else Hydra's summary line
            cause = [ln for ln in lines if re.match(r"\s*[\w.]+(Error|Exception): ", ln)]
            summary = next((ln for ln in lines if "Error" in ln or "Could not" in ln), lines[-1] if lines else "?")
            row["error"] = (cause[-1].strip() if cause else summary)[:200]
        else:
            series = read_metrics(metrics)
            row.update(summarize(series), series=series)
        rows.append(row)
        print(attn, {k: v for k, v in row.items() if k not in ("series", "command")}, flush=True)
        md = write_table(rows, out, args.name, env, args.parity_tol)  # after every run: a cut-off sweep keeps its rows
        plot(rows, out / f"{args.name}.png", env, args.parity_tol)

    if args.tabulate:
        md = write_table(rows, out, args.name, env, args.parity_tol)
    plot(rows, out / f"{args.name}.png", env, args.parity_tol)
    print("\n".join(md))


def runs_env(env: dict, run_dirs: list[Path]) -> dict:
    """--tabulate's header: GPU, versions and dates from the runs' calls.csv (train/run.py writes one row per
    call), with this invocation's command."""
    calls = []
    for d in run_dirs:
        if (d / "calls.csv").exists():
            with open(d / "calls.csv") as f:
                calls += list(csv.DictReader(f))
    if not calls:
        raise SystemExit(f"--tabulate: no calls.csv under {[rel_arg(str(d)) for d in run_dirs]}: nothing says which "
                         "GPU and versions the runs used")
    versions = dict(part.split(" ", 1) for part in (calls[0].get("software") or "").split(", ") if " " in part)
    starts = sorted(c["started_utc"] for c in calls)
    ends = sorted(c["ended_utc"] for c in calls if c.get("ended_utc"))
    return {"gpu": " / ".join(sorted({c["device"] for c in calls})), **versions,
            "date": f"trained {starts[0]} to {ends[-1] if ends else '?'}, tabulated {env['date']}",
            "command": env["command"]}


def tabulated(row: dict, metrics: Path, max_steps: int | None) -> dict:
    """row filled from an existing run folder's metrics (--tabulate); one short of max_steps notes where it stopped."""
    if not metrics.exists():
        return {**row, "error": f"no run: {rel_arg(str(metrics))} does not exist"}
    series = read_metrics(metrics)
    row.update(summarize(series), series=series)
    if max_steps is not None and not reached(series, max_steps):
        last = max((s for vals in series.values() for s, _ in vals), default=-1)
        row["stopped_at"] = f"step {last + 1:,} of {max_steps:,}"  # metrics carry the 0-based step index
    return row


# What compare_attention echoes of a run's output: train/run.py's progress lines (one per logging window with the
# bar off), the end of each call, and errors
PROGRESS = re.compile(r"^(step \d|done: |call \d+: |stopped by |Traceback|\S*(Error|Exception): )")


def configured_max_steps(overrides: list[str]) -> int | None:
    """trainer.max_steps of the composed run config (the experiment's, or an override's)."""
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[o for o in overrides if not o.startswith("hydra.")])
    steps = cfg.trainer.get("max_steps")
    return int(steps) if steps is not None and int(steps) > 0 else None


def finished(metrics: Path, max_steps: int | None) -> bool:
    """A run folder whose metrics reach max_steps (with a validation pass there), i.e. nothing to redo."""
    return metrics.exists() and reached(read_metrics(metrics), max_steps)


def reached(series, max_steps: int | None) -> bool:
    """Whether a run's series (read_metrics) hold a validation pass at max_steps."""
    ppl = series.get("val/ppl", [])
    return max_steps is not None and bool(ppl) and max(s for s, _ in ppl) >= max_steps - 1  # 0-based step index


def parity(rows, tol: float) -> list[str]:
    """val/ppl at every evaluation per kind, and each kind's largest relative gap to the first kind."""
    ok = [r for r in rows if r.get("series", {}).get("val/ppl")]
    if len(ok) < 2:
        return []
    curves = {r["attn"]: dict(r["series"]["val/ppl"]) for r in ok}
    ref_name = ok[0]["attn"]
    ref = curves[ref_name]
    steps = sorted(set().union(*curves.values()))
    lines = ["", f"## Quality parity: validation perplexity at every evaluation (relative gap to {ref_name})", "",
             "| step | " + " | ".join(curves) + " |", "|---:|" + "---:|" * len(curves)]
    for st in steps:
        cells = []
        for name, c in curves.items():
            if st not in c:
                cells.append("-")
            elif name == ref_name or st not in ref:
                cells.append(f"{c[st]:.2f}")
            else:
                cells.append(f"{c[st]:.2f} ({100 * (c[st] / ref[st] - 1):+.2f}%)")
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, c in curves.items():
        if name == ref_name:
            continue
        common = [st for st in c if st in ref]
        if not common:
            lines.append(f"- {name}: no evaluation at a step {ref_name} evaluated at")
            continue
        gap = max(abs(c[st] / ref[st] - 1) for st in common)
        verdict = "PASS" if gap <= tol else "MISS"
        lines.append(f"- {name} vs {ref_name}: largest gap {100 * gap:.2f}% over {len(common)} evaluations "
                     f"(tolerance {100 * tol:.1f}%): {verdict}; final val/ppl {c[common[-1]]:.2f} vs "
                     f"{ref[common[-1]]:.2f}")
    return lines


def write_table(rows, out, name, env, tol: float = 0.01):
    base = next((r.get("tokens_per_s") for r in rows if r["attn"] == "standard" and "tokens_per_s" in r), None)
    md = markdown_header("Attention kinds, same training config", env) + [
        "| attn | tokens/s | step (ms) | speedup vs standard | MFU | peak mem (GiB) | final val/ppl |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['attn']} | failed: {r['error']} | | | | | |")
            continue
        f = lambda k, fmt: (fmt.format(r[k]) if k in r else "-")  # noqa: E731
        sp = f"{r['tokens_per_s'] / base:.2f}x" if base and "tokens_per_s" in r else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        label = (f"{r['attn']} (earlier call)" if r.get("reused") else
                 f"{r['attn']} (stopped at {r['stopped_at']})" if r.get("stopped_at") else r["attn"])
        md.append(f"| {label} | {f('tokens_per_s', '{:,.0f}')} | {f('step_time_ms', '{:.1f}')} | {sp} | {mfu} "
                  f"| {f('peak_mem_gib', '{:.2f}')} | {f('val/ppl', '{:.2f}')} |")
    if any(r.get("reused") for r in rows):
        md += ["", "(earlier call): a finished run kept by --reuse from an earlier invocation; its speed was measured "
                   "in another process and possibly another GPU session, so speed ratios across such rows are not "
                   "same-run measurements."]
    md += parity(rows, tol)
    (out / f"{name}.md").write_text("\n".join(md) + "\n")
    (out / f"{name}.json").write_text(json.dumps(
        {"env": env, "rows": [{k: v for k, v in r.items() if k != "series"} for r in rows]}, indent=1))
    return md


def plot(rows, path, env, tol: float = 0.01):
    plt = pyplot()
    ok = [r for r in rows if "tokens_per_s" in r]
    curves = [r for r in ok if r["series"].get("val/ppl")]
    fig, ax = plt.subplots(1, 4 if len(curves) > 1 else 3, figsize=(18 if len(curves) > 1 else 14, 3.8))
    color = {r["attn"]: f"C{i}" for i, r in enumerate(ok)}  # one colour per kind in every panel
    ax[0].bar([r["attn"] for r in ok], [r["tokens_per_s"] / 1e3 for r in ok], color=[color[r["attn"]] for r in ok])
    ax[0].set_ylabel("training throughput (K tokens/s)")
    ax[0].set_title(env["gpu"], fontsize=9)
    for r in ok:
        pts = r["series"].get("train/loss", [])
        ax[1].plot([s for s, _ in pts], [v for _, v in pts], color=color[r["attn"]], label=r["attn"])
        pts = r["series"].get("val/ppl", [])
        ax[2].plot([s for s, _ in pts], [v for _, v in pts], marker="o", ms=3, color=color[r["attn"]], label=r["attn"])
    ax[1].set_xlabel("optimizer step")
    ax[1].set_ylabel("train loss")
    ax[1].legend()
    ax[2].set_xlabel("optimizer step")
    ax[2].set_ylabel("validation perplexity")
    ax[2].set_yscale("log")
    ax[2].legend()
    if len(curves) > 1:  # parity: each kind's val/ppl relative to the first kind's, with the tolerance band
        ref = dict(curves[0]["series"]["val/ppl"])
        for r in curves[1:]:
            pts = [(s, 100 * (v / ref[s] - 1)) for s, v in r["series"]["val/ppl"] if s in ref]
            ax[3].plot([s for s, _ in pts], [g for _, g in pts], marker="o", ms=3, color=color[r["attn"]],
                       label=r["attn"])
        ax[3].axhspan(-100 * tol, 100 * tol, color="tab:green", alpha=0.15, label=f"+-{100 * tol:g}%")
        ax[3].axhline(0, color="gray", lw=0.8)
        ax[3].set_xlabel("optimizer step")
        ax[3].set_ylabel(f"val/ppl gap to {curves[0]['attn']} (%)")
        ax[3].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
