"""The Gluon forward with dropout (kernels/gluon_dropout.py's mask in the scores' registers) against the autotuned
@triton.jit forward with dropout, which ran every dropout call before, and PyTorch SDPA's own choice with dropout
(what `attn=sdpa` runs), head dim 64, p = 0.1: GPT-2 small's shape (16 x 1K, 12 heads, causal) and the table's (16K
tokens a batch, 32 heads) at 1K-4K. Timed alone (kernels.flash._flash_fwd; SDPA's forward under no_grad) and in the
autograd forward+backward (the backward is the @triton.jit one in both of ours), eager (do_bench: host included)
and replayed from a CUDA graph (the device alone), three alternating rounds, median.

    python results/attention/gluon_fwd_dropout/ab.py    # GPU (sm_90), FLASH_AUTOTUNE unset
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

P = 0.1


def ours(gluon: bool, fn):
    """fn with the Gluon forward taking dropout at head dim 64 (gluon) or not (the @triton.jit forward) while it runs
    (eager calls; a graph keeps the kernels chosen when it was captured)."""
    def call():
        saved = G.FWD_DROPOUT_HEAD_DIMS
        G.FWD_DROPOUT_HEAD_DIMS = (64,) if gluon else ()
        try:
            return fn()
        finally:
            G.FWD_DROPOUT_HEAD_DIMS = saved
    return call


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; dropout {P}, head dim 64, bf16", flush=True)
    for b, n, h, causal in [(16, 1024, 12, True), (16, 1024, 32, True), (8, 2048, 32, True), (4, 4096, 32, True),
                            (16, 1024, 32, False), (4, 4096, 32, False)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
        scale = 64 ** -0.5

        def fwd():
            with torch.no_grad():
                F._flash_fwd(q, k, v, scale, causal, P, False, None, None, n, n)

        def sdpa_fwd():
            with torch.no_grad():
                TF.scaled_dot_product_attention(qt, kt, vt, dropout_p=P, is_causal=causal)

        fwdbwd = lambda: F.flash_attn_func(q, k, v, causal=causal, dropout_p=P).backward(do)  # noqa: E731
        sdpa_fwdbwd = lambda: TF.scaled_dot_product_attention(  # noqa: E731
            qt, kt, vt, dropout_p=P, is_causal=causal).backward(dot)
        for what, step, sdpa in (("fwd", fwd, sdpa_fwd), ("fwdbwd", fwdbwd, sdpa_fwdbwd)):
            med, times = eager_and_graphed({"triton": ours(False, step), "gluon": ours(True, step), "sdpa": sdpa},
                                           (q, k, v))
            print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, what=what,
                                  ms={k_: round(v_, 4) for k_, v_ in med.items()},
                                  gluon_vs_triton={m: round(med[f"triton_{m}"] / med[f"gluon_{m}"], 3)
                                                   for m in ("eager", "graphed")},
                                  gluon_vs_sdpa={m: round(med[f"sdpa_{m}"] / med[f"gluon_{m}"], 3)
                                                 for m in ("eager", "graphed")},
                                  rounds_ms=times)), flush=True)


if __name__ == "__main__":
    main()
