"""The shipped Gluon backward (kernels/flash_gluon.py `_bwd_kernel`) compiled for sm_90 at head dims it does not ship
for, on a machine without a GPU (scripts/kernel_resources.py via tests/test_kernel_resources.compile_sm90): registers,
spill stack and shared memory per (head dim, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES). Session 26 (its output), when
the kernel laid every tile out one warp per 16 rows; since session 28 it splits 64-key tiles across the warpgroups
(results/attention/gluon_bwd256/), so the head-dim-256 rows compile without the spills recorded here.

    TRITON_INTERPRET=1 python results/attention/launch_direct/bwd_compile_sm90.py
"""
import sys

sys.path.insert(0, ".")
from tests.test_flash_gluon import bwd_compile_sm90  # noqa: E402

CASES = [(64, 64, 128, 2, 2), (256, 64, 64, 1, 1), (256, 64, 64, 2, 1)]


def main():
    print("head dim, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES | registers, spill stack (bytes a thread), "
          "shared memory (bytes)")
    for hd, *tiles in CASES:
        for causal in (False, True):
            r = bwd_compile_sm90(hd, causal, tuple(tiles))
            print(f"{hd}, {', '.join(map(str, tiles))}, {'causal' if causal else 'non-causal'} | "
                  f"{r['regs']}, {r['stack']}, {r['smem']}", flush=True)


if __name__ == "__main__":
    main()
