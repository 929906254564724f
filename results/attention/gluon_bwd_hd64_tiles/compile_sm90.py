"""The Gluon backward at head dim 64 compiled for sm_90 on a machine without a GPU, per (BLOCK_M, BLOCK_N, STAGES,
DQ_STAGES): registers at launch, spill stack, shared memory, HGMMA count (compile_sm90.txt).

    TRITON_INTERPRET=1 python results/attention/gluon_bwd_hd64_tiles/compile_sm90.py
"""
import sys

sys.path.insert(0, ".")
from tests.test_flash_gluon import bwd_compile_sm90  # noqa: E402

CONFIGS = [(64, 128, 2, 2), (128, 128, 2, 2), (128, 64, 2, 2), (128, 64, 3, 2), (64, 64, 2, 2), (64, 64, 3, 3)]


def main():
    print("BLOCK_M, BLOCK_N, STAGES, DQ_STAGES (non-causal) | registers at launch, spill stack (bytes a thread), "
          "shared memory (bytes), HGMMA count")
    for tiles in CONFIGS:
        r = bwd_compile_sm90(64, False, tiles)
        print(f"{', '.join(map(str, tiles))} | {r['regs']}, {r['stack']}, {r['smem']}, {r['ops'].get('HGMMA', 0)}",
              flush=True)


if __name__ == "__main__":
    main()
