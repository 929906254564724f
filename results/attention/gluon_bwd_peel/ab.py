"""Session 39's backward experiment (README.md here): PEEL_DIAG in `_bwd_kernel` (head dims 128, 256) and
`_bwd_split_kernel` (head dim 64). Under a causal mask each key block's loop over query tiles tests, tile by tile,
whether the tile crosses the diagonal: a runtime branch in the loop, which ptxas does not schedule across. With
PEEL_DIAG the diagonal's query tiles (BLOCK_N / BLOCK_M of them) run in a loop of their own and the rest in a loop
with no mask at compile time; off, the PTX is the shipped kernel's (debug labels aside). The forward's same change
gained 1.02-1.05x (../gluon_fwd_turns/README.md, fourth step). Measured 0.97-1.03x, not kept: the kernel with
PEEL_DIAG is at 14104ed, where this script runs (`git checkout 14104ed -- kernels/flash_gluon.py`).

    python results/attention/gluon_bwd_peel/ab.py compile   # sm_90 registers / spills / SASS, both forms (CPU)
    python results/attention/gluon_bwd_peel/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_bwd_peel/ab.py bench     # GPU: the causal backward alone, both forms and cuDNN's
"""
import argparse
import importlib.util
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gluon_bwd_pp64"))
from pp64_bwd import _inputs, _reference  # noqa: E402  (inputs and the float64 reference are pp64's)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


alternating_rounds = _load(HERE.parent / "gluon_bwd_stats_at_use" / "ab.py", "stats_at_use_ab").alternating_rounds


def backward_with(peel: bool):
    """G.gluon_backward (same arguments) with its backward kernel launched with PEEL_DIAG=peel."""
    def backward(*args, **kw) -> None:
        real = G.launch

        def launch(kernel, grid, launch_args, consts):
            bwd = kernel is G._bwd_kernel or kernel is G._bwd_split_kernel
            real(kernel, grid, launch_args, dict(consts, PEEL_DIAG=peel) if bwd else consts)

        G.launch = launch
        try:
            G.gluon_backward(*args, **kw)
        finally:
            G.launch = real
    return backward


FORMS = {"shipped": backward_with(False), "peel": backward_with(True)}


def _run(fn, args, causal, **kw):
    q, k, v, do, lse, delta, scale = args
    grads = [torch.full_like(q, float("nan")) for _ in range(3)]
    fn(do, q, k, v, lse, delta, *grads, scale, causal, **kw)
    return grads


def compile_report():
    sys.path.insert(0, str(HERE.parents[2] / "scripts"))
    import kernel_resources as R
    from triton.experimental.gluon import language as gl

    for head_dim, causal, peel in itertools.product((64, 128, 256), (False, True), (False, True)):
        if peel and not causal:
            continue
        block_m, block_n, stages, dq_stages = G.BWD_TILES[head_dim]
        split = head_dim in G.BWD_SPLIT_HEAD_DIMS
        lay = G.bwd_layouts(head_dim, gl.bfloat16, split)
        desc = lambda r, l, t="bf16": R.tensordesc(t, [r, head_dim], lay[l])  # noqa: E731
        dkv = block_n // 2 if split else block_n
        types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                     k_desc=desc(block_n, "kv_layout"), v_desc=desc(block_n, "kv_layout"),
                     dk_desc=desc(dkv, "dkv_layout"), dv_desc=desc(dkv, "dkv_layout"),
                     dqa_desc=desc(block_m, "dqa_layout", "fp32"))
        consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                      IS_CAUSAL=causal, ds_layout=lay["ds_layout"], PEEL_DIAG=peel)
        if split:
            consts.update(KV_BUFFERS=G.BWD_SPLIT_KV_BUFFERS, PAIRED=causal, CONSUMER_REGS=G.CONSUMER_REGS)
        else:
            consts.update(WARPS=G.BWD_WARPS, STATS_AT_USE=head_dim in G.BWD_STATS_AT_USE_HEAD_DIMS)
        kernel, warps = (G._bwd_split_kernel, 4) if split else (G._bwd_kernel, G.BWD_WARPS)
        r = R.resources(kernel, consts, warps, stages, sass=True, types=types)
        ops = r["ops"]
        print(f"head dim {head_dim} causal {causal:d} PEEL_DIAG {peel:d}: {r['regs']} registers, {r['stack']} bytes of "
              f"spill stack; static SASS {sum(ops.values())} instructions, MUFU {ops.get('MUFU', 0)} BRA "
              f"{ops.get('BRA', 0)} LDL {ops.get('LDL', 0)} STL {ops.get('STL', 0)}", flush=True)


def check(head_dims=(64, 128, 256)):
    """Causal, 1K and 2K tokens, the default grid and 7 programs (each then runs many key blocks): errors against
    float64 within 2x the shipped form's, and dK, dV bit-identical to its (the same operations in the same order;
    dQ's TMA reduce sums in no fixed order)."""
    bad = 0
    for head_dim, seqlen, programs in itertools.product(head_dims, (1024, 2048), (None, 7)):
        args = _inputs(2, seqlen, 4, True, head_dim=head_dim)
        ref = _reference(args, True)
        shipped = _run(FORMS["shipped"], args, True, programs=programs)
        grads = _run(FORMS["peel"], args, True, programs=programs)
        err = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
        base = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(shipped, ref)]
        same = all(torch.equal(a, b) for a, b in zip(grads[1:], shipped[1:]))
        ok = all(e <= 2 * b + 1e-3 for e, b in zip(err, base)) and max(err) < 2e-2 and same
        bad += not ok
        print(f"head dim {head_dim} seqlen {seqlen} programs {programs}: rel err dq/dk/dv {err[0]:.2e} {err[1]:.2e} "
              f"{err[2]:.2e} (shipped {base[0]:.2e} {base[1]:.2e} {base[2]:.2e}); dK/dV bit-identical: {same}; "
              f"{'ok' if ok else 'BAD'}", flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(head_dims, seqlens, rounds):
    """The causal backward alone, both forms and cuDNN's, in alternating rounds (the order flips each round); 16K
    tokens a batch (at least one sequence), heads x head dim = 2048."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"causal backward ms, median of {rounds} alternating rounds of do_bench; heads x head dim 2048, bf16")
    for head_dim, seqlen in itertools.product(head_dims, seqlens):
        args = _inputs(max(1, 16384 // seqlen), seqlen, 2048 // head_dim, True, head_dim=head_dim)
        q, k, v, do, *_ = args
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        dot = do.transpose(1, 2)
        fns = {name: (lambda f=f: _run(f, args, True)) for name, f in FORMS.items()}
        fns["cudnn"] = lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)
        print(f"head dim {head_dim} seqlen {seqlen}: {alternating_rounds(fns, rounds)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    {"compile": compile_report, "check": lambda: check(a.head_dims),
     "bench": lambda: bench(a.head_dims, a.seqlens, a.rounds)}[a.mode]()
