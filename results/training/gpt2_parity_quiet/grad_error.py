"""How far each parity kind's attention output and gradients are from float64, at GPT-2 small's shape.

    python results/training/gpt2_parity_quiet/grad_error.py                  # one GPU, bf16, ~seconds
    TRITON_INTERPRET=1 python results/training/gpt2_parity_quiet/grad_error.py --cpu   # fp16, small shape (slow)

The parity run (README here) found flash's validation perplexity 1.1-1.8% below standard-matched's for the last
seven evaluations, and below the float32-score control too. One explanation is precision: both standard kinds
round dP = dO V^T (and the probabilities fed to the product with V) to 16 bits, while the kernels keep P, dP and
delta in float32. This measures it directly. Every kind gets the same 16-bit q, k, v, dO and the kernels' dropout
mask (torch.manual_seed before each draw), and float64 attention on those same values is the reference:
  flash                  flash_attn_func on the 16-bit tensors
  standard-matched       standard_attention under autocast (scores rounded to 16 bits), as attn=standard-matched
  standard-matched-fp32  the same with upcast_scores (scores and softmax in float32), as attn=standard-matched-fp32
  standard-fp32          q, k, v, dO upcast, everything in float32: the candidate fourth kind
For out, dq, dk, dv it prints the relative error ||x - ref|| / ||ref|| and the bias <x - ref, ref> / <ref, ref>
(a systematic shrink or growth of the gradient shows there; rounding noise averages out of it), the mean over
--seeds draws. The gradients land in 16-bit leaves, so even standard-fp32's are rounded once to 16 bits: its row is
the floor for any kind. --score-std sets the spread of the scaled scores (trained GPT-2 heads reach several units).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels.flash import draw_dropout_seed, dropout_keep_mask, flash_attn_func  # noqa: E402
from kernels.standard import standard_attention  # noqa: E402

KINDS = ("flash", "standard-matched", "standard-matched-fp32", "standard-fp32")
TENSORS = ("out", "dq", "dk", "dv")


def kernel_mask(q, k, p, mask_seed):
    """The kernels' keep-mask for this seed: flash, called after the same torch.manual_seed, draws this one."""
    torch.manual_seed(mask_seed)
    return dropout_keep_mask(draw_dropout_seed(q.device), q.shape[0], q.shape[2], q.shape[1], k.shape[1], p)


def run_kind(kind, q, k, v, do, p, mask_seed, autocast_dtype):
    """(out, dq, dk, dv) of one kind, in float64 for comparison."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dev = q.device.type
    if kind == "flash":
        torch.manual_seed(mask_seed)  # flash draws its seed from the same generator state as the mask below
        out = flash_attn_func(q, k, v, dropout_p=p, causal=True)
    else:
        mask = kernel_mask(q, k, p, mask_seed)
        if kind == "standard-fp32":
            args, ctx = [t.float() for t in (q, k, v)], contextlib.nullcontext()
        else:
            args, ctx = [q, k, v], torch.autocast(dev, dtype=autocast_dtype)
        with ctx:
            out = standard_attention(*args, dropout_p=p, causal=True, dropout_mask=mask,
                                     upcast_scores=kind == "standard-matched-fp32")
    out.backward(do.to(out.dtype))
    return [t.double() for t in (out.detach(), q.grad, k.grad, v.grad)]


def reference(q, k, v, do, p, mask_seed):
    mask = kernel_mask(q, k, p, mask_seed)
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = standard_attention(q, k, v, dropout_p=p, causal=True, dropout_mask=mask)
    out.backward(do.double())
    return [out.detach(), q.grad, k.grad, v.grad]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="Triton interpreter, float16, --batch 1 --seqlen 128 --heads 2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--score-std", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    if args.cpu:
        device, dtype = "cpu", torch.float16  # the interpreter's bfloat16 is unreliable
        args.batch, args.seqlen, args.heads = 1, 128, 2
    else:
        if not torch.cuda.is_available():
            sys.exit("no GPU: pass --cpu (with TRITON_INTERPRET=1) for the small float16 check")
        device, dtype = "cuda", torch.bfloat16
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLAS bf16 reduced-precision reductions "
              f"{torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction} (the default, as in training)")
    import triton

    print(f"# triton {triton.__version__}; {dtype}, batch {args.batch}, seqlen {args.seqlen}, heads {args.heads}, "
          f"head dim {args.headdim}, causal, dropout {args.dropout}, mean of {args.seeds} draws")
    print(f"# {' '.join(sys.argv)}")
    print("| score std | kind | " + " | ".join(f"{t} rel err" for t in TENSORS) + " | "
          + " | ".join(f"{t} bias" for t in TENSORS[1:]) + " |")
    print("|---:|---|" + "---:|" * (2 * len(TENSORS) - 1))
    shape = (args.batch, args.seqlen, args.heads, args.headdim)
    for score_std in args.score_std:
        # q.k / sqrt(d) with q, k ~ N(0, s^2) has standard deviation s^2
        s = math.sqrt(score_std)
        sums = {kind: [[0.0] * len(TENSORS), [0.0] * len(TENSORS)] for kind in KINDS}
        for seed in range(args.seeds):
            g = torch.Generator(device=device).manual_seed(1000 + seed)
            q, k = (torch.randn(shape, generator=g, device=device) * s for _ in range(2))
            v, do = (torch.randn(shape, generator=g, device=device) for _ in range(2))
            q, k, v, do = (t.to(dtype) for t in (q, k, v, do))
            ref = reference(q, k, v, do, args.dropout, seed)
            for kind in KINDS:
                got = run_kind(kind, q, k, v, do, args.dropout, seed, dtype)
                for i, (x, r) in enumerate(zip(got, ref)):
                    sums[kind][0][i] += ((x - r).norm() / r.norm()).item() / args.seeds
                    sums[kind][1][i] += ((x - r).flatten() @ r.flatten() / (r.flatten() @ r.flatten())).item() / args.seeds
        for kind in KINDS:
            err, bias = sums[kind]
            print(f"| {score_std:g} | {kind} | " + " | ".join(f"{e:.2e}" for e in err) + " | "
                  + " | ".join(f"{b:+.1e}" for b in bias[1:]) + " |")


if __name__ == "__main__":
    main()
