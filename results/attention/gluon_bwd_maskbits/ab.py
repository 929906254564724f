"""What would the Gluon backward with dropout cost if the forward stored its keep-mask as bits? (session 42)

At GPT-2 small's attention (causal 1K, head dim 64, dropout 0.1) the split Gluon backward takes 0.384 ms with dropout
against 0.235 without (../gluon_bwd_dropout/, ../gluon_bwd_fused_cast/): each tile redraws its mask with Philox4x32-7.
cuDNN's backward pays ~0.05 ms for its dropout there (../dropout_gpt2.md), ours ~0.15. Here the kernel reads the
mask from a bit array instead, one int32 word per query row and 32 keys (`_keep_from_bits`, `MASK_BITS`; the bits
come in through the SEED pointer for this experiment), built here on the host from kernels.flash.dropout_keep_mask.
Everything after the draw is the shipped kernel's: the flags go through shared memory to S^T's layout as before.

Prediction: the draw's ~0.12-0.15 ms a GPT-2 layer falls to a few hundredths (one 256-byte load and a shift a half
tile, against 256 Philox calls), so the backward at GPT-2's shape ~0.27-0.30 ms, ~1.3x the @triton.jit backward.
If so, storing the bits in the forward (25 MB a GPT-2 layer: B x H x N x N / 8 bytes) is worth building.

    git checkout 7403174 -- kernels/flash_gluon.py   # the experiment's MASK_BITS forms (README.md)
    FLASH_AUTOTUNE unset: python results/attention/gluon_bwd_maskbits/ab.py   # one H100, ~3 minutes

Checks: the bits form's dK and dV bit-identical to the Philox form's (the same mask, the same arithmetic), dQ within
2^-7 of its largest element (its TMA reduce's order); then the backward alone, eager and replayed from CUDA graphs,
three alternating rounds: the @triton.jit backward (what GPT-2 runs today), the Gluon one with Philox, with bits,
with Philox and the flags handed over as words ("words", MASK_BITS=3: one int32 a query and 32 keys in shared
memory instead of 32 transposed bytes), and with every score kept and no draw ("nodraw", MASK_BITS=2: its gradients
are not dropout's; timing only).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, launch_with, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

P = 0.1


def mask_bits(seed, b, h, n):
    """kernels.flash's keep-mask as int32 (b x h, n, n // 32): bit c of word (bh, row, w) keeps key 32 w + c."""
    keep = F.dropout_keep_mask(seed, b, h, n, n, P).view(b * h, n, n // 32, 32).to(torch.int64)
    words = (keep << torch.arange(32, device=keep.device)).sum(-1)
    return (words - (words >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32).contiguous()


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; dropout {P}, head dim 64, bf16", flush=True)
    failed = 0
    for b, n, h, causal in [(16, 1024, 12, True), (16, 1024, 32, True), (4, 4096, 32, True), (16, 1024, 32, False),
                            (4, 4096, 32, False)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        scale = 64 ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, P, False, None, None, n, n)
        bits = mask_bits(seed, b, h, n)
        bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, P, False, None, None, n, n)  # noqa: E731
        gluon_everywhere = {(64, False): 0, (64, True): 0}
        forms = {
            "triton": with_setting(G, "BWD_DROPOUT_MIN_SEQLEN", {}, bwd),
            "philox": with_setting(G, "BWD_DROPOUT_MIN_SEQLEN", gluon_everywhere, bwd),
            "bits": with_setting(G, "BWD_DROPOUT_MIN_SEQLEN", gluon_everywhere, with_setting(
                G, "_dropout_args", lambda who, p, s, ph: (bits, *F._drop_consts(p)),
                launch_with(bwd, [G._bwd_split_kernel], {"MASK_BITS": 1}))),
            # the Philox draw as shipped, its flags handed to S^T's layout as one word a query and 32 keys
            "words": with_setting(G, "BWD_DROPOUT_MIN_SEQLEN", gluon_everywhere,
                                  launch_with(bwd, [G._bwd_split_kernel], {"MASK_BITS": 3})),
            # every score kept and nothing drawn, the rest of the dropout path as is: what the draw itself costs
            "nodraw": with_setting(G, "BWD_DROPOUT_MIN_SEQLEN", gluon_everywhere,
                                   launch_with(bwd, [G._bwd_split_kernel], {"MASK_BITS": 2})),
        }
        grads = {name: [g.clone() for g in fn()] for name, fn in forms.items()}
        same_dkdv = all(torch.equal(a, c) for f in ("bits", "words")
                        for a, c in zip(grads[f][1:], grads["philox"][1:]))
        dq_err = max(((grads[f][0].float() - grads["philox"][0].float()).abs().max()
                      / grads["philox"][0].float().abs().max()).item() for f in ("bits", "words"))
        vs_triton = max(((a.float() - c.float()).abs().max() / c.float().abs().max()).item()
                        for a, c in zip(grads["bits"], grads["triton"]))
        failed += (not same_dkdv) or dq_err > 2 ** -7
        med, times = eager_and_graphed(forms, ())
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, dkdv_bitwise=same_dkdv,
                              dq_rel_err=round(dq_err, 5), vs_triton_rel=round(vs_triton, 5),
                              ms={k_: round(v_, 4) for k_, v_ in med.items()},
                              vs_philox={f"{o}_{m}": round(med[f"philox_{m}"] / med[f"{o}_{m}"], 3)
                                         for o in ("triton", "bits", "words", "nodraw") for m in ("eager", "graphed")},
                              rounds_ms=times)), flush=True)
    print(f"ab: {failed} check(s) failed", flush=True)


if __name__ == "__main__":
    main()
