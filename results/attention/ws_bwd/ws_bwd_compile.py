"""Compile-only (no GPU): do the WARP_SPEC dK/dV and dQ kernels warp-specialise for sm_90, with what registers/spills."""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernels.flash as F
from kernel_resources import _TYPES, _TENSORS, _FLOATS, _DIVISIBLE

def build(jitfn, consts, warps, stages):
    names = jitfn.arg_names
    sig = {}
    for a in names:
        if a in consts: sig[a] = "constexpr"
        elif a in _TYPES: sig[a] = _TYPES[a]
        else: sig[a] = "*bf16" if a in _TENSORS else ("fp32" if a in _FLOATS else "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if sig[a].startswith("*") or a.startswith(_DIVISIBLE)}
    src = ASTSource(fn=jitfn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return "warp_specialize" in c.asm["ttgir"], int(m.group(1)), int(m.group(2)), c.metadata.shared

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
for kind, fn in (("dkdv", F._bwd_dkdv_kernel), ("dq", F._bwd_dq_kernel)):
    for causal in (False, True):
        for (m, n, w, s) in [(64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 4, 2), (32, 128, 4, 2), (128, 64, 4, 2), (128, 128, 4, 2), (64, 64, 4, 3)]:
            consts = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=causal, VARLEN=False, HAS_DROPOUT=False, WARP_SPEC=True)
            if "REVERSE" in fn.arg_names: consts["REVERSE"] = causal
            try:
                ws, regs, stack, smem = build(fn, consts, w, s)
                print(f"{kind} d{d} causal={causal} ({m},{n},{w},{s}): specialised={ws} regs={regs} stack={stack} smem={smem}", flush=True)
            except Exception as e:
                print(f"{kind} d{d} causal={causal} ({m},{n},{w},{s}): FAILED {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)
