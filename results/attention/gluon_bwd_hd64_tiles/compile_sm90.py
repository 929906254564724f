"""The Gluon backward at head dim 64 compiled for sm_90 on a machine without a GPU, per (BLOCK_M, BLOCK_N, STAGES,
DQ_STAGES): registers at launch, spill stack, shared memory, HGMMA count (compile_sm90.txt).

    TRITON_INTERPRET=1 python results/attention/gluon_bwd_hd64_tiles/compile_sm90.py
"""
import sys

sys.path.insert(0, ".")
from tests.test_kernel_resources import compile_sm90  # noqa: E402

CONFIGS = [(64, 128, 2, 2), (128, 128, 2, 2), (128, 64, 2, 2), (128, 64, 3, 2), (64, 64, 2, 2), (64, 64, 3, 3)]


def main():
    print("BLOCK_M, BLOCK_N, STAGES, DQ_STAGES (non-causal) | registers at launch, spill stack (bytes a thread), "
          "shared memory (bytes), HGMMA count")
    for bm, bn, stages, dq_stages in CONFIGS:
        setup = ("import kernels.flash_gluon as G; from triton.experimental.gluon import language as gl; "
                 f"G.BWD_TILES[64] = ({bm}, {bn}, {stages}, {dq_stages}); G.bwd_layouts.cache_clear(); "
                 "lay = G.bwd_layouts(64, gl.bfloat16); "
                 "desc = lambda r, l, t='bf16': R.tensordesc(t, [r, 64], lay[l])")
        consts = (f"dict(HEAD_DIM=64, BLOCK_M={bm}, BLOCK_N={bn}, STAGES={stages}, DQ_STAGES={dq_stages}, "
                  "IS_CAUSAL=False, WARPS=8, ds_layout=lay['ds_layout'])")
        types = (f"dict(q_desc=desc({bm}, 'q_layout'), do_desc=desc({bm}, 'q_layout'), "
                 f"**{{n: desc({bn}, 'kv_layout') for n in ('k_desc', 'v_desc', 'dk_desc', 'dv_desc')}}, "
                 f"dqa_desc=desc({bm}, 'dqa_layout', 'fp32'))")
        r = compile_sm90("G._bwd_kernel", consts, 8, stages, setup, types)
        print(f"{bm}, {bn}, {stages}, {dq_stages} | {r['regs']}, {r['stack']}, {r['smem']}, {r['ops'].get('HGMMA', 0)}",
              flush=True)


if __name__ == "__main__":
    main()
