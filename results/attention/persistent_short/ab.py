"""Our attention at short lengths (1K-2K tokens, 16K a batch), before and after session 34's kernel changes (the
persistent Gluon forward with its new MIN_SEQLEN at head dim 64, the 3-deep head-dim-64 backward ring, delta in the
dQ kernel): forward and forward+backward, eager and replayed from a CUDA graph, cuDNN beside it in the same rounds.
One JSON line per point; device.sh runs it from two checkouts, alternating.

    python results/attention/persistent_short/ab.py --root <checkout> --tag before|after
"""
import argparse
import json
import sys
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--root", required=True, help="the checkout whose kernels and scripts are timed")
ap.add_argument("--tag", required=True)
ap.add_argument("--rep", type=int, default=50)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--shapes", nargs="+", help="head_dim:tokens:causal(0/1) each, instead of SHAPES")
args = ap.parse_args()
sys.path.insert(0, str(Path(args.root).resolve() / "scripts"))
import bench_attention as BA  # noqa: E402  (puts that checkout's root first on sys.path)

SHAPES = [(128, 1024, True), (128, 1024, False), (64, 1024, True), (64, 1024, False), (64, 2048, True),
          (64, 2048, False)]  # (head dim, tokens, causal)
if args.shapes:
    SHAPES = [(int(d), int(n), bool(int(c))) for d, n, c in (s.split(":") for s in args.shapes)]

for d, n, causal in SHAPES:
    rows = BA.bench_point(["ours", "sdpa_cudnn"], 16384 // n, 2048 // d, n, d, causal, ["fwd", "fwdbwd"], False,
                          args.rep, args.rounds, graphed=True)
    for row in rows:
        print(json.dumps(dict(tag=args.tag, **{k: row.get(k) for k in (
            "provider", "hdim", "seqlen", "causal", "fwd_ms", "fwdbwd_ms", "fwd_graphed_ms", "fwdbwd_graphed_ms",
            "rounds_ms")})), flush=True)
