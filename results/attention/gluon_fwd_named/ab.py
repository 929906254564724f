"""Session 39's forward experiment (README.md here), run with ../gluon_fwd_turns/ab.py's check and bench:
- NAMED_TURNS: the consumers' turns passed through two hardware named barriers (`bar.sync` to wait, `bar.arrive` to
  pass, 256 threads, ids 14 and 15) instead of two mbarriers. ncu of the causal 2K forward
  (../gluon_bwd_profile/README.md, session 39's section) put ~1,500 barrier stall samples on the turn's pass: a
  warpgroup's mbarrier arrive is one elected thread's after a warpgroup-wide bar.sync, while a bar.arrive blocks no
  one (cuDNN passes its turns so).
- MASK_REL: the diagonal tile's mask tested against the tile's own column index (`cols <= rows - start_n`), with
  fewer integer instructions: 264 / 440 fewer static SASS instructions at head dim 64 / 128 causal.
The arithmetic is unchanged, so every form's outputs must be bit-identical to the shipped form's.

    python results/attention/gluon_fwd_named/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_fwd_named/ab.py bench     # GPU: every form's forward and cuDNN's
"""
import argparse
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("fwd_turns_ab", Path(__file__).resolve().parents[1] / "gluon_fwd_turns"
                                              / "ab.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # its check and bench take the forms to run

# the launcher's EXP_TURNS / KEYS_DOWN in each
FORMS = {"shipped": {}, "named": dict(NAMED_TURNS=True), "mask_rel": dict(MASK_REL=True),
         "named_mask_rel": dict(NAMED_TURNS=True, MASK_REL=True)}


def forms_of(head_dim: int) -> dict:
    return FORMS


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.mode == "check":
        T.check(a.head_dims, forms_of)
    else:
        T.bench(a.head_dims, a.seqlens, a.rounds, forms_of=forms_of)
