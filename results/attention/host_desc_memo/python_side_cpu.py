"""The Python side of the Gluon launch path, timed on the CPU machine (no GPU): the scope checks and the forward
launcher with `launch` stubbed out, on CPU bf16 tensors with the sm_90 platform simulated. Against session 26's
device-host figure for the whole `_flash_fwd` (126 us, results/attention/launch_direct/host_split_h100.txt), what is
left is Triton's launcher (descriptors, scratch, the driver call): what host_desc_memo/ab.py goes after.

    python results/attention/host_desc_memo/python_side_cpu.py
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402


def us(fn, calls=2000) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    F._ws_platform_unsupported = lambda q: None  # as on an sm_90 GPU with Triton 3.6
    F._GLUON_TRITON = F.GLUON_KERNELS = True
    G.launch = lambda *args, **kwargs: None
    print(f"# CPU machine, torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          "host us per call, 2000 calls")
    for d, n, causal in [(128, 1024, True), (64, 2048, False)]:
        b, h = 16384 // n, 2048 // d
        q, k, v, do = (torch.randn(b, n, h, d, dtype=torch.bfloat16) for _ in range(4))
        lse, o = torch.empty(b, h, n), torch.empty_like(q)
        layout = G._shared_layout(128, d, G._GL_DTYPES[q.dtype])
        rows = {
            "_gluon_unsupported (forward scope)": lambda: F._gluon_unsupported(q, k, v, causal, 0.0, False, None),
            "_gluon_bwd_unsupported (backward scope)": lambda: F._gluon_bwd_unsupported(
                q, k, v, do, lse, lse, (q, k, v), causal, 0.0, False),
            "head_tiles (one descriptor)": lambda: G.head_tiles(q, 128, layout),
            "gluon_forward, launch stubbed": lambda: G.gluon_forward(q, k, v, o, lse, d ** -0.5, causal),
        }
        for name, fn in rows.items():
            print(f"d {d} n {n} {'causal' if causal else 'full'}: {name:42s} {us(fn):6.1f}", flush=True)


if __name__ == "__main__":
    main()
