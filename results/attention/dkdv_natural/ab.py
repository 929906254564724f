"""GPU A/B, prepared in session 29, run in session 31 (ab_h100.txt): the dK/dV kernel in the scores' own
orientation (probe.py's `natural_tile`) against the shipped one, at GPT-2 small's attention shape (16 x 1024, 12
heads of 64, causal) and a BERT-like one (32 x 512, 16 heads of 64, non-causal), dropout 0 and 0.1; and, timing
only, the natural orientation with 8-bit mask values (`natural8`: 16 scores a Philox call, p quantised to 1/256,
a different mask, so no error check).

Both the two-kernel backward (dK/dV kernel, then the dQ kernel) and, with dropout, the one-kernel one (FUSED_DQ: dQ
added through the TMA reduce, the mask drawn once; off at head dim 64 today since it lost 0.92x there,
results/attention/fused_bwd/), whose natural form hands dS to dQ = dS K untransposed. Each variant runs in its own
process (the tile is swapped before anything compiles; Triton keys a kernel's cache
on its source once). Per (shape, dropout, config): the dK/dV kernel's device time (torch.profiler, 20 calls of
`_flash_bwd` on the same O, LSE and delta) and the largest error of dK and dV against float32 attention drawing the
same dropout mask, relative to the largest reference value (and dQ's, which the fused kernel computes). "auto" is the shipped kernel's own autotuned pick (at
GPT-2's shape with dropout (32, 64, 4, 4), results/attention/model_shapes/); the fixed configs are set through
FLASH_AUTOTUNE=0's table.

Prediction, from the sm_90 compile (probe.txt): in the natural orientation the mask needs no move through shared
memory, and 64-128-query tiles compile without spills where the shipped orientation spills; thread-instructions
per score of the dK/dV loop drop from ~73 (shipped pick, 16-bit stream) to ~41 ((128, 64, 8, 2)). If the kernel is
issue-bound with dropout, as its 106 us of dropout cost at GPT-2's shape suggests, the natural (128, 64, 8, 2) or
(64, 64, 8, 2) runs the dK/dV kernel in 0.70-0.85x the shipped pick's time with dropout (289 us in
../gpt2_shape/trace_h100.txt) and 0.85-1.0x without. The fused natural (128, 64, 8, 2) compiles to ~45 thread-
instructions a score for the whole backward against ~106 for the shipped two kernels (probe.txt), but pays the dQ
reduce traffic that cost the fused kernel its 0.92x: 0.85-1.05x the two-kernel backward, too wide a range to bet
on. The errors must match the shipped kernel's (bf16 rounding).

    python results/attention/dkdv_natural/ab.py          # GPU (sm_90), a few minutes
    python results/attention/dkdv_natural/ab.py --dry    # CPU plumbing check under TRITON_INTERPRET=1 (tiny shape)

Measured before the change shipped (session 31; see README.md): there "shipped" is the keys-as-rows form
everywhere. From that commit on, `_dkdv_tile` picks the form by tile shape, so "shipped" here means that.
"""
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = {"gpt2": (16, 1024, 12, 64, True), "bert": (32, 512, 16, 64, False)}
# dK/dV configs per orientation: the shipped one's autotuned pick and its fallback-sized tiles; the natural one's
# tiles that compile to wgmma without spills (probe.txt: 32-query tiles fall back to mma.sync there)
CONFIGS = {"shipped": ["auto", (32, 64, 4, 4), (64, 64, 8, 2)],
           "natural": [(64, 64, 4, 3), (64, 64, 8, 2), (128, 64, 8, 2)]}
# the one-kernel backward (FUSED_DQ: dQ through the TMA reduce, the mask drawn once), dropout only
FUSED_CONFIGS = [(64, 64, 8, 2), (128, 64, 8, 2)]
DQ_FIXED = (64, 64, 4, 3)  # the dQ kernel's autotuned pick at GPT-2's shape, for every fixed-config row
DRY_SHAPES = {"tiny": (2, 64, 2, 64, True)}


def worker(variant: str, dry: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kernels.flash as F
    from kernels.standard import standard_attention

    if variant.startswith("natural"):
        import probe

        F.__dict__["_dkdv_tile"] = probe.natural_tile
        if variant == "natural8":  # timing only: another mask than dropout_keep_mask's, so no error check
            F.__dict__["dropout_keep_tile"] = probe.keep_tile_8bit
    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    for shape_name, (b, n, h, d, causal) in (DRY_SHAPES if dry else SHAPES).items():
        for p in (0.0, 0.1):
            g = torch.Generator(device=device).manual_seed(0)
            q, k, v, do = (torch.randn(b, n, h, d, device=device, dtype=dtype, generator=g) for _ in range(4))
            scale = d ** -0.5
            o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n)
            delta = F.bwd_preprocess(o, do)
            mask = F.dropout_keep_mask(seed, b, h, n, n, p) if p > 0 else None
            qr, kr, vr = (x.detach().float().requires_grad_() for x in (q, k, v))
            ref = standard_attention(qr, kr, vr, dropout_p=p, softmax_scale=scale, causal=causal, dropout_mask=mask)
            dq_ref, dk_ref, dv_ref = torch.autograd.grad(ref, (qr, kr, vr), do.float())

            def bwd():
                return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n,
                                    delta=delta, gluon=False)

            if variant == "natural8" and p == 0:
                continue
            runs = [("two", c) for c in CONFIGS["shipped" if variant == "shipped" else "natural"]]
            runs += [("fused", c) for c in (FUSED_CONFIGS if p > 0 else [])]
            for kind, cfg in runs:
                F.FUSED_DROPOUT_BWD_MAX_D = 64 if kind == "fused" else 0
                if cfg == "auto":
                    if variant != "shipped":
                        continue
                    os.environ.pop("FLASH_AUTOTUNE", None)
                else:
                    os.environ["FLASH_AUTOTUNE"] = "0"
                    F._DEFAULT["fused" if kind == "fused" else "dkdv"] = cfg
                    F._DEFAULT["dq"] = DQ_FIXED
                F.clear_plans()  # kernels/flash.py's plans keep the config they were made with (session 50)
                row = dict(variant=variant, shape=shape_name, dropout=p, config=f"{kind} {cfg}")
                try:
                    dq, dk, dv = bwd()
                    for name, g, r in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
                        row["err_" + name] = (float((g.float() - r).abs().max() / r.abs().max())
                                              if variant != "natural8" else float("nan"))
                    if not dry:
                        for _ in range(5):
                            bwd()
                        torch.cuda.synchronize()
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            for _ in range(20):
                                bwd()
                            torch.cuda.synchronize()
                        per = defaultdict(float)
                        for e in prof.events():
                            if e.device_type == torch.autograd.DeviceType.CUDA:
                                per[e.name] += e.device_time / 20
                        row["dkdv_us"] = per.get("_bwd_dkdv_kernel", float("nan"))  # the fused kernel too
                        row["bwd_us"] = sum(per.values())
                except Exception as e:  # noqa: BLE001  (a config that does not compile or launch: say so, go on)
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                print("ROW " + json.dumps(row), flush=True)


def main():
    dry = "--dry" in sys.argv
    env = dict(os.environ, **({"TRITON_INTERPRET": "1"} if dry else {}))
    rows = []
    # natural8 needs key tiles of 32 or more, which the interpreter's 16 x 16 tiles are not: GPU only
    order = [("shipped", "natural") if dry else ("shipped", "natural", "natural8"), ("natural", "shipped")][:1 if dry else 2]
    for rnd, variants in enumerate(order):
        for variant in variants:
            try:
                res = subprocess.run([sys.executable, __file__, "--worker", variant] + (["--dry"] if dry else []),
                                     capture_output=True, text=True, env=env, timeout=200)
            except subprocess.TimeoutExpired as e:
                res = subprocess.CompletedProcess(e.cmd, 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes)
                                                  else (e.stdout or ""), "timed out after 200 s")
            got = [json.loads(line[4:]) for line in res.stdout.splitlines() if line.startswith("ROW ")]
            if not got:
                print(f"{variant}: no rows\n{res.stderr[-2000:]}", flush=True)
            rows += [dict(r, round=rnd) for r in got]
    if not dry:
        import torch
        import triton
        print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; dK/dV kernel us (torch.profiler, mean of 20 "
              "calls; each cell the smaller of two rounds in alternating process order; natural8 one round); err: max |g - g_ref| / "
              "max |g_ref| against float32 attention with the same mask")
    print("| shape | dropout | variant | backward, config | dK/dV (or fused) kernel us | backward us | err dQ | err dK | "
          "err dV |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    best = {}
    for r in rows:
        key = (r["shape"], r["dropout"], r["variant"], r["config"])
        if key not in best or r.get("dkdv_us", float("inf")) < best[key].get("dkdv_us", float("inf")):
            best[key] = r
    for (shape, p, variant, cfg), r in sorted(best.items()):
        if "error" in r:
            print(f"| {shape} | {p} | {variant} | {cfg} | {r['error'][:90]} | | | | |")
            continue
        print(f"| {shape} | {p} | {variant} | {cfg} | {r.get('dkdv_us', float('nan')):.1f} | "
              f"{r.get('bwd_us', float('nan')):.1f} | {r['err_dq']:.1e} | {r['err_dk']:.1e} | {r['err_dv']:.1e} |")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1], "--dry" in sys.argv)
    else:
        main()
