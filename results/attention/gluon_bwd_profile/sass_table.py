"""Read the per-instruction SASS tables that stalls.sh writes (`ncu --page source --csv --print-source sass`, gzipped):
executed instructions by opcode and the sampled stall reasons of the largest kernel, and its most-sampled
instructions. CPU only:

    python results/attention/gluon_bwd_profile/sass_table.py sass_ours_fwd_c2k.csv.gz sass_cudnn_fwd_c2k.csv.gz
"""
import argparse
import collections
import csv
import gzip
from pathlib import Path

STALLS = ("stall_barrier", "stall_wait", "stall_long_sb", "stall_short_sb", "stall_selected", "stall_not_selected",
          "stall_dispatch", "stall_mio", "stall_math")


def load(path) -> dict[str, list[dict]]:
    """kernel name -> its instructions (one dict a row, keyed by the table's header)."""
    kernels, name, header = collections.defaultdict(list), None, None
    with gzip.open(path, "rt") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                name, header = row[1], None
            elif row and row[0] == "Address":
                header = row
            elif header and len(row) == len(header):
                kernels[name].append(dict(zip(header, row)))
    return kernels


def _int(x: str) -> int:
    return int(x.replace(",", "")) if x and x not in ("-",) else 0


def report(path, top: int) -> None:
    kernels = load(path)
    name, rows = max(kernels.items(), key=lambda kv: sum(_int(d["Instructions Executed"]) for d in kv[1]))
    ops, stalls = collections.Counter(), collections.Counter()
    for d in rows:
        words = d["Source"].split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") else words[0]
        ops[op.split(".")[0]] += _int(d["Instructions Executed"])
        stalls.update({k: _int(d.get(k, "")) for k in STALLS})
    print(f"== {Path(path).name}: {name[:100]} ({len(rows)} SASS lines)")
    print(f"executed warp instructions {sum(ops.values()) / 1e6:.1f} M: "
          + " ".join(f"{o} {n / 1e6:.2f}M" for o, n in ops.most_common(20)))
    print("stall samples: " + " ".join(f"{k[6:]} {n}" for k, n in stalls.most_common()))
    print("most-sampled instructions (index, samples, executed, source):")
    ranked = sorted(range(len(rows)), key=lambda i: -_int(rows[i]["Warp Stall Sampling (All Samples)"]))[:top]
    for i in ranked:
        d = rows[i]
        why = " ".join(f"{k[6:]}={d[k]}" for k in STALLS if _int(d.get(k, "")))
        print(f"{i:5d} {_int(d['Warp Stall Sampling (All Samples)']):6d} {_int(d['Instructions Executed']) / 1e3:8.1f}K "
              f"{d['Source'].strip()[:64]:64s} {why}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("tables", nargs="+")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    for t in a.tables:
        report(t, a.top)
