"""Where the head-dim-64 Gluon backward should start (flash_gluon.BWD_MIN_SEQLEN) once it is persistent:
kernels.flash._flash_bwd with the Gluon backward forced on at every length against the @triton.jit backward (its
two kernels, delta in the dQ kernel), at 512-2K tokens, causal and not, at the table's shape (16K tokens a batch,
32 heads) and GPT-2 small's (16 x 1K, 12 heads). Each call eager (do_bench: host included) and replayed from a CUDA
graph (the device alone), three alternating rounds, median. Session 35 ran it at 657af03 with ship.patch applied
(README.md); since then it times the shipped kernels (session 37: the split backward, min_seqlen_split_h100.txt).

    python results/attention/gluon_bwd_persistent/min_seqlen.py   # GPU (sm_90)
    python results/attention/gluon_bwd_persistent/min_seqlen.py --head-dim 256   # the table's shape at 512-2K

At another head dim the shapes keep 16K tokens a batch and heads x head dim = 2048.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, default=64)
    head_dim = parser.parse_args().head_dim
    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)  # the choice is made by `gluon=` below, at every length
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; BWD_PERSISTENT_HEAD_DIMS "
          f"{getattr(G, 'BWD_PERSISTENT_HEAD_DIMS', None)}; BWD_SPLIT_HEAD_DIMS {getattr(G, 'BWD_SPLIT_HEAD_DIMS', None)}",
          flush=True)
    heads = 2048 // head_dim
    shapes = [(32, 512, heads), (16, 1024, heads), (8, 2048, heads)]  # (batch, tokens, heads)
    if head_dim == 64:
        shapes.append((16, 1024, 12))  # GPT-2 small's
    for b, n, h in shapes:
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(b, n, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for _ in range(4))
            scale = head_dim ** -0.5
            o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
            fns = {kind: (lambda g=(kind == "gluon"): F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False,
                                                                   None, None, n, n, gluon=g))
                   for kind in ("gluon", "triton")}
            med, times = eager_and_graphed(fns)
            print(json.dumps(dict(head_dim=head_dim, batch=b, seqlen=n, heads=h, causal=causal,
                                  ms={k_: round(v_, 4) for k_, v_ in med.items()},
                                  gluon_speedup_eager=round(med["triton_eager"] / med["gluon_eager"], 3),
                                  gluon_speedup_graphed=round(med["triton_graphed"] / med["gluon_graphed"], 3),
                                  rounds_ms=times)), flush=True)


if __name__ == "__main__":
    main()
