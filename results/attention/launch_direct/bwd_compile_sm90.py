"""The shipped Gluon backward (kernels/flash_gluon.py `_bwd_kernel`) compiled for sm_90 at head dims it does not ship
for, on a machine without a GPU (scripts/kernel_resources.py via tests/test_kernel_resources.compile_sm90): registers,
spill stack and shared memory per (head dim, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES). Session 26 (its output), when
the kernel laid every tile out one warp per 16 rows; since session 28 it splits 64-key tiles across the warpgroups
(results/attention/gluon_bwd256/), so the head-dim-256 rows compile without the spills recorded here.

    TRITON_INTERPRET=1 python results/attention/launch_direct/bwd_compile_sm90.py
"""
import sys

sys.path.insert(0, ".")
from tests.test_kernel_resources import compile_sm90  # noqa: E402

CASES = [(64, 64, 128, 2, 2), (256, 64, 64, 1, 1), (256, 64, 64, 2, 1)]


def main():
    print("head dim, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES | registers, spill stack (bytes a thread), "
          "shared memory (bytes)")
    for hd, bm, bn, stages, dq_stages in CASES:
        for causal in (False, True):
            setup = ("import kernels.flash_gluon as G; from triton.experimental.gluon import language as gl; "
                     f"G.BWD_TILES[{hd}] = ({bm}, {bn}, {stages}, {dq_stages}); G.bwd_layouts.cache_clear(); "
                     f"lay = G.bwd_layouts({hd}, gl.bfloat16); "
                     f"desc = lambda r, l, t='bf16': R.tensordesc(t, [r, {hd}], lay[l])")
            consts = (f"dict(HEAD_DIM={hd}, BLOCK_M={bm}, BLOCK_N={bn}, STAGES={stages}, DQ_STAGES={dq_stages}, "
                      f"IS_CAUSAL={causal}, WARPS=8, ds_layout=lay['ds_layout'])")
            types = (f"dict(q_desc=desc({bm}, 'q_layout'), do_desc=desc({bm}, 'q_layout'), "
                     f"**{{n: desc({bn}, 'kv_layout') for n in ('k_desc', 'v_desc', 'dk_desc', 'dv_desc')}}, "
                     f"dqa_desc=desc({bm}, 'dqa_layout', 'fp32'))")
            r = compile_sm90("G._bwd_kernel", consts, 8, stages, setup, types)
            print(f"{hd}, {bm}, {bn}, {stages}, {dq_stages}, {'causal' if causal else 'non-causal'} | "
                  f"{r['regs']}, {r['stack']}, {r['smem']}", flush=True)


if __name__ == "__main__":
    main()
