"""Session 45's forward experiment (README.md here): K_AHEAD, each K slot of the forward's ring released as soon as
both consumers' S is done with it (its own mbarrier, k_empty) rather than with V after the round's P V, and the
loader putting K(j) ahead of V(j - 1). Motivation: ncu of head dim 256's forward at 4K (../hd256_profile/) put ~24%
of the consumer warps' stall samples on the wait for K(j) to arrive; with the 2-stage ring of 64-key tiles that
head dim has room for, K(j) could be loaded only once round j - 1's P V was done. The arithmetic is unchanged, so
the form's outputs must be bit-identical to the shipped form's (../gluon_fwd_turns/ab.py's check).

    python results/attention/gluon_fwd_k_ahead/ab.py compile   # sm_90 registers / spills / shared memory (CPU; only
                                                               # the forms' own flags: as launched at head dim 256)
    python results/attention/gluon_fwd_k_ahead/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_fwd_k_ahead/ab.py bench     # GPU: the forward alone, each form and cuDNN's
"""
import argparse
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("fwd_turns_ab", Path(__file__).resolve().parents[1] / "gluon_fwd_turns"
                                              / "ab.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # its check and bench take the forms to run


def forms_of(head_dim: int) -> dict:
    """name -> the constexprs it sets on top of the launcher's own choice at that head dim. At head dim 256 also
    NAMED_TURNS (shipped at 128, never tried at 256)."""
    forms = {"shipped": dict(K_AHEAD=False), "k_ahead": dict(K_AHEAD=True)}
    if head_dim == 256:
        forms["named"] = dict(K_AHEAD=False, NAMED_TURNS=True)
        forms["k_ahead_named"] = dict(K_AHEAD=True, NAMED_TURNS=True)
    return forms


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[256, 128, 64])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.mode == "compile":
        T.compile_report(a.head_dims, forms_of)
    elif a.mode == "check":
        T.check(a.head_dims, forms_of)
    else:
        T.bench(a.head_dims, a.seqlens, a.rounds, forms_of=forms_of)
