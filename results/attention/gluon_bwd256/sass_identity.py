"""A signature of the Gluon backward's SASS for sm_90 per head dim and causal flag: registers, spill stack, shared
memory, instruction count and a hash of the instruction text (addresses stripped). Run at two commits, it tells
whether a change to the kernel's source changed what runs at head dims 64 and 128 (sass_identity.txt).

    TRITON_INTERPRET=0 python results/attention/gluon_bwd256/sass_identity.py [head dims; default 64 128]
"""
import hashlib, os, re, subprocess, sys, tempfile
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
import triton
from triton.backends.compiler import GPUTarget
import kernel_resources as R
import kernels.flash_gluon as G
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

def tiles(hd):
    if hasattr(G, "BWD_TILES"):
        return G.BWD_TILES[hd]
    return G.BWD_BLOCK_M, G.BWD_BLOCK_N, G.BWD_STAGES, G.BWD_DQ_STAGES

for hd in map(int, sys.argv[1:] or (64, 128)):
    for causal in (False, True):
        bm, bn, st, dqs = tiles(hd)
        lay = G.bwd_layouts(hd, gl.bfloat16)
        d = lambda r, l, t="bf16": R.tensordesc(t, [r, hd], lay[l])
        types = dict(q_desc=d(bm, "q_layout"), do_desc=d(bm, "q_layout"),
                     **{n: d(bn, "kv_layout") for n in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
                     dqa_desc=d(bm, "dqa_layout", "fp32"))
        consts = dict(HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, DQ_STAGES=dqs, IS_CAUSAL=causal,
                      WARPS=G.BWD_WARPS, ds_layout=lay["ds_layout"])
        jf = G._bwd_kernel
        names = jf.arg_names
        sig = {a: ("constexpr" if a in consts else types.get(a) or ("*fp32" if a in ("LSE", "DELTA") else
               ("fp32" if a in ("qk_scale", "sm_scale") else "i32"))) for a in names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if sig[a].startswith("*")}
        src = GluonASTSource(fn=jf, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": G.BWD_WARPS, "num_stages": st})
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"]); f.flush()
            sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
            res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        ins = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*;)", sass)]
        m = re.search(r"REG:(\d+) STACK:(\d+)", res)
        print(hd, causal, "regs", m.group(1), "stack", m.group(2), "smem", c.metadata.shared, "n_ins", len(ins),
              "sha", hashlib.sha1("\n".join(ins).encode()).hexdigest()[:16], flush=True)
