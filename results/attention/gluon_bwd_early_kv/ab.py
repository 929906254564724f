"""Head dim 128's backward with its K/V buffer released before the dK/dV stores (session 42: prepared, not run).

`_bwd_kernel` at head dim 128 has one K/V buffer (a second does not fit beside the rings: 280 KB). A key block ends
by storing dK and dV through that buffer, waiting for the stores, and only then releasing it. So the next block's
K/V load, and the loader's Q/dO loads behind it, wait for the stores. By the fit in ../bwd_waves/, a block's fixed
cost is ~4 query tiles' time. EARLY_KV (`_bwd_dkdv_via_dq_ring`) stages dK and dV through the float32 dQ ring instead.
Its two 32 KB slots hold the two 16-bit tiles once the dQ warp has drained them. The K/V buffer is released first, so
the next block's loads run beside the stores. That pays on a persistent grid (one program a SM over many blocks),
which alone measured 0.97-1.07x (../gluon_bwd_persistent/).

Prediction: persistent + EARLY_KV at 1.01-1.03x the shipped launch from 2K, non-causal and causal, most at 2K-4K
(fewer query tiles a block). The machine's spread at one point is up to 3% (../bwd_tail_split/), so this runs 7
rounds, graphed as well as eager.

    FLASH_AUTOTUNE=0 python results/attention/gluon_bwd_early_kv/ab.py   # one H100, ~4 minutes
    python results/attention/gluon_bwd_early_kv/ab.py compile          # CPU: sm_90 registers, spill, shared memory

Checks: dK and dV of every form bit-identical to the shipped launch's (the same arithmetic per key block), dQ within
2^-7 of its largest element (its TMA reduce's order), gradients starting as NaN.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, launch_with  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_pp64"))
from pp64_bwd import _inputs  # noqa: E402  (q, k, v, dO, LSE, delta and the scale, as pp64's)

HEADS, D = 16, 128


def compile_report():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R
    from triton.experimental.gluon import language as gl

    lay = G.bwd_layouts(D, gl.bfloat16, False)
    desc = lambda r, name, t="bf16": R.tensordesc(t, [r, D], lay[name])  # noqa: E731
    types = dict(q_desc=desc(64, "q_layout"), do_desc=desc(64, "q_layout"), k_desc=desc(128, "kv_layout"),
                 v_desc=desc(128, "kv_layout"), dk_desc=desc(128, "dkv_layout"), dv_desc=desc(128, "dkv_layout"),
                 dqa_desc=desc(64, "dqa_layout", "fp32"))
    bm, bn, st, dqs = G.BWD_TILES[D]
    for causal in (False, True):
        for early in (False, True):
            consts = dict(HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, DQ_STAGES=dqs, IS_CAUSAL=causal,
                          ds_layout=lay["ds_layout"], WARPS=G.BWD_WARPS, STATS_AT_USE=True, EARLY_KV=early)
            r = R.resources(G._bwd_kernel, consts, G.BWD_WARPS, st, sass=True, types=types)
            print(json.dumps(dict(causal=causal, early_kv=early, regs=r["regs"], stack=r["stack"], smem=r["smem"],
                                  sass=sum(r["ops"].values()))), flush=True)


def main():
    sms = G._sm_count(0)
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; {sms} SMs; head dim {D}, {HEADS} heads, bf16",
          flush=True)
    failed = 0
    for causal in (False, True):
        for b, n in [(16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]:
            q, k, v, do, lse, delta, scale = _inputs(b, n, HEADS, causal, head_dim=D)
            grads = [torch.empty_like(q) for _ in range(3)]

            def bwd(programs):
                return lambda: G.gluon_backward(do, q, k, v, lse, delta, *grads, scale, causal, programs=programs)

            forms = {"shipped": bwd(None), "persistent": bwd(sms),
                     "early_kv": launch_with(bwd(sms), [G._bwd_kernel], {"EARLY_KV": True})}
            out = {}
            for name, fn in forms.items():
                for g in grads:
                    g.fill_(float("nan"))
                fn()
                out[name] = [g.clone() for g in grads]
            checks = {}
            for name in ("persistent", "early_kv"):
                same = all(torch.equal(a, c) for a, c in zip(out[name][1:], out["shipped"][1:]))
                dq_err = ((out[name][0].float() - out["shipped"][0].float()).abs().max()
                          / out["shipped"][0].float().abs().max()).item()
                checks[name] = dict(dkdv_bitwise=same, dq_rel_err=round(dq_err, 5))
                failed += (not same) or not dq_err <= 2 ** -7
            med, times = eager_and_graphed(forms, (), rounds=7)
            print(json.dumps(dict(batch=b, seqlen=n, causal=causal, checks=checks,
                                  ms={k_: round(v_, 4) for k_, v_ in med.items()},
                                  vs_shipped={f"{f}_{m}": round(med[f"shipped_{m}"] / med[f"{f}_{m}"], 3)
                                              for f in ("persistent", "early_kv") for m in ("eager", "graphed")},
                                  rounds_ms=times)), flush=True)
    print(f"ab: {failed} check(s) failed", flush=True)


if __name__ == "__main__":
    compile_report() if sys.argv[1:] == ["compile"] else main()
