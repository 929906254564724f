"""Session 46's forward experiment (README.md here): head dim 256's forward with SERIAL rounds, so that cuDNN's
128-key tiles fit the registers. In the shipped round a consumer issues S(j + 1) before P(j) V(j) is done, so O (128
registers a thread at head dim 256), S(j + 1) and P(j) are live together; with 128-key tiles that spills 216 bytes.
SERIAL issues S(j), runs its softmax, then issues P(j) V(j) and waits for it: at most O and one tile's S or P live
(64 / 88 bytes of spill at 128 keys, outside the key loop but for ~3 reloads a round), and the overlap is the two
consumers' turns alone, two a key tile.

Forms at head dim 256 (the launcher's tiles there: 128 queries, 64 keys, a 2-slot ring, K_AHEAD):
- shipped;
- serial64: SERIAL on the shipped tiles (the same arithmetic in the same order: bit-identical);
- serial128: SERIAL with 128-key tiles and one K and one V slot (196,960 bytes of shared memory);
- pipelined128: the shipped round with 128-key tiles (spills 216 bytes; what SERIAL saves).

    python results/attention/gluon_fwd_serial/ab.py compile   # sm_90 registers / spills / shared memory (CPU)
    python results/attention/gluon_fwd_serial/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_fwd_serial/ab.py bench     # GPU: the forward alone, every form and cuDNN's
"""
import argparse
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("fwd_turns_ab", Path(__file__).resolve().parents[1] / "gluon_fwd_turns"
                                              / "ab.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # its compile report, check and bench take the forms to run

HEAD_DIM = 256
# name -> the constexprs on top of the launcher's own, and TILES: FWD_TILES[256] for the call (T.forward_with).
# K_AHEAD as the launcher sets it at 256, so that the compile report (which takes the forms' flags alone) matches
FORMS = {"shipped": dict(K_AHEAD=True, SERIAL=False),
         "serial64": dict(K_AHEAD=True, SERIAL=True),
         "serial128": dict(K_AHEAD=True, SERIAL=True, TILES=(128, 128, 1, 1)),
         "pipelined128": dict(K_AHEAD=True, SERIAL=False, TILES=(128, 128, 1, 1))}


def forms_of(head_dim: int) -> dict:
    return FORMS


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.mode == "compile":
        T.compile_report([HEAD_DIM], forms_of)
    elif a.mode == "check":  # serial64 runs the shipped arithmetic in the same order; the 128-key tiles sum otherwise
        T.check([HEAD_DIM], forms_of, exact=lambda name, flags: name == "serial64")
    else:
        T.bench([HEAD_DIM], a.seqlens, a.rounds, forms_of=forms_of)
