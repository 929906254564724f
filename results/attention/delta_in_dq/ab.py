"""Our attention's forward+backward at the model shapes (bench_attention.py's GPT-2 small and BERT-large, dropout 0 and
0.1), eager and replayed from a CUDA graph: one JSON line per point, for the delta_in_dq A/B (device.sh runs it with
and without the patch, alternating).

    python results/attention/delta_in_dq/ab.py --tag before
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import bench_attention as BA  # noqa: E402  (puts the repo root on sys.path)

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args()
    for shape_name, shape in BA.MODEL_SHAPES.items():
        lengths = BA.bert_lengths(shape["b"]) if shape["varlen"] else torch.full((shape["b"],), shape["n"])
        for p in (0.0, 0.1):
            fn, q, k, v, do = BA.model_setup(shape, "ours", p, lengths)
            row = dict(batch=shape["b"], heads=shape["h"], seqlen=shape["n"], hdim=shape["d"], causal=shape["causal"])
            BA.time_modes(fn, q, k, v, do, ["fwdbwd"], args.rep, row, graphed=True)
            print(json.dumps({"tag": args.tag, "shape": shape_name, "dropout": p, "fwdbwd_ms": row["fwdbwd_ms"],
                              "fwdbwd_graphed_ms": row.get("fwdbwd_graphed_ms")}), flush=True)


if __name__ == "__main__":
    main()
