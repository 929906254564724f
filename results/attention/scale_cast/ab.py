"""The Gluon backward's dQ cast (float32 sum times the softmax scale, into dq's dtype): `kernels.flash.scale_cast`
against `torch.mul(dqa, scale, out=dq)`, which it replaced. Per shape: both casts' bits equal, the cast alone timed
(do_bench, 7 alternating rounds, median) with its bandwidth, and the Gluon backward alone with either cast (eager
and graphed, 3 rounds).

    python results/attention/scale_cast/ab.py      # GPU
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402
import triton.testing  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402


def torch_cast(src, scale, out):
    torch.mul(src, scale, out=out)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; bf16", flush=True)
    for b, n, h, d, causal, packed in [(16, 1024, 12, 64, True, True), (16, 1024, 12, 64, True, False),
                                       (4, 4096, 32, 64, False, False), (4, 4096, 16, 128, False, False)]:
        src = torch.randn(b, n, h, d, device="cuda") * 10
        out = (torch.empty(b, n, 3, h, d, device="cuda", dtype=torch.bfloat16)[:, :, 0] if packed
               else torch.empty(b, n, h, d, device="cuda", dtype=torch.bfloat16))
        ref = torch.empty_like(out)
        torch_cast(src, 0.125, ref)
        F.scale_cast(src, 0.125, out)
        equal = torch.equal(out, ref)
        times = {"torch_mul": [], "scale_cast": []}
        for r in range(7):
            for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
                fn = torch_cast if name == "torch_mul" else F.scale_cast
                times[name].append(triton.testing.do_bench(lambda: fn(src, 0.125, out), rep=50))
        med = {k: statistics.median(v) for k, v in times.items()}
        gbytes = src.numel() * (4 + 2) / 1e9
        row = dict(batch=b, seqlen=n, heads=h, head_dim=d, packed=packed, bits_equal=equal,
                   cast_ms={k: round(v, 4) for k, v in med.items()},
                   cast_tb_s={k: round(gbytes / v, 2) for k, v in med.items()})
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        o, lse, seed = F._flash_fwd(q, k, v, d ** -0.5, causal, 0.0, False, None, None, n, n)
        bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, d ** -0.5, causal, 0.0, False, None, None,  # noqa: E731
                                   n, n)
        bmed, _ = eager_and_graphed({"torch_mul": with_setting(G, "scale_cast", torch_cast, bwd),
                                     "scale_cast": bwd}, ())
        row["bwd_ms"] = {k_: round(v_, 4) for k_, v_ in bmed.items()}
        row["bwd_scale_cast_vs_torch_mul"] = {m: round(bmed[f"torch_mul_{m}"] / bmed[f"scale_cast_{m}"], 3)
                                              for m in ("eager", "graphed")}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
