"""Path-X / Path-256 training runs: how far each got, its validation curve, its speed, and what the
experiment's full recipe would cost on the GPU it ran on.

    python scripts/longctx_runs.py                          # every run under outputs/longctx -> results/longctx/
    python scripts/longctx_runs.py --runs outputs/longctx/pathx-short --out results/longctx

A run is a train/run.py folder (.hydra/config.yaml and overrides.yaml, metrics*.csv, calls.csv), found
at --runs or one or two levels below it; the experiment (lra/pathx, lra/path256, lra/pathfinder64) comes
from its overrides. Reported per run: attention kind, steps done of the run's own max_steps and of the
recipe's, validation accuracy at every evaluation (the last and the best), test accuracy once finished,
SpeedMonitor's steady state (step time, tokens/s, peak memory: every logged window but the first), the
device calls (calls.csv), and the recipe's cost in GPU-hours: the recipe's steps x the measured step
time, scaled by recipe batch / run batch where the run used another batch. The paper's numbers (Dao et
al. 2022, Table 6): Path-X 61.4% with FlashAttention, Path-256 63.1% with block-sparse FlashAttention;
chance is 50%. Writes longctx_runs.{md,json,png} to --out; relative paths count from the repo root.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import markdown_header, pyplot, rel, repo_path, repo_root, run_metadata

REPO = repo_root()
import reproduce_lra as R  # noqa: E402  (metrics, steady speed and calls.csv readers shared with Table 3)

TITLES = {"pathx": "Path-X (128 x 128, 16,384 tokens)", "path256": "Path-256 (256 x 256, 65,536 tokens)",
          "pathfinder64": "Pathfinder-64 (64 x 64, 4,096 tokens)"}
PAPER = {"pathx": ("flash", 61.4), "path256": ("blocksparse", 63.1)}  # Dao et al. 2022, Table 6


def find_runs(root: Path) -> list[Path]:
    """Run folders at root or one or two levels below it."""
    found = [p.parent.parent for p in sorted(root.glob("**/.hydra/config.yaml")) if len(p.relative_to(root).parts) <= 4]
    return sorted(set(found))


def experiment_of(run_dir: Path) -> str | None:
    """The `experiment=lra/NAME` override the run was started with (NAME), or None."""
    ov = run_dir / ".hydra" / "overrides.yaml"
    if not ov.exists():
        return None
    from omegaconf import OmegaConf

    for item in OmegaConf.load(ov):
        key, _, value = str(item).partition("=")
        if key.lstrip("+") == "experiment" and value.startswith("lra/"):
            return value.removeprefix("lra/")
    return None


def read(run_dir: Path) -> dict | None:
    """reproduce_lra's reading of a run folder (metrics of every call, steady speed, devices), plus the
    experiment, its recipe and what that recipe would cost at the measured step time."""
    name = experiment_of(run_dir)
    run = R.read_run(run_dir) if name in TITLES else None
    if run is None:
        return None
    from omegaconf import OmegaConf

    rec, speed = R.recipe(name), run["speed"]
    batch = (run["micro_batch"] or 0) * run["accumulate"]
    hours = None
    if speed.get("step_time_ms") and batch:
        hours = rec["max_steps"] * speed["step_time_ms"] * (rec["batch"] / batch) / 3.6e6
    val = [(step, 100 * acc) for step, acc in run["val_curve"]]
    return {"dir": rel(run_dir), "experiment": name, "kind": run["kind"], "seed": run["seed"],
            "steps_done": run["steps_done"], "max_steps": run["max_steps"], "batch": batch,
            "recipe_steps": rec["max_steps"], "recipe_batch": rec["batch"],
            "init_from": OmegaConf.select(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), "init_from"),
            "val_curve": val, "val_last": val[-1][1] if val else None,
            "val_best": max(a for _, a in val) if val else None,
            "test_acc": None if run["test_acc"] is None else 100 * run["test_acc"],
            "speed": speed, "recipe_gpu_hours": hours, "devices": run["devices"],
            "calls": len(R.read_calls(run_dir) or []),
            "command": command(run_dir)}


def command(run_dir: Path) -> str:
    """The train/run.py command the run was started with: its overrides, then Hydra's own (the run folder)."""
    from omegaconf import OmegaConf

    args = [str(o) for o in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")]
    hydra = run_dir / ".hydra" / "hydra.yaml"
    if hydra.exists():
        args += [str(o) for o in OmegaConf.select(OmegaConf.load(hydra), "hydra.overrides.hydra") or []
                 if not str(o).startswith("hydra.mode=")]
    return "python train/run.py " + " ".join(args)


def _f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)


def markdown(runs: list[dict], meta: dict) -> str:
    lines = markdown_header("Long-context training runs: Path-X and Path-256", meta) + [
        "Steps: this run's / its own max_steps (a shortened schedule where it is below the recipe's); recipe: the "
        "experiment file's steps. Validation accuracy in %, chance 50. Speed: SpeedMonitor's steady state. Recipe "
        "GPU-hours: the recipe's steps x this run's step time (x recipe batch / run batch): an estimate from the "
        "measured step time, not a measurement of a complete run.", "",
        "| run | attention | steps | recipe steps | val acc last / best | test acc | paper | step (ms) | tokens/s | "
        "peak mem (GiB) | recipe GPU-hours | device |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        paper = PAPER.get(r["experiment"])
        sp, steps = r["speed"], f"{r['steps_done']:,} of {_f(r['max_steps'], '{:,}')}"
        lines.append(
            f"| {TITLES[r['experiment']]}: `{r['dir']}` | {r['kind']} | {steps} | "
            f"{r['recipe_steps']:,} | {_f(r['val_last'])} / {_f(r['val_best'])} | {_f(r['test_acc'])} | "
            f"{f'{paper[1]} ({paper[0]})' if paper else '-'} | {_f(sp.get('step_time_ms'))} | "
            f"{_f(sp.get('tokens_per_s'), '{:,.0f}')} | {_f(sp.get('peak_mem_gib'), '{:.2f}')} | "
            f"{_f(r['recipe_gpu_hours'])} | {'; '.join(r['devices']) or '-'} |")
    lines += ["", "Validation accuracy at each evaluation (step: %):", ""]
    for r in runs:
        curve = ", ".join(f"{s}: {a:.1f}" for s, a in r["val_curve"]) or "no evaluation yet"
        start = f"from {r['init_from']}" if r["init_from"] else "from scratch"
        lines.append(f"- `{r['dir']}` ({r['kind']}, {start}): {curve}")
    lines += ["", "Each run's command (its .hydra/overrides.yaml; the same command resumes it in a later call):", ""]
    lines += [f"- `{r['dir']}`: `{r['command']}`" for r in runs]
    lines += ["", "Curves: longctx_runs.png."]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    plt = pyplot()
    names = [n for n in TITLES if any(r["experiment"] == n for r in runs)]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for r in runs:
            if r["experiment"] == name and r["val_curve"]:
                steps, accs = zip(*r["val_curve"])
                ax.plot(steps, accs, marker="o", label=f"{r['kind']} ({Path(r['dir']).name})")
        ax.axhline(50, color="gray", linestyle=":", label="chance")
        if name in PAPER:
            ax.axhline(PAPER[name][1], color="black", linestyle="--", label=f"paper ({PAPER[name][0]})")
        ax.set_title(TITLES[name])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("val accuracy (%)")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="outputs/longctx", help="a run folder, or a folder of them")
    ap.add_argument("--out", default="results/longctx")
    args = ap.parse_args(argv)
    root = repo_path(args.runs)
    runs = [r for r in (read(d) for d in find_runs(root)) if r]
    if not runs:
        raise SystemExit(f"no Path-X / Path-256 / Pathfinder-64 run folder under {args.runs} "
                         "(train/run.py experiment=lra/pathx ... hydra.run.dir=...)")
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the machine that wrote the report; each run's own GPU and dates are in its device column (calls.csv)
    meta = run_metadata(None if argv is None else [__file__, *argv], device=False)
    (out / "longctx_runs.md").write_text(markdown(runs, meta))
    (out / "longctx_runs.json").write_text(json.dumps({"env": meta, "runs": runs}, indent=1, default=str))
    plot(runs, out / "longctx_runs.png")
    print((out / "longctx_runs.md").read_text())
    return runs


if __name__ == "__main__":
    main()
