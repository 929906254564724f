"""Pool the quiet parity recipe's three dropout realisations into one table and plot.

Each realisation is a pair of runs, standard-matched and flash, that share init, data order and dropout masks; the
pair's gap at every evaluation is the paired statistic. Reads the runs' metrics.csv files committed beside this
script (seeds 2 and 3) and in ../gpt2_parity_quiet/ (session 30's run, the recipe's own seed), and the swap_eval
tables (the same weights evaluated with each kind). Writes ../gpt2_parity_seeds.{md,json,png}. From the repo root:

    python results/training/gpt2_parity_seeds/aggregate.py
"""
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINING = HERE.parent
sys.path.insert(0, str(TRAINING.parents[1] / "scripts"))
from compare_attention import read_metrics  # noqa: E402

KINDS = ("standard-matched", "flash")
# label -> (folder holding one sub-folder per kind, micro-batch a rank): session 30's run, then every seedS folder here
# (device.sh with SEEDS="S ..." MICRO=16; copy each seed's tables, swap_eval and per-kind metrics into seedS/).
REALISATIONS = {"recipe seed": (TRAINING / "gpt2_parity_quiet", 4)}
REALISATIONS.update({f"dropout_seed={d.name[4:]}": (d, 16)
                     for d in sorted(HERE.glob("seed*"), key=lambda d: int(d.name[4:])) if d.is_dir()})
TOLERANCE = 0.01
# Two-sided 95% quantiles of Student's t by degrees of freedom: with three realisations the standard error rests on
# two degrees of freedom, so "two standard errors" would overstate what three runs can show.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_975(dof: int) -> float:
    """The tabled quantile at the largest tabled degrees of freedom not above dof (conservative between rows)."""
    return T_975[max(d for d in T_975 if d <= dof)]


def mean_and_sem(values):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return mean, sd / math.sqrt(n)


def load():
    """(evaluation steps, {realisation: {kind: {step: val/ppl}}}); every run must be evaluated at the same steps."""
    curves = {label: {kind: dict(read_metrics(folder / kind / "metrics.csv")["val/ppl"]) for kind in KINDS}
              for label, (folder, _) in REALISATIONS.items()}
    steps = sorted(curves["recipe seed"]["standard-matched"])
    for label, pair in curves.items():
        for kind, curve in pair.items():
            if sorted(curve) != steps:
                raise ValueError(f"{label} {kind}: evaluated at other steps than the recipe seed's standard-matched")
    return steps, curves


def swap_gaps():
    """Largest |gap| of flash to standard-matched at the same weights (swap_eval's own largest_gap), per realisation
    that has a swap_eval."""
    return {label: abs(json.loads((folder / "swap_eval.json").read_text())["largest_gap"]["flash"])
            for label, (folder, _) in REALISATIONS.items() if (folder / "swap_eval.json").exists()}


def main():
    steps, curves = load()
    labels = list(curves)
    gaps = {lab: [curves[lab]["flash"][s] / curves[lab]["standard-matched"][s] - 1 for s in steps] for lab in labels}
    pooled = [mean_and_sem([gaps[lab][i] for lab in labels]) for i in range(len(steps))]
    # Run-to-run spread of one kind with everything but the dropout masks equal: the largest ratio between the
    # micro-batch-16 realisations at each evaluation.
    same_split = [lab for lab in labels if REALISATIONS[lab][1] == 16]
    spread = {kind: [max(curves[a][kind][s] for a in same_split) / min(curves[a][kind][s] for a in same_split) - 1
                     for s in steps] for kind in KINDS}
    swaps = swap_gaps()
    t = t_975(len(labels) - 1)

    lines = [f"# GPT-2 small quality parity over {len(labels)} dropout realisations (four H100s)", "",
             "Made by `python results/training/gpt2_parity_seeds/aggregate.py` from the runs in `gpt2_parity_seeds/` "
             "(see its README for hardware, versions and commands) and `gpt2_parity_quiet/`.", "",
             "Gap of flash's validation perplexity to standard-matched's, within each realisation (same init, data "
             f"order and dropout masks); the pooled column is the mean over the {len(labels)} and its standard error. "
             "The last two columns: one kind's spread over the micro-batch-16 realisations (largest / smallest - 1).", "",
             "| step | " + " | ".join(labels) + " | pooled | standard-matched across seeds | flash across seeds |",
             "|---:|" + "---:|" * (len(labels) + 3)]
    for i, s in enumerate(steps):
        cells = [f"{gaps[lab][i]:+.2%}" for lab in labels]
        cells.append(f"{pooled[i][0]:+.2%} ± {pooled[i][1]:.2%}")
        cells += [f"{spread[k][i]:.2%}" for k in KINDS]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    worst = {lab: max(abs(g) for g in gaps[lab]) for lab in labels}
    lines += ["", "- Largest |gap| per realisation: "
              + ", ".join(f"{lab} {w:.2%} ({'within' if w <= TOLERANCE else 'over'} {TOLERANCE:.0%})"
                          for lab, w in worst.items()) + ".",
              f"- Pooled gap: largest |mean| {max(abs(m) for m, _ in pooled):.2%}; "
              f"evaluations whose mean differs from zero at 95% (t, {len(labels) - 1} degrees of freedom, "
              f"|mean| > {t:.2f} s.e.): {sum(abs(m) > t * e for m, e in pooled)} of {len(steps)}; "
              f"largest |mean| / s.e. {max(abs(m) / e for m, e in pooled):.2f}.",
              f"- Same kind, other dropout masks ({', '.join(same_split)}; largest / smallest - 1): standard-matched up to {max(spread['standard-matched']):.2%} "
              f"apart, flash up to {max(spread['flash']):.2%}.",
              "- The same weights evaluated with each kind (swap_eval, every checkpoint of standard-matched's run): "
              + ", ".join(f"{lab} largest |gap| {g:.4%}" for lab, g in swaps.items()) + "."]
    (TRAINING / "gpt2_parity_seeds.md").write_text("\n".join(lines) + "\n")
    (TRAINING / "gpt2_parity_seeds.json").write_text(json.dumps({
        "steps": steps, "val_ppl": curves, "gap": gaps,
        "pooled_gap": [{"mean": m, "sem": e} for m, e in pooled],
        "same_kind_spread_seed2_vs_3": spread, "swap_eval_largest_gap": swaps}, indent=1))
    plot(steps, labels, curves, gaps, pooled, spread, t)
    print("\n".join(lines))


def plot(steps, labels, curves, gaps, pooled, spread, t):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for lab, color in zip(labels, ("tab:blue", "tab:orange", "tab:green")):
        left.plot(steps, [curves[lab]["standard-matched"][s] for s in steps], color=color, label=f"{lab} standard-matched")
        left.plot(steps, [curves[lab]["flash"][s] for s in steps], color=color, linestyle="--", label=f"{lab} flash")
        right.plot(steps, [100 * g for g in gaps[lab]], color=color, marker="o", label=f"{lab}: flash vs standard-matched")
    right.errorbar(steps, [100 * m for m, _ in pooled], yerr=[100 * t * e for _, e in pooled], color="black",
                   marker="s", capsize=3, label="pooled mean, 95% interval")
    right.plot(steps, [100 * x for x in spread["standard-matched"]], color="grey", linestyle=":",
               label="standard-matched across seeds (largest / smallest - 1)")
    right.axhspan(-100 * TOLERANCE, 100 * TOLERANCE, color="grey", alpha=0.15, label="±1% bar")
    right.axhline(0, color="black", linewidth=0.5)
    left.set(yscale="log", xlabel="step", ylabel="validation perplexity", title="Curves (solid standard-matched, dashed flash)")
    right.set(xlabel="step", ylabel="gap (%)", title="Paired gap per realisation")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(TRAINING / "gpt2_parity_seeds.png", dpi=120)


if __name__ == "__main__":
    main()
