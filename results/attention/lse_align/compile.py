"""Compile-only (sm_90, on a CPU machine): what LSE_ALIGNED changes in the backward kernels' machine code.

The block-sparse backward is compiled from the arguments its own launcher builds (bf16, 16K tokens, 16 heads of 128,
butterfly layout, non-causal, the head-dim-128 tiles), specialised by Triton's own argument binder as a real launch
is; the dense dK/dV kernel through scripts/kernel_resources.py (which marks the strides 16-divisible as a launch does,
except those the kernel keeps unspecialised). Each once with LSE_ALIGNED False (every launch before this change) and
True. Static counts: every instruction once; LDGSTS are the asynchronous global-to-shared copies (Q/dO tiles and the
LSE / delta rows).

    python results/attention/lse_align/compile.py > results/attention/lse_align/compile_sm90.txt
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import kernel_resources as KR  # noqa: E402
import kernels.blocksparse as B  # noqa: E402
import kernels.flash as F  # noqa: E402
from kernels.sparsity import butterfly  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sass_counts(cubin: bytes) -> tuple[int, int, Counter]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", mm.group(1)).split()[0].split(".")[0]
                  for mm in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", sass, re.MULTILINE))
    ops.pop("NOP", None)
    return int(m.group(1)), int(m.group(2)), ops


def blocksparse_rows(n: int = 16384, d: int = 128):
    batch, nheads = max(1, 16384 // n), 2048 // d
    q, k, v, o, do = (torch.empty(batch, n, nheads, d, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.empty(batch, nheads, n, dtype=torch.float32)
    captured = []
    B.launch = lambda kernel, grid, args, consts: captured.append((kernel, args, consts))
    F.launch = B.launch
    tables = B._kernel_tables(butterfly(n, n, 128), False, d, "cpu", False, n, n)
    B._bs_backward(do, q, k, v, o, lse, torch.zeros(1, dtype=torch.int64), tables, 128, False, d ** -0.5, 0.0)
    kernel, args, consts = next(c for c in captured if c[0] is B._bs_bwd_kernel)
    backend = make_backend(TARGET)
    for aligned in (False, True):
        kw = dict(consts, LSE_ALIGNED=aligned, debug=False, instrumentation_mode="")
        bound, spec, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(*args, **kw)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, spec, opts)
        compiled = triton.compile(triton.compiler.ASTSource(kernel, signature, constexprs, attrs), target=TARGET,
                                  options=options.__dict__)
        regs, stack, ops = sass_counts(compiled.asm["cubin"])
        tiles = tuple(consts[k_] for k_ in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps", "num_stages"))
        yield f"block-sparse bwd, hd {d}, {n} tokens, {tiles}", aligned, regs, stack, ops


def dense_rows():
    for d, causal, cfgs in ((64, True, [(64, 64, 4, 3), (32, 128, 4, 3)]), (64, False, [(32, 128, 4, 3)]),
                            (128, True, [(32, 128, 8, 2)])):
        for dropout in (False, True):
            for m, n, w, s in cfgs:
                for aligned in (False, True):
                    consts = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=causal, VARLEN=False,
                                  HAS_DROPOUT=dropout, GQA=False, LSE_ALIGNED=aligned)
                    r = KR.resources(F._bwd_dkdv_kernel, consts, w, s, sass=True)
                    yield (f"dense dK/dV, hd {d}, {'causal' if causal else 'non-causal'}, dropout {dropout}, "
                           f"{(m, n, w, s)}", aligned, r["regs"], r["stack"], Counter(r["ops"]))


print(f"sm_90, triton {triton.__version__}, torch {torch.__version__}; static SASS counts")
print("| kernel, config | LSE_ALIGNED | registers | spill bytes | SASS instructions | LDGSTS |")
print("|---|---|---:|---:|---:|---:|")
for rows in (blocksparse_rows(), dense_rows()):
    for name, aligned, regs, stack, ops in rows:
        print(f"| {name} | {aligned} | {regs} | {stack} | {sum(ops.values())} | {ops.get('LDGSTS', 0)} |", flush=True)
