"""Session 41's backward experiment (README.md here): dQ cast in the kernel (`_bwd_split_kernel`'s FUSED_CAST: the key
block whose reduce completes a query tile's float32 dQ, by a per-tile counter, has the tile cast into dq) against the
shipped cast, a pass over the whole float32 buffer after the kernel (`torch.mul(dqa, scale, out=dq)`), head dim 64.
This file drives the last form, whose kernel is at 8704afa (the shipped kernels/flash_gluon.py has no FUSED_CAST):
run it from a checkout of that commit. The earlier forms, and the `parts` and `casts` modes, are in this file at the
commits README.md names.

    python results/attention/gluon_bwd_fused_cast/ab.py check    # GPU (sm_90): every case, "all ok" at the end
    python results/attention/gluon_bwd_fused_cast/ab.py bench    # the backward alone, eager and graphed

check: per case, the fused form against the shipped one from the same forward: dK and dV bit-identical, dQ within
the float32 sum's reordering (a lost or doubled key block's share would be ~1/key blocks of dQ's scale), ten
repeats a case so that a race between the counter and the reduces has chances to show; the cases cover the default
grid and 7 programs (each then runs many key blocks, so a tile's count spans the deferred last reduce), causal and
not, dropout 0.1 and 0, and dq as a view of one packed dqkv (rows 3 * heads * 64 apart).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402


def fused(on: bool, fn):
    """fn with the fused cast on or off."""
    return with_setting(G, "BWD_FUSED_CAST_HEAD_DIMS", (64,) if on else (), fn)


def inputs(b, n, h, causal, p, packed=False):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    scale = 64 ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()

    def bwd(programs=None):
        if packed:
            dqkv = torch.empty(b, n, 3, h, 64, device="cuda", dtype=torch.bfloat16)
            dq, dk, dv = dqkv.unbind(2)
        else:
            dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        G.gluon_backward(do, q, k, v, lse, delta, dq, dk, dv, scale, causal, programs=programs, dropout_p=p,
                         seed=seed if p > 0 else None)
        return dq, dk, dv
    return bwd


def check():
    bad = 0
    for b, n, h, causal, p, programs, packed in [
            (2, 1024, 4, False, 0.0, None, False), (2, 1024, 4, True, 0.0, None, False),
            (2, 1024, 4, False, 0.0, 7, False), (2, 1024, 4, True, 0.0, 7, False),
            (1, 2048, 3, True, 0.1, 7, False), (2, 1024, 4, False, 0.1, None, True),
            (16, 1024, 12, True, 0.1, None, False), (16, 1024, 12, True, 0.0, None, True),
            (4, 4096, 32, False, 0.0, None, False), (1, 4096, 2, True, 0.0, 1, False)]:
        bwd = inputs(b, n, h, causal, p, packed)
        ref = fused(False, lambda: bwd(programs))()
        scale_dq = ref[0].float().abs().max().item()
        worst, same_kv = 0.0, True
        for _ in range(10):
            got = fused(True, lambda: bwd(programs))()
            worst = max(worst, (got[0].float() - ref[0].float()).abs().max().item() / scale_dq)
            same_kv &= torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
        ok = same_kv and worst < 1e-2
        bad += not ok
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, dropout=p, programs=programs, packed=packed,
                              dq_rel_diff=round(worst, 6), dkdv_identical=same_kv, ok=ok)), flush=True)
    print("all ok" if bad == 0 else f"{bad} cases FAILED", flush=True)


def bench():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; head dim 64, bf16", flush=True)
    for b, n, h, causal, p in [(16, 1024, 12, True, 0.0), (16, 1024, 12, True, 0.1), (16, 1024, 32, False, 0.0),
                               (8, 2048, 32, True, 0.0), (4, 4096, 32, True, 0.0), (4, 4096, 32, False, 0.0),
                               (4, 4096, 32, False, 0.1), (1, 16384, 32, False, 0.0), (1, 16384, 32, True, 0.0)]:
        bwd = inputs(b, n, h, causal, p)
        med, times = eager_and_graphed({"shipped": fused(False, bwd), "fused": fused(True, bwd)}, ())
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, dropout=p, what="bwd",
                              ms={k_: round(v_, 4) for k_, v_ in med.items()},
                              fused_vs_shipped={m: round(med[f"shipped_{m}"] / med[f"fused_{m}"], 3)
                                                for m in ("eager", "graphed")}, rounds_ms=times)), flush=True)


if __name__ == "__main__":
    {"check": check, "bench": bench}[sys.argv[1]]()
