"""Where the host time of a Gluon launch goes (prepared in session 25, not yet run): cProfile of 200 calls each of
kernels/flash.py's forward and backward at head dim 128, 1K causal (the Gluon limits lifted), against the same calls
on the @triton.jit kernels. Session 25 measured ~0.55 ms of host time per Gluon backward call against 0.24 ms
(short_causal_h100.txt); building a TensorDescriptor (1.4 us) and specialising one (1.2 us) do not explain it.

    python results/attention/gluon_hostdesc/host_profile.py      # GPU (sm_90); prints the top 25 by own time
"""
import cProfile
import pstats
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402


def main(calls=200):
    G.MIN_SEQLEN = dict.fromkeys(G.MIN_SEQLEN, 0)
    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)
    b, n, h, d = 16, 1024, 16, 128
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = d ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, True, 0.0, False, None, None, n, n)
    for gluon in (True, False):
        F.GLUON_KERNELS = gluon

        def fwd():
            return F._flash_fwd(q, k, v, scale, True, 0.0, False, None, None, n, n)

        def bwd():
            return F._flash_bwd(do, q, k, v, o, lse, seed, scale, True, 0.0, False, None, None, n, n, gluon=gluon)

        for name, fn in (("forward", fwd), ("backward", bwd)):
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host = (time.perf_counter() - t0) / calls * 1e6
            torch.cuda.synchronize()
            print(f"== {'gluon' if gluon else 'triton'} {name}: {host:.0f} us host per call", flush=True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
