"""Session 37's experiment (README.md here): `_bwd_kernel` (kernels/flash_gluon.py; head dims 128 and 256) with
STATS_AT_USE, LSE_i and delta_i read from shared memory where each is used (LSE before the exponentials, delta
after dP^T's wait) instead of at the tile's start. Compiled for sm_90, head dim 128's spill stack drops from 56 bytes
to 16 (32 causal); ncu put 13x cuDNN's local-memory loads on the shipped kernel (../gluon_bwd_profile/README.md).

    python results/attention/gluon_bwd_stats_at_use/ab.py compile   # sm_90 registers / spills, both forms (CPU)
    python results/attention/gluon_bwd_stats_at_use/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_bwd_stats_at_use/ab.py bench     # GPU: against the shipped form and cuDNN
"""
import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# ab_common puts the checkout on sys.path
from ab_common import alternating_rounds, cudnn_backward, launch_with, run_backward  # noqa: E402

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_pp64"))
from pp64_bwd import _inputs, _reference  # noqa: E402  (inputs and the float64 reference are pp64's)

# G.gluon_backward with `_bwd_kernel` launched with STATS_AT_USE off ("shipped": the form shipped when this
# experiment ran) and on, whatever the shipped choice (G.BWD_STATS_AT_USE_HEAD_DIMS, which since has head dim 128)
shipped_backward = launch_with(G.gluon_backward, (G._bwd_kernel,), dict(STATS_AT_USE=False))
stats_at_use_backward = launch_with(G.gluon_backward, (G._bwd_kernel,), dict(STATS_AT_USE=True))


def compile_report():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R
    from triton.experimental.gluon import language as gl

    for head_dim, causal, at_use in itertools.product((128, 256), (False, True), (False, True)):
        block_m, block_n, stages, dq_stages = G.BWD_TILES[head_dim]
        lay = G.bwd_layouts(head_dim, gl.bfloat16, False)
        desc = lambda r, l, t="bf16": R.tensordesc(t, [r, head_dim], lay[l])  # noqa: E731
        types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                     **{n: desc(block_n, "kv_layout") for n in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
                     dqa_desc=desc(block_m, "dqa_layout", "fp32"))
        consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                      IS_CAUSAL=causal, WARPS=G.BWD_WARPS, ds_layout=lay["ds_layout"], STATS_AT_USE=at_use)
        r = R.resources(G._bwd_kernel, consts, G.BWD_WARPS, stages, sass=True, types=types)
        print(f"head dim {head_dim} causal {causal:d} STATS_AT_USE {at_use:d}: {r['regs']} registers, {r['stack']} "
              f"bytes of spill stack, {r['smem']} bytes of shared memory, LDL {r['ops'].get('LDL', 0)} STL "
              f"{r['ops'].get('STL', 0)} (static)", flush=True)



def check():
    """Head dims 128 and 256, 512 and 1K tokens, both masks, the default grid and 7 programs: errors against float64
    within 2x the shipped form's, and dK, dV bit-identical to its (the same operations in the same order)."""
    bad = 0
    for head_dim, seqlen, causal, programs in itertools.product((128, 256), (512, 1024), (False, True), (None, 7)):
        args = _inputs(2, seqlen, 4, causal, head_dim=head_dim)
        ref = _reference(args, causal)
        shipped = run_backward(shipped_backward, args, causal, programs=programs)
        grads = run_backward(stats_at_use_backward, args, causal, programs=programs)
        err = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
        base = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(shipped, ref)]
        same = all(torch.equal(a, b) for a, b in zip(grads[1:], shipped[1:]))
        ok = all(e <= 2 * b + 1e-3 for e, b in zip(err, base)) and max(err) < 2e-2 and same
        bad += not ok
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d} programs {programs}: rel err dq/dk/dv "
              f"{err[0]:.2e} {err[1]:.2e} {err[2]:.2e} (shipped {base[0]:.2e} {base[1]:.2e} {base[2]:.2e}); dK/dV "
              f"bit-identical to the shipped form's: {same}; {'ok' if ok else 'BAD'}", flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(head_dims, seqlens, rounds):
    """The backward alone, shipped form, STATS_AT_USE and cuDNN's, in alternating rounds (the order flips each
    round); 16K tokens a batch, heads x head dim = 2048."""
    print(f"backward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, heads x head dim 2048, bf16")
    for head_dim, seqlen, causal in itertools.product(head_dims, seqlens, (False, True)):
        args = _inputs(16384 // seqlen, seqlen, 2048 // head_dim, causal, head_dim=head_dim)
        fns = {"shipped": lambda: run_backward(shipped_backward, args, causal),
               "at_use": lambda: run_backward(stats_at_use_backward, args, causal),
               "cudnn": cudnn_backward(*args[:4], causal)}
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d}: {alternating_rounds(fns, rounds)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    {"compile": compile_report, "check": check, "bench": lambda: bench(a.head_dims, a.seqlens, a.rounds)}[a.mode]()
