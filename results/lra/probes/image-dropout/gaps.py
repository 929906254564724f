"""Training-loss and validation gaps between pairs of LRA Image runs that share init and data order (seed 1,
or seed 2 where named), over their first 15,000 steps: writes gaps.md and gaps.png next to this file.

    python results/lra/probes/image-dropout/gaps.py
"""
import glob
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(REPO / "scripts"))
from _common import pyplot  # noqa: E402

RUNS = {"parity flash s1": "results/lra/runs/image/flash/seed1", "parity standard s1": "results/lra/runs/image/standard/seed1",
        "parity flash s2": "results/lra/runs/image/flash/seed2", "parity standard s2": "results/lra/runs/image/standard/seed2",
        **{name: f"{HERE.relative_to(REPO)}/runs/{name}" for name in
           ["noattndrop-flash", "noattndrop-standard", "newstream-flash", "eager-flash", "eager-standard",
            "dropseed2-flash", "dropseed2-standard"]}}
# (label, a, b): a - b. What differs between a and b is in the label.
PAIRS = [
    ("flash - standard, attention dropout 0", "noattndrop-flash", "noattndrop-standard"),
    ("flash - standard, dropout seed 1 (the parity pair)", "parity flash s1", "parity standard s1"),
    ("flash - standard, dropout seed 2", "dropseed2-flash", "dropseed2-standard"),
    ("flash - standard, seed 2 (another init too)", "parity flash s2", "parity standard s2"),
    ("standard - standard, dropout seed 2 vs 1", "dropseed2-standard", "parity standard s1"),
    ("flash - flash, dropout seed 2 vs 1", "dropseed2-flash", "newstream-flash"),
    ("flash - flash, committed mask stream vs the old one", "newstream-flash", "parity flash s1"),
    ("flash - flash, eager vs CUDA graphs", "eager-flash", "newstream-flash"),
    ("standard - standard, eager vs CUDA graphs", "eager-standard", "parity standard s1"),
]
BINS = [(0, 5000), (5000, 10000), (10000, 15000)]


def load(path):
    df = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(str(REPO / path / "metrics*.csv")))])
    train = df.dropna(subset=["train/loss"]).groupby("step")["train/loss"].mean()
    val = df.dropna(subset=["val/acc"]).groupby("step")["val/acc"].mean()
    return train, val


def main():
    data = {k: load(v) for k, v in RUNS.items()}
    lines = ["# LRA Image: where the flash - standard gap comes from (pairs of runs, first 15,000 steps)", "",
             "Mean training-loss difference a - b per bin of steps (the loss logged every 10 steps), and the validation",
             "accuracy difference (points) at the last evaluation both made before step 15,000. Written by "
             "`python results/lra/probes/image-dropout/gaps.py`.", "",
             "| pair (a - b) | " + " | ".join(f"train loss {lo // 1000}-{hi // 1000}K" for lo, hi in BINS) +
             " | val acc (pts) |", "|---|" + "---:|" * (len(BINS) + 1)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    for label, a, b in PAIRS:
        (ta, va), (tb, vb) = data[a], data[b]
        common = ta.index.intersection(tb.index)
        diff = (ta[common] - tb[common])
        cells = [f"{diff[(diff.index >= lo) & (diff.index < hi)].mean():+.4f}" for lo, hi in BINS]
        shared = [s for s in va.index.intersection(vb.index) if s < 15000]
        vgap = f"{100 * (va[shared[-1]] - vb[shared[-1]]):+.1f} (step {shared[-1]:,})" if shared else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {vgap} |")
        d = diff[diff.index < 15000].rolling(50, min_periods=10).mean()
        ax.plot(d.index, d.values, label=label, linestyle="-" if "flash - standard" in label else "--")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss a - b (500-step mean)")
    ax.set_title("LRA Image: training-loss gaps between runs sharing init and data order")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "gaps.png", dpi=110)
    (HERE / "gaps.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
