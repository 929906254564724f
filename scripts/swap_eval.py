"""Evaluate one run's checkpoints with several attention kinds: the same weights, only `attn=` differs.

    python scripts/swap_eval.py --run outputs/parity_quiet/runs/standard-matched --attn standard-matched,flash
    python scripts/swap_eval.py --run RUN --attn standard,flash --steps 150 1500 data.batch_size=16

Quality parity (scripts/compare_attention.py) trains one run per kind and compares the curves. Two exact
attentions that round differently drift apart over a run, by more than 1% in the high-learning-rate phase
(results/training/gpt2_parity_quiet/README.md), so a gap between curves mixes the kernel's error with the
trajectory's amplification of it. Here every kind evaluates the same weights, so the gap is the kernel's alone,
at weights that training actually reached.

For each checkpoint <run>/checkpoints/step*.ckpt (step order; --steps keeps some) and each kind, the validation
pass of the run's own config (its .hydra/overrides.yaml with attn= replaced, one device, the same precision)
gives val/ppl. The table lists each kind's relative gap to the first kind and the largest. Extra arguments are
Hydra overrides added to every evaluation. Writes <out>/<name>.md and .json with GPU, versions, date, command.
--merge A.json B.json ... writes one table from the JSON files of runs over disjoint checkpoints (e.g. one per
GPU, --steps split between them) of the same run and kinds, evaluating nothing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from _common import compose_config, markdown_header, rel, repo_path, run_metadata

# Overrides of the training run that an evaluation on one device replaces or must not inherit.
DROPPED = ("attn=", "trainer=", "trainer.devices=", "logger=", "ckpt_path=", "init_from=", "hydra.", "callbacks.",
           "trainer.enable_progress_bar=")


def checkpoints(run: Path, steps: list[int] | None) -> list[tuple[int, Path]]:
    found = sorted((int(m.group(1)), p) for p in (run / "checkpoints").glob("step*.ckpt")
                   if (m := re.fullmatch(r"step(\d+)\.ckpt", p.name)))
    if not found:
        raise FileNotFoundError(f"{run}/checkpoints holds no step*.ckpt: train with callbacks.checkpoint on")
    if steps:
        missing = sorted(set(steps) - {s for s, _ in found})
        if missing:
            raise ValueError(f"no checkpoint for steps {missing} in {run}/checkpoints (has {[s for s, _ in found]})")
        found = [(s, p) for s, p in found if s in steps]
    return found


def run_overrides(run: Path) -> list[str]:
    path = run / ".hydra" / "overrides.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: --run must be a train/run.py output folder")
    from omegaconf import OmegaConf

    return [o for o in OmegaConf.to_container(OmegaConf.load(path)) if not o.lstrip("+~").startswith(DROPPED)]


def evaluate(overrides: list[str], ckpt: Path, attn: str, work: Path) -> dict:
    from train.run import build

    cfg = compose_config([*overrides, f"attn={attn}", "logger=none", "trainer=default",
                          "trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
                          f"init_from={ckpt}", f"output_dir={work}"])
    datamodule, task, trainer = build(cfg)
    (res,) = trainer.validate(task, datamodule=datamodule, verbose=False)
    return {k: float(v) for k, v in res.items() if k.startswith("val/")}


def table(results: dict, kinds: list[str], key: str) -> tuple[list[str], dict]:
    lines = [f"| step | {' | '.join(kinds)} |", "|---:|" + "---:|" * len(kinds)]
    worst = {k: 0.0 for k in kinds[1:]}
    for step, row in sorted(results.items()):
        base = row[kinds[0]][key]
        cells = [f"{base:.4f}"]
        for k in kinds[1:]:
            gap = row[k][key] / base - 1
            worst[k] = max(worst[k], gap, key=abs)
            cells.append(f"{row[k][key]:.4f} ({100 * gap:+.4f}%)")
        lines.append(f"| {step} | {' | '.join(cells)} |")
    return lines, worst


def merge(files: list[str]) -> tuple[Path, list[str], list[str], dict, list[dict]]:
    parts = [json.loads(Path(f).read_text()) for f in files]
    first = parts[0]
    results: dict[int, dict] = {}
    for f, part in zip(files, parts):
        if (part["run"], part["kinds"]) != (first["run"], first["kinds"]):
            raise ValueError(f"{f}: run {part['run']} kinds {part['kinds']}, not {first['run']} {first['kinds']}")
        for step, row in part["results"].items():
            if int(step) in results:
                raise ValueError(f"{f}: step {step} is in an earlier file too")
            results[int(step)] = row
    return repo_path(first["run"]), first["kinds"], first["overrides"], results, [p["env"] for p in parts]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", help="a train/run.py output folder (its .hydra and checkpoints)")
    ap.add_argument("--attn", default="standard,flash", help="kinds, comma-separated; gaps are to the first")
    ap.add_argument("--steps", type=int, nargs="*", help="only these checkpoints' steps")
    ap.add_argument("--out", default="results/training")
    ap.add_argument("--name", default="swap_eval")
    ap.add_argument("--merge", nargs="+", help="JSON files of this script to combine into one table")
    args, extra = ap.parse_known_args(argv)
    if not args.run and not args.merge:
        ap.error("--run (a run folder to evaluate) or --merge (JSON files to combine) is required")
    meta = run_metadata(sys.argv if argv is None else ["scripts/swap_eval.py", *argv], device=not args.merge)
    if args.merge:  # the machine, versions and date are the evaluations', not this merge's
        run, kinds, overrides, results, envs = merge(args.merge)
        meta = {**envs[0], "command": meta["command"], "merged_commands": [e["command"] for e in envs]}
    else:
        run, kinds = repo_path(args.run), args.attn.split(",")
        overrides = run_overrides(run) + extra
        work = repo_path("outputs/swap_eval")
        results = {}
        for step, ckpt in checkpoints(run, args.steps):
            for kind in kinds:
                results.setdefault(step, {})[kind] = evaluate(overrides, ckpt, kind, work)
                print(f"step {step} {kind}: {results[step][kind]}", flush=True)
    lines, worst = table(results, kinds, "val/ppl")
    md = markdown_header(f"Checkpoints of {rel(run)} evaluated with each attention kind", meta) + [
        "Validation perplexity of the same weights; in brackets the gap to the first kind.", "", *lines, ""]
    md += [f"- {k} vs {kinds[0]}: largest gap {100 * w:+.4f}% over {len(results)} checkpoints"
           for k, w in worst.items()]
    out = repo_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text("\n".join(md) + "\n")
    (out / f"{args.name}.json").write_text(json.dumps(
        {"env": meta, "run": rel(run), "overrides": overrides, "kinds": kinds,
         "results": {str(s): r for s, r in sorted(results.items())}, "largest_gap": worst}, indent=1) + "\n")
    print("\n".join(md[-len(worst):]))
    return results


if __name__ == "__main__":
    main()
