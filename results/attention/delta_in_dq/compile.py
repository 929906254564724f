"""Registers and spill stack of the dQ kernel with and without COMPUTE_DELTA (sm_90 compile on the CPU, every
config of its tuning list), head dims 64 and 128, causal and not, no dropout and dropout (COMPUTE_DELTA
shipped in session 34; compile_sm90.txt was made with the patch applied to a913872, before that).

    python results/attention/delta_in_dq/compile.py > results/attention/delta_in_dq/compile_sm90.txt
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import kernel_resources as R  # noqa: E402  (puts the repo root on sys.path)

import kernels.flash as F  # noqa: E402

print("| head dim | causal | dropout | (BLOCK_M, BLOCK_N, warps, stages) | registers, stack: plain | COMPUTE_DELTA |")
print("|---:|---|---|---|---|---|")
for d in (64, 128):
    for causal in (True, False):
        for dropout in (False, True):
            for m, n, w, s in F.tuning_shapes("dq", F._block_d(d)):
                consts = dict(HEAD_DIM=d, BLOCK_D=F._block_d(d), BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=causal, VARLEN=False,
                              HAS_DROPOUT=dropout, REVERSE=causal)
                cells = []
                for compute in (False, True):
                    r = R.resources(F._bwd_dq_kernel, {**consts, "COMPUTE_DELTA": compute}, w, s)
                    cells.append(f"{r['regs']}, {r['stack']}")
                print(f"| {d} | {causal} | {dropout} | ({m}, {n}, {w}, {s}) | {cells[0]} | {cells[1]} |", flush=True)
