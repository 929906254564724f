"""Session 39's forward experiment (README.md here): the consumers' turns passed through two hardware named
barriers (NAMED_TURNS: `bar.sync` to wait, `bar.arrive` to pass, 256 threads, ids 14 and 15) instead of two
mbarriers. ncu of the causal 2K forward (../gluon_bwd_profile/README.md, session 39's section) put ~1,500 barrier
stall samples on the turn's pass: a warpgroup's mbarrier arrive is one elected thread's after a warpgroup-wide
bar.sync, while a bar.arrive blocks no one (cuDNN passes its turns so). The arithmetic is unchanged, so the outputs
must be bit-identical to the shipped form's. MASK_REL, the second experiment here, tests the diagonal tile's mask
against the tile's own column index (`cols <= rows - start_n`), with fewer integer instructions; bit-identical too.

    python results/attention/gluon_fwd_named/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_fwd_named/ab.py bench     # GPU: every form's forward and cuDNN's
"""
import argparse
import importlib.util
import itertools
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("fwd_turns_ab", HERE.parent / "gluon_fwd_turns" / "ab.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # the forward's A/B helpers: forward_with, _inputs, _run, _reference, alternating_rounds
G = T.G

# the launcher's EXP_TURNS / KEYS_DOWN in each; MASK_REL (the second experiment here): the diagonal tile's mask
# tested against the tile's own column index, 264 / 440 fewer static SASS instructions at head dim 64 / 128 causal
FORMS = {"shipped": {}, "named": dict(NAMED_TURNS=True), "mask_rel": dict(MASK_REL=True),
         "named_mask_rel": dict(NAMED_TURNS=True, MASK_REL=True)}


def check():
    """Head dims 64 and 128, 1K and 2K tokens, both masks, the default grid and 7 programs: every form's O and LSE
    bit-identical to the shipped form's, and its error against float64."""
    bad = 0
    for head_dim, seqlen, causal, programs in itertools.product((64, 128), (1024, 2048), (False, True), (None, 7)):
        q, k, v = T._inputs(2, seqlen, 4, head_dim)
        ref_o, _ = T._reference(q, k, v, causal)
        base_o, base_lse = T._run(T.forward_with(FORMS["shipped"]), q, k, v, causal, programs=programs)
        line = []
        for name, flags in FORMS.items():
            if name == "shipped":
                continue
            o, lse = T._run(T.forward_with(flags), q, k, v, causal, programs=programs)
            err = ((o.double() - ref_o).abs().max() / ref_o.abs().max()).item()
            same = torch.equal(o, base_o) and torch.equal(lse, base_lse)
            bad += not (same and err < 2e-2)
            line.append(f"{name} err {err:.2e} bit-identical {same}")
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d} programs {programs}: " + "; ".join(line),
              flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(head_dims, seqlens, rounds):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"forward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, heads x head dim 2048, bf16")
    for head_dim, causal, seqlen in itertools.product(head_dims, (False, True), seqlens):
        q, k, v = T._inputs(16384 // seqlen, seqlen, 2048 // head_dim, head_dim)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        scale = head_dim ** -0.5 * G.LOG2E

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        fns = {name: (lambda f=T.forward_with(flags): f(q, k, v, o, lse, scale, causal)) for name, flags in FORMS.items()}
        fns["cudnn"] = cudnn
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d}: {T.alternating_rounds(fns, rounds)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    check() if a.mode == "check" else bench(a.head_dims, a.seqlens, a.rounds)
