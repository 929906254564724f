"""Session 45's backward experiment (README.md here): `_bwd_kernel` (head dims 128 and 256) with its Q/dO ring refilled
sooner. ncu of head dim 256's backward at 4K (../hd256_profile/) put 31% of all stall samples on the compute warps'
wait for Q_i and dO_i: there the ring has one slot, so each tile's loads start only once the last tile is done.
- STATS_AHEAD (`_bwd_loader`, both backward kernels): tile i + 1's LSE and delta loaded before the wait for tile
  i's slot. Without it they are loaded after the wait, the two loads one after the other (each waited for by its
  store, in the sm_90 SASS), and only then are Q_i's and dO_i's TMA loads issued;
- EARLY_RELEASE (`_bwd_tile`): the slot released once dV's and dK's wgmma (the last readers of Q_i and dO_i) are done,
  while dQ's still runs, instead of after it.
The arithmetic is unchanged: every form's dK, dV must be bit-identical to the shipped form's (dQ is summed by TMA
reduces in a varying order, so it is held to the float64 reference only).

    python results/attention/gluon_bwd_early_release/ab.py compile   # sm_90 registers / spills, hd 256 / 128 (CPU)
    python results/attention/gluon_bwd_early_release/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_bwd_early_release/ab.py bench     # GPU: every form and cuDNN's backward
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


def forms(head_dim: int) -> dict:
    """name -> the backward kernel's constexprs. Each form names every flag, so the launcher's own choice
    (BWD_STATS_AHEAD_HEAD_DIMS, ...) does not leak in. At head dim 64 (`_bwd_split_kernel`, whose ring has three
    slots) only STATS_AHEAD. The DQ_ATOMIC forms (`atomic`, `atomic_N`) ran at 385180e, whose kernel still had the
    flag: `git show 385180e:results/attention/gluon_bwd_early_release/ab.py`."""
    if head_dim in G.BWD_SPLIT_HEAD_DIMS:
        return {"shipped": dict(STATS_AHEAD=False), "stats_ahead": dict(STATS_AHEAD=True)}
    off = dict(STATS_AHEAD=False, EARLY_RELEASE=False)
    return {"shipped": off, "stats_ahead": dict(off, STATS_AHEAD=True), "early_release": dict(off, EARLY_RELEASE=True),
            "both": dict(STATS_AHEAD=True, EARLY_RELEASE=True)}


def backwards(head_dim: int) -> dict:
    kernel = G._bwd_split_kernel if head_dim in G.BWD_SPLIT_HEAD_DIMS else G._bwd_kernel
    return {name: launch_with(G.gluon_backward, (kernel,), flags) for name, flags in forms(head_dim).items()}


def compile_report(head_dims):
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R
    from triton.experimental.gluon import language as gl

    for head_dim, causal in itertools.product([d for d in head_dims if d not in G.BWD_SPLIT_HEAD_DIMS], (False, True)):
        block_m, block_n, stages, dq_stages = G.BWD_TILES[head_dim]
        lay = G.bwd_layouts(head_dim, gl.bfloat16, False)
        desc = lambda r, l, t="bf16": R.tensordesc(t, [r, head_dim], lay[l])  # noqa: E731
        types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                     **{n: desc(block_n, "kv_layout") for n in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
                     dqa_desc=desc(block_m, "dqa_layout", "fp32"))
        for name, flags in forms(head_dim).items():
            consts = dict(dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
                               DQ_STAGES=dq_stages, IS_CAUSAL=causal, WARPS=G.BWD_WARPS, ds_layout=lay["ds_layout"],
                               STATS_AT_USE=head_dim in G.BWD_STATS_AT_USE_HEAD_DIMS), **flags)
            r = R.resources(G._bwd_kernel, consts, G.BWD_WARPS, consts["STAGES"], sass=True, types=types)
            print(f"head dim {head_dim} causal {causal:d} {name:14s}: {r['regs']} registers, {r['stack']} bytes of "
                  f"spill stack, {r['smem']} bytes of shared memory, static SASS {sum(r['ops'].values())}, LDL "
                  f"{r['ops'].get('LDL', 0)} STL {r['ops'].get('STL', 0)} REDG {r['ops'].get('REDG', 0)}"
                  + ("" if r["smem"] <= R.H100_SMEM_PER_BLOCK else " (does not fit an H100 block)"), flush=True)



def check(head_dims, only_shipped=False):
    """512 and 1K tokens, both masks, the default grid and 7 programs (each then runs many key blocks, so the ring
    runs on across them): errors against float64 within 2x the shipped form's, dK and dV bit-identical to its.
    only_shipped: the launcher's own kernel alone at 1K (at head dim 64 `_bwd_split_kernel`), against float64."""
    bad = 0
    cases = itertools.product(head_dims, (1024,) if only_shipped else (512, 1024), (False, True), (None, 7))
    for head_dim, seqlen, causal, programs in cases:
        args = _inputs(2, seqlen, 4, causal, head_dim=head_dim)
        ref = _reference(args, causal)
        fns = {"shipped": G.gluon_backward} if only_shipped else backwards(head_dim)
        shipped = run_backward(fns["shipped"], args, causal, programs=programs)
        base = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(shipped, ref)]
        line = []
        for name, fn in fns.items():
            if name == "shipped":
                continue
            grads = run_backward(fn, args, causal, programs=programs)
            err = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
            same = all(torch.equal(a, b) for a, b in zip(grads[1:], shipped[1:]))
            ok = all(e <= 2 * b + 1e-3 for e, b in zip(err, base)) and max(err) < 2e-2 and same
            bad += not ok
            line.append(f"{name} dq/dk/dv {err[0]:.2e} {err[1]:.2e} {err[2]:.2e} dK/dV bit-identical {same} "
                        f"{'ok' if ok else 'BAD'}")
        if only_shipped:
            ok = max(base) < 2e-2
            bad += not ok
            line.append("ok" if ok else "BAD")
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d} programs {programs}: shipped "
              f"{base[0]:.2e} {base[1]:.2e} {base[2]:.2e}; " + "; ".join(line), flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(head_dims, seqlens, rounds):
    """The backward alone, every form and cuDNN's, in alternating rounds (the order flips each round); 16K tokens a
    batch, heads x head dim = 2048."""
    print(f"backward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, heads x head dim 2048, bf16")
    for head_dim, seqlen, causal in itertools.product(head_dims, seqlens, (False, True)):
        args = _inputs(16384 // seqlen, seqlen, 2048 // head_dim, causal, head_dim=head_dim)
        fns = {name: (lambda fn=fn: run_backward(fn, args, causal)) for name, fn in backwards(head_dim).items()}
        fns["cudnn"] = cudnn_backward(*args[:4], causal)
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d}: {alternating_rounds(fns, rounds)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[256, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only-shipped", action="store_true", help="check: the launcher's own kernel alone")
    a = ap.parse_args()
    {"compile": lambda: compile_report(a.head_dims), "check": lambda: check(a.head_dims, a.only_shipped),
     "bench": lambda: bench(a.head_dims, a.seqlens, a.rounds)}[a.mode]()


if __name__ == "__main__":
    main()
