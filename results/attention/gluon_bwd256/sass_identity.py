"""A signature of the Gluon backward's SASS for sm_90, per head dim and causal flag: registers, spill stack, shared
memory, instruction count and a hash of the instruction text (addresses stripped). Run at two commits, it tells
whether a change to the kernel's source changed what runs at head dims 64 and 128 (sass_identity.txt). Self-contained
so that it runs at commits from before `BWD_TILES` too (copy it into such a checkout).

    TRITON_INTERPRET=0 python results/attention/gluon_bwd256/sass_identity.py [head dims; default 64 128]
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

import kernel_resources as R  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

SCALARS = {"LSE": "*fp32", "DELTA": "*fp32", "qk_scale": "fp32", "sm_scale": "fp32"}  # every other one is an i32


def tiles(head_dim: int) -> tuple:
    """(BLOCK_M, BLOCK_N, STAGES, DQ_STAGES) the backward launches at this head dim, before or after BWD_TILES."""
    if hasattr(G, "BWD_TILES"):
        return G.BWD_TILES[head_dim]
    return G.BWD_BLOCK_M, G.BWD_BLOCK_N, G.BWD_STAGES, G.BWD_DQ_STAGES


def signature(head_dim: int, causal: bool) -> str:
    block_m, block_n, stages, dq_stages = tiles(head_dim)
    layouts = G.bwd_layouts(head_dim, gl.bfloat16)

    def desc(rows, layout, dtype="bf16"):
        return R.tensordesc(dtype, [rows, head_dim], layouts[layout])

    types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                 **{name: desc(block_n, "kv_layout") for name in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
                 dqa_desc=desc(block_m, "dqa_layout", "fp32"))
    consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                  IS_CAUSAL=causal, WARPS=G.BWD_WARPS, ds_layout=layouts["ds_layout"])
    names = G._bwd_kernel.arg_names
    sig = {a: "constexpr" if a in consts else types.get(a) or SCALARS.get(a, "i32") for a in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if sig[a].startswith("*")}
    src = GluonASTSource(fn=G._bwd_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": G.BWD_WARPS, "num_stages": stages})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    instructions = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*;)", sass)]
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
    sha = hashlib.sha1("\n".join(instructions).encode()).hexdigest()[:16]
    return (f"{head_dim} {causal} regs {regs} stack {stack} smem {compiled.metadata.shared} "
            f"n_ins {len(instructions)} sha {sha}")


if __name__ == "__main__":
    for head_dim in map(int, sys.argv[1:] or (64, 128)):
        for causal in (False, True):
            print(signature(head_dim, causal), flush=True)
