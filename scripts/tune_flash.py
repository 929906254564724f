"""Which launch config wins for each flash kernel at one shape, measured as GPU time alone.

    python scripts/tune_flash.py                                  # GPT-2 small: B 16, N 1024, H 12, D 64, causal
    python scripts/tune_flash.py --shape 16 512 16 64 --no-causal --dropout 0.1
    python scripts/tune_flash.py --extra dkdv:64,64,4,2 --extra dq:64,64,4,2

For each kernel (forward; dK/dV; dQ) every candidate (BLOCK_M, BLOCK_N, warps, stages) of kernels/flash.py
(plus --extra ones) runs through the real launcher with that config pinned, on q/k/v laid out as the
models make them (views of one (B, N, 3, H, D) projection). Times are medians of
triton.testing.do_bench_cudagraph: the calls are captured in a CUDA graph, so host time (Python, the
launcher, allocation) is left out and only the kernels count. dK/dV is swept with dQ at its fixed
(FLASH_AUTOTUNE=0) config and dQ with dK/dV at the best one found, so each column is the backward's
total with one kernel varied. The autotuner's own picks for this shape are timed the same way for
comparison. Prints a table; --out writes it as <tag>.md and .json with GPU, versions, date, command.
"""
from __future__ import annotations

import argparse
import json
import math
import os

from _common import markdown_header, repo_path, repo_root, require_gpu, run_metadata

repo_root()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=4, default=[16, 1024, 12, 64], metavar=("B", "N", "H", "D"))
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--extra", action="append", default=[], metavar="KIND:M,N,W,S",
                    help="another candidate, KIND one of fwd, dkdv, dq")
    ap.add_argument("--rep", type=int, default=50, help="do_bench_cudagraph repetition time (ms)")
    ap.add_argument("--out", default=None, help="folder for <tag>.md / <tag>.json (default: print only)")
    ap.add_argument("--tag", default=None)
    args = ap.parse_args()
    require_gpu("tune_flash.py")

    import torch
    import triton

    import kernels.flash as fl

    meta = run_metadata()  # before the script pins FLASH_AUTOTUNE itself (the command records FLASH_* settings)
    b, n, h, d = args.shape
    dt = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, n, 3, h, d, device="cuda", dtype=dt, generator=gen)
    q, k, v = qkv.unbind(2)
    do = torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=gen)
    scale = 1.0 / math.sqrt(d)
    p, causal = args.dropout, args.causal
    defaults = fl.fallback_configs(fl._block_d(d))
    candidates = {kind: fl.tuning_shapes(kind, fl._block_d(d)) for kind in ("fwd", "dkdv", "dq")}
    for e in args.extra:
        kind, cfg = e.split(":")
        candidates[kind].append(tuple(int(x) for x in cfg.split(",")))

    def bench(fn):
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=args.rep, return_mode="median")
        except Exception as exc:  # a config that does not compile (shared memory) or launch
            return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"

    # A config is pinned by writing it into the FLASH_AUTOTUNE=0 table of this process (a one-shot script).
    os.environ["FLASH_AUTOTUNE"] = "0"
    pinned = dict(defaults)

    def fwd():  # the two-stage forward, whose pinned config is timed (warp specialisation has its own one)
        return fl._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n, warp_spec=False)

    torch.manual_seed(0)
    o, lse, seed = fwd()
    delta = fl.bwd_preprocess(o, do)

    def bwd():
        return fl._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n, delta=delta)

    rows = []
    for kind, fn in (("fwd", fwd), ("dkdv", bwd), ("dq", bwd)):
        best = None
        for cfg in candidates[kind]:
            defaults[kind] = cfg
            fl.clear_plans()  # a plan keeps the config it was made with
            ms = bench(fn)
            rows.append({"kernel": kind, "config": list(cfg), "ms": ms})
            print(rows[-1], flush=True)
            if isinstance(ms, float) and (best is None or ms < best[1]):
                best = (cfg, ms)
        defaults[kind] = best[0] if best else pinned[kind]
        fl.clear_plans()

    os.environ["FLASH_AUTOTUNE"] = "1"
    fl._TUNED_CONFIGS.clear()
    fl.clear_plans()
    o2, lse2, seed2 = fwd()  # tunes the forward
    fl._flash_bwd(do, q, k, v, o2, lse2, seed2, scale, causal, p, False, None, None, n, n)  # tunes the backward
    picks = {key[0]: [c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]] for key, c in fl._TUNED_CONFIGS.items()}
    auto = {"fwd": bench(fwd), "bwd": bench(bwd)}

    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    title = f"Flash kernel configs at B {b}, N {n}, H {h}, D {d}, {'causal' if causal else 'non-causal'}, dropout {p}"
    lines = markdown_header(title, meta) + [
        "GPU time only (CUDA-graph replays, median). fwd: the forward kernel; dkdv / dq: the backward's two "
        "kernels together (no preprocess), the named kernel at the given config, the other at its fixed or best "
        f"config. Fixed (FLASH_AUTOTUNE=0) configs: {pinned}. Autotuner picks: {picks}; with them fwd "
        f"{_fmt(auto['fwd'])} ms, dkdv+dq {_fmt(auto['bwd'])} ms.", "",
        "| kernel | BLOCK_M, BLOCK_N, warps, stages | ms | TFLOP/s |", "|---|---|---:|---:|"]
    for r in rows:
        work = flops * (1 if r["kernel"] == "fwd" else 2.5)
        tf = f"{work / r['ms'] / 1e9:.0f}" if isinstance(r["ms"], float) else "-"
        lines.append(f"| {r['kernel']} | {', '.join(map(str, r['config']))} | {_fmt(r['ms'])} | {tf} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        out = repo_path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tag = args.tag or f"tune_b{b}_n{n}_h{h}_d{d}{'_causal' if causal else ''}{f'_p{p}' if p else ''}"
        (out / f"{tag}.md").write_text(md)
        (out / f"{tag}.json").write_text(json.dumps({**meta, "rows": rows, "autotune": picks, "auto_ms": auto,
                                                     "fixed": pinned}, indent=1))


def _fmt(ms):
    return f"{ms:.3f}" if isinstance(ms, float) else str(ms)


if __name__ == "__main__":
    main()
