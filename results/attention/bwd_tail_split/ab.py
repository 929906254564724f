"""The head-dim-128 backward's last partial wave split into items of query tiles (`_bwd_kernel`'s TAIL_SPLIT,
`kernels.flash_gluon.bwd_tail_split`), against the unsplit kernel and cuDNN, on one H100.

Why (../bwd_waves/): 16K tokens x 16 heads is 2,048 key blocks of equal work at every length, 15.5 waves on 132 SMs.
Splitting each of the last 68 units into S items (their dK and dV summed by TMA reduces in a float32 tail buffer,
cast by `tail_cast` after the kernel) lets every SM take part in the last round.

Prediction (bwd_tail_split's model, an item's fixed cost ~4 query tiles' time): the backward alone 1.01-1.02x at
2K-8K, less at 16K; forward+backward against cuDNN from 0.98x to 0.99-1.00x at 2K-8K.

    git checkout 90dcefd -- kernels/flash_gluon.py   # the experiment's kernel (not kept: README.md)
    FLASH_AUTOTUNE=0 python results/attention/bwd_tail_split/ab.py   # one H100, ~1 minute

1. check: at each shape, every split's gradients against the unsplit kernel's (float32 summation order only).
2. backward alone (`gluon_backward`, tail_split 1 = shipped, the automatic choice, 2, 3, 5), 5 alternating rounds.
3. forward+backward through autograd with BWD_TAIL_SPLIT_HEAD_DIMS = () (shipped) and (128,), and cuDNN, 5 rounds.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import alternating_rounds, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_pp64"))
from pp64_bwd import _inputs  # noqa: E402  (q, k, v, dO, LSE, delta and the scale, as pp64's)

SHAPES = [(8, 2048), (4, 4096), (2, 8192), (1, 16384)]  # (batch, seqlen): 16K tokens, 16 heads of 128
HEADS, D = 16, 128


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; SMs {G._sm_count(0)}", flush=True)
    failed = 0
    for b, n in SHAPES:
        q, k, v, do, lse, delta, scale = _inputs(b, n, HEADS, False, head_dim=D)
        grads = [torch.empty_like(q) for _ in range(3)]
        units = n // 128 * b * HEADS
        auto = G.bwd_tail_split(units, n // 64, G._sm_count(0))

        def bwd(split):
            return lambda: G.gluon_backward(do, q, k, v, lse, delta, *grads, scale, False, tail_split=split)

        bwd(1)()
        whole = [g.clone() for g in grads]
        checks = {}
        for split in sorted({2, 3, 5, auto}):
            bwd(split)()
            err = max(((a.float() - w.float()).abs().max() / w.float().abs().max()).item()
                      for a, w in zip(grads, whole))
            checks[split] = round(err, 5)
            failed += err > 2 ** -7
        fns = {"shipped": bwd(1), f"auto_{auto}": bwd(auto), "split_2": bwd(2), "split_3": bwd(3), "split_5": bwd(5)}
        bwd_line = alternating_rounds(fns, 5)

        qc, kc, vc = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        qo, ko, vo = (x.detach().requires_grad_() for x in (q, k, v))
        doc = do.transpose(1, 2).contiguous()

        def ours():
            torch.autograd.grad(F.flash_attn_func(qo, ko, vo), (qo, ko, vo), do)

        def cudnn():
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.autograd.grad(TF.scaled_dot_product_attention(qc, kc, vc), (qc, kc, vc), doc)

        fwdbwd = {"shipped": with_setting(G, "BWD_TAIL_SPLIT_HEAD_DIMS", (), ours),
                  "split": with_setting(G, "BWD_TAIL_SPLIT_HEAD_DIMS", (128,), ours), "cudnn": cudnn}
        fwdbwd_line = alternating_rounds(fwdbwd, 5)
        print(json.dumps(dict(batch=b, seqlen=n, heads=HEADS, units=units, auto=auto, check_rel_err=checks,
                              bwd=bwd_line, fwdbwd=fwdbwd_line)), flush=True)
    print(f"ab: {failed} check(s) failed", flush=True)


if __name__ == "__main__":
    main()
