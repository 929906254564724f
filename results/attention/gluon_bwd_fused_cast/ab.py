"""Session 41's backward experiment (README.md here): dQ cast in the kernel (`_bwd_dq_writer`'s FUSED_CAST: the last
key block to add into a query tile's float32 dQ, by a per-tile counter, casts the tile into dq) against the shipped
cast, a pass over the whole float32 buffer after the kernel (`torch.mul(dqa, scale, out=dq)`), head dim 64.

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
from ab_common import eager_and_graphed, launch_with, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402


def fused(on: bool, fn, mode: int | None = None):
    """fn with the fused cast on or off; mode: the experiment's CAST_MODE (the kernel's default if None)."""
    if on and mode is not None:
        fn = launch_with(fn, (G._bwd_split_kernel,), {"CAST_MODE": mode})
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


def check(mode=None):
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
            got = fused(True, lambda: bwd(programs), mode)()
            worst = max(worst, (got[0].float() - ref[0].float()).abs().max().item() / scale_dq)
            same_kv &= torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
        ok = same_kv and worst < 1e-2
        bad += not ok
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, dropout=p, programs=programs, packed=packed,
                              dq_rel_diff=round(worst, 6), dkdv_identical=same_kv, ok=ok)), flush=True)
    print("all ok" if bad == 0 else f"{bad} cases FAILED", flush=True)


def parts():
    """Which piece costs (timing only: the variants but "full" leave dq unwritten): the shipped form; "alloc", the
    fused kernel's shared memory allocated and nothing else (no cast pass either); "count", the reduces completed and
    counted, no cast; "full"."""
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; head dim 64, bf16", flush=True)
    for b, n, h, causal, p in [(16, 1024, 12, True, 0.0), (4, 4096, 32, False, 0.0)]:
        bwd = inputs(b, n, h, causal, p)
        run = lambda: bwd()  # noqa: E731
        forms = {"shipped": fused(False, run)}
        for name, k in (("count_only", 3), ("full", 0), ("generic", 6)):
            forms[name] = fused(True, run, k)
        med, times = eager_and_graphed(forms, ())
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, dropout=p, what="bwd",
                              ms={k_: round(v_, 4) for k_, v_ in med.items()})), flush=True)


def casts():
    """How often each query tile is cast (CAST_MODE 7: each cast adds 1000 to the tile's counter instead)."""
    for b, n, h, causal in [(16, 1024, 12, True), (4, 4096, 32, False), (2, 1024, 4, False)]:
        bwd = inputs(b, n, h, causal, 0.0)
        seen = []
        real = G.launch

        def spy(kernel, grid, args, consts):
            seen.append(args[11])
            real(kernel, grid, args, consts)
        G.launch = spy
        try:
            fused(True, bwd, 7)()
        finally:
            G.launch = real
        torch.cuda.synchronize()
        counts = seen[0].view(b * h, n // 64).cpu()
        tiles = torch.arange(n // 64)
        need = (tiles * 64 + 63) // 128 + 1 if causal else torch.full_like(tiles, n // 128)
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal,
                              counts_equal_need=bool(((counts % 1000) == need).all()),
                              casts_per_tile=torch.bincount((counts // 1000).flatten()).tolist())), flush=True)


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
    {"check": check, "bench": bench, "parts": parts, "casts": casts}[sys.argv[1]](*map(int, sys.argv[2:]))
