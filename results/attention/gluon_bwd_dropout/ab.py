"""Session 40's backward experiment (README.md here): the split Gluon backward (`_bwd_split_kernel`, head dim 64)
with dropout, its mask drawn as the Gluon forward's and moved to S^T's layout through shared memory, against the
autotuned @triton.jit backward with dropout (two kernels, each drawing the mask), dropout 0.1. The backward alone
(kernels.flash._flash_bwd from one forward's O, LSE and seed), eager (do_bench: host included) and replayed from a
CUDA graph, three alternating rounds; and the largest difference between the two forms' gradients.

    python results/attention/gluon_bwd_dropout/ab.py     # GPU (sm_90), FLASH_AUTOTUNE unset
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

P = 0.1


def backward_with(gluon: bool, fn):
    """fn with the Gluon backward taking dropout at head dim 64 at every length (gluon) or never."""
    return with_setting(G, "BWD_DROPOUT_MIN_SEQLEN", {(64, False): 0, (64, True): 0} if gluon else {}, fn)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; dropout {P}, head dim 64, bf16", flush=True)
    for b, n, h, causal in [(16, 1024, 12, True), (16, 1024, 32, True), (8, 2048, 32, True), (4, 4096, 32, True),
                            (16, 1024, 32, False), (4, 4096, 32, False)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        scale = 64 ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, P, False, None, None, n, n)
        bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, P, False, None, None, n, n)  # noqa: E731
        grads = {form: backward_with(form == "gluon", bwd)() for form in ("triton", "gluon")}
        diff = max((a.float() - b_.float()).abs().max().item() / b_.float().abs().max().item()
                   for a, b_ in zip(grads["gluon"], grads["triton"]))
        med, times = eager_and_graphed({"triton": backward_with(False, bwd), "gluon": backward_with(True, bwd)}, ())
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, what="bwd",
                              ms={k_: round(v_, 4) for k_, v_ in med.items()},
                              gluon_vs_triton={m: round(med[f"triton_{m}"] / med[f"gluon_{m}"], 3)
                                               for m in ("eager", "graphed")},
                              grad_rel_diff=round(diff, 5), rounds_ms=times)), flush=True)


if __name__ == "__main__":
    main()
