"""The Gluon forward with dropout (kernels/gluon_dropout.py's mask in the scores' registers) against the autotuned
@triton.jit forward with dropout, which ran every dropout call before, and PyTorch SDPA's own choice with dropout
(what `attn=sdpa` runs), head dim 64, p = 0.1: GPT-2 small's shape (16 x 1K, 12 heads, causal) and the table's (16K
tokens a batch, 32 heads) at 1K-4K. The forward alone (kernels.flash._flash_fwd; SDPA's under no_grad), eager
(do_bench: host included) and replayed from a CUDA graph (the device alone), three alternating rounds, median. (The
first run also timed the autograd forward+backward; its graph capture failed, README.md.)

    python results/attention/gluon_fwd_dropout/ab.py    # GPU (sm_90), FLASH_AUTOTUNE unset
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

P = 0.1


def ours(gluon: bool, fn):
    """fn with the Gluon forward taking dropout at head dim 64 at every length (gluon) or never (the @triton.jit
    forward)."""
    return with_setting(G, "FWD_DROPOUT_MIN_SEQLEN", {(64, False): 0, (64, True): 0} if gluon else {}, fn)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; dropout {P}, head dim 64, bf16", flush=True)
    for b, n, h, causal in [(16, 1024, 12, True), (16, 1024, 32, True), (8, 2048, 32, True), (4, 4096, 32, True),
                            (16, 1024, 32, False), (4, 4096, 32, False)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        scale = 64 ** -0.5

        def fwd():
            with torch.no_grad():
                F._flash_fwd(q, k, v, scale, causal, P, False, None, None, n, n)

        def sdpa_fwd():
            with torch.no_grad():
                TF.scaled_dot_product_attention(qt, kt, vt, dropout_p=P, is_causal=causal)

        med, times = eager_and_graphed({"triton": ours(False, fwd), "gluon": ours(True, fwd), "sdpa": sdpa_fwd}, ())
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, what="fwd",
                              ms={k_: round(v_, 4) for k_, v_ in med.items()},
                              gluon_vs_triton={m: round(med[f"triton_{m}"] / med[f"gluon_{m}"], 3)
                                               for m in ("eager", "graphed")},
                              gluon_vs_sdpa={m: round(med[f"sdpa_{m}"] / med[f"gluon_{m}"], 3)
                                             for m in ("eager", "graphed")},
                              rounds_ms=times)), flush=True)


if __name__ == "__main__":
    main()
