"""Session 40's forward change (README.md here): under KEYS_DOWN, round 0 is always the causal diagonal tile, so its
softmax is masked at compile time instead of behind a runtime test whose other side never ran. This times the
checkout's forward against a baseline kernels/flash_gluon.py (the file as of the commit before the change, written
by `git show` to an ignored path and carried to the device), both at their launchers' own choices.

    git show 5098e15:kernels/flash_gluon.py > outputs/flash_gluon_base.py                    # CPU, once
    python results/attention/gluon_fwd_round0/ab.py check --base outputs/flash_gluon_base.py  # GPU
    python results/attention/gluon_fwd_round0/ab.py bench --base outputs/flash_gluon_base.py  # GPU
"""
import argparse
import importlib.util
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import alternating_rounds  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402

spec = importlib.util.spec_from_file_location("fwd_turns_ab", Path(__file__).resolve().parents[1] / "gluon_fwd_turns"
                                              / "ab.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # its _inputs, _run and _reference


def load_base(path: str):
    """The baseline kernels/flash_gluon.py as a module of its own (its kernels compile apart from the checkout's)."""
    spec = importlib.util.spec_from_file_location("flash_gluon_base", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(base):
    """Head dims 64 and 128, 1K and 2K tokens, both masks, the default grid, 7 programs and, causal, one query tile a
    program: the checkout's O and LSE bit-identical to the baseline's (the same arithmetic in the same order), and
    within 2e-2 of float64."""
    bad = 0
    for head_dim, seqlen, causal, programs in itertools.product((64, 128), (1024, 2048), (False, True),
                                                                (None, 7, "per-tile")):
        if programs == "per-tile" and not causal:
            continue
        per_tile, programs = programs == "per-tile", (None if programs == "per-tile" else programs)
        saved = G.PERSISTENT_CAUSAL_UP_TO, base.PERSISTENT_CAUSAL_UP_TO
        G.PERSISTENT_CAUSAL_UP_TO = base.PERSISTENT_CAUSAL_UP_TO = 0 if per_tile else saved[0]
        try:
            q, k, v = T._inputs(2, seqlen, 4, head_dim)
            ref_o, _ = T._reference(q, k, v, causal)
            base_o, base_lse = T._run(base.gluon_forward, q, k, v, causal, programs=programs)
            o, lse = T._run(G.gluon_forward, q, k, v, causal, programs=programs)
            err = ((o.double() - ref_o).abs().max() / ref_o.abs().max()).item()
            same = torch.equal(o, base_o) and torch.equal(lse, base_lse)
            ok = same and err < 2e-2
            bad += not ok
        finally:
            G.PERSISTENT_CAUSAL_UP_TO, base.PERSISTENT_CAUSAL_UP_TO = saved
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d} programs {'per tile' if per_tile else programs}: "
              f"err {err:.2e} bit-identical to the baseline {same} {'ok' if ok else 'BAD'}", flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(base, head_dims, seqlens, rounds):
    """The forward alone, the baseline ("shipped"), the checkout's ("round0") and cuDNN's, causal, in alternating
    rounds; 16K tokens a batch, heads x head dim = 2048."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"forward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, heads x head dim 2048, bf16")
    for head_dim, seqlen in itertools.product(head_dims, seqlens):
        q, k, v = T._inputs(16384 // seqlen, seqlen, 2048 // head_dim, head_dim)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        scale = head_dim ** -0.5 * G.LOG2E

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        fns = {"shipped": lambda: base.gluon_forward(q, k, v, o, lse, scale, True),
               "round0": lambda: G.gluon_forward(q, k, v, o, lse, scale, True), "cudnn": cudnn}
        print(f"head dim {head_dim} seqlen {seqlen} causal 1: {alternating_rounds(fns, rounds)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "bench"])
    ap.add_argument("--base", required=True, help="the baseline kernels/flash_gluon.py")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    base = load_base(a.base)
    if a.mode == "check":
        check(base)
    else:
        bench(base, a.head_dims, a.seqlens, a.rounds)
