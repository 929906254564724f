"""Is head dim 128's non-causal backward gap to cuDNN (forward+backward 0.98x at 2K-8K, ../seven_rounds/) the last
wave of its grid?

`_bwd_kernel` at head dim 128 runs one 128-key block a program, all of equal work when non-causal. The table's shapes
(16K tokens, 16 heads) give 16K x 16 / 128 = 2048 programs at every length: 15.5 waves on the H100's 132 SMs, so the
16th wave runs with 68 SMs busy and 64 idle, ~3% of the time. With 33 heads' worth of (batch x heads) a length gives
2112 programs, 16 waves exactly: 3.1% more work in the same number of waves.

Prediction if the last wave is the gap: ours at 2112 programs gains ~3% TFLOP/s over 2048, cuDNN (if its work units
fill the waves differently) less, and the ratio reaches >= 1.0. If cuDNN gains as much, its units are quantised the
same way and the gap is elsewhere.

    python results/attention/bwd_waves/waves.py   # one H100, ~2 minutes; FLASH_AUTOTUNE=0 (Gluon kernels only)
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import torch  # noqa: E402
from bench_attention import bench_point  # noqa: E402

# (batch, heads, seqlen): programs = batch x heads x seqlen / 128
SHAPES = [(8, 16, 2048), (4, 33, 2048), (8, 17, 2048),
          (4, 16, 4096), (2, 33, 4096),
          (2, 16, 8192), (1, 33, 8192)]


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; SMs "
          f"{torch.cuda.get_device_properties(0).multi_processor_count}", flush=True)
    for b, h, n in SHAPES:
        rows = bench_point(["ours", "sdpa_cudnn"], b, h, n, 128, False, ["fwd", "fwdbwd"], False, 30, 5)
        ours, cudnn = rows
        out = dict(batch=b, heads=h, seqlen=n, programs=b * h * n // 128)
        for m in ("fwd", "fwdbwd"):
            out[f"{m}_tflops"] = {"ours": round(ours[f"{m}_tflops"], 1), "cudnn": round(cudnn[f"{m}_tflops"], 1)}
            out[f"{m}_vs_cudnn"] = round(cudnn[f"{m}_ms"] / ours[f"{m}_ms"], 3)
        bwd = {p: r["fwdbwd_ms"] - r["fwd_ms"] for p, r in (("ours", ours), ("cudnn", cudnn))}
        out["bwd_ms"] = {p: round(t, 4) for p, t in bwd.items()}
        out["bwd_vs_cudnn"] = round(bwd["cudnn"] / bwd["ours"], 3)
        out["rounds_ms"] = {"ours": ours["rounds_ms"], "cudnn": cudnn["rounds_ms"]}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
