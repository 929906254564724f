"""One backward call to profile: the shipped Gluon backward (`ours`) or cuDNN's (`cudnn`, PyTorch SDPA's cuDNN
backend), head dim 64 (or --head-dim 128), 16K tokens a batch (batch 4 x 4K tokens, 2048 / head dim heads), bf16: three warm-up calls, then one
between cudaProfilerStart and Stop (and inside the NVTX range "profiled"), the only one the profile scripts' ncu
profiles (every kernel of it). With --time, instead
the do_bench time of a call (run it outside the profiler).

    python results/attention/gluon_bwd_profile/drive.py ours|cudnn|pp64 [--causal] [--time] [--head-dim 128]
        [--forward] [--seqlen 2048] [--fwd-flags EXP_TURNS=1 KEYS_DOWN=1]

--forward profiles the forward call instead (ours: kernels.flash_gluon.gluon_forward; cudnn: SDPA's forward,
without autograd); --fwd-flags launches ours with these `_fwd_kernel` constexprs (../gluon_fwd_turns/ab.py's
forward_with), e.g. to profile one of that experiment's forms.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import triton.testing  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("provider", choices=["ours", "cudnn", "pp64"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--forward", action="store_true")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--fwd-flags", nargs="*", default=[], metavar="NAME=INT")
    args = ap.parse_args()
    seqlen, head_dim = args.seqlen, args.head_dim
    batch = 16384 // seqlen
    nheads = 2048 // head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    scale = head_dim ** -0.5
    if args.forward and args.provider == "ours":
        o, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen, device="cuda")

        forward = G.gluon_forward
        if args.fwd_flags:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_fwd_turns"))
            from ab import forward_with
            forward = forward_with({n: bool(int(v)) for n, v in (f.split("=") for f in args.fwd_flags)})

        def step():
            forward(q, k, v, o, lse, scale * G.LOG2E, args.causal)
    elif args.forward:
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def step():
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
    elif args.provider in ("ours", "pp64"):
        o, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen, device="cuda")
        G.gluon_forward(q, k, v, o, lse, scale * G.LOG2E, args.causal)
        delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
        grads = [torch.empty_like(q) for _ in range(3)]

        if args.provider == "pp64":  # ../gluon_bwd_pp64/: the two compute warpgroups apart
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_pp64"))
            from pp64_bwd import pp64_backward as backward
        else:
            backward = G.gluon_backward

        def step():
            backward(do, q, k, v, lse, delta, *grads, scale, args.causal)
    else:
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        dot = do.transpose(1, 2)

        def step():
            torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)
    if args.time:
        ms = triton.testing.do_bench(step, rep=100)
        print(f"{args.provider} causal={args.causal} head dim {head_dim} {batch} x {seqlen}: "
              f"{'forward' if args.forward else 'backward'} {ms:.3f} ms (do_bench)", flush=True)
        return
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    # cudaProfilerStart / Stop hold for the whole process: cuDNN's backward kernels are launched by autograd's own
    # thread, outside an NVTX range pushed on this one (the first run profiled none of them)
    torch.cuda.nvtx.range_push("profiled")
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
