"""Head dim 256's shipped Gluon kernels as sm_90 SASS signatures (instruction count and a hash of the instruction text
with addresses and constant-bank offsets stripped, as ../gluon_bwd_early_release/sass_signature.py does): the forward
with its launcher forms (K_AHEAD) and the backward with its shipped flags (STATS_AHEAD, EARLY_RELEASE). Run in two
checkouts, the lines tell whether a source change altered what runs there (`sass_signature_256.txt`: SERIAL added,
off, against 9a54a5f).

    python results/attention/gluon_fwd_serial/sass_signature_256.py
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
from triton.experimental.gluon import language as gl  # noqa: E402

import kernel_resources as R  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sig(kernel, consts, warps, stages, types):
    c = R.compile_sm90(kernel, consts, warps, stages, types)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ins = []
    for line in sass.splitlines():
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(.*?);", line)
        if m:
            t = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[]", m.group(1))
            ins.append(re.sub(r"0x[0-9a-f]{6,}", "ADDR", t))
    return len(ins), hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12]


hd = 256
for causal in (False, True):
    bm, bn, st, qb = G.FWD_TILES[hd]
    ql, kl = G._shared_layout(bm // 2, hd, gl.bfloat16), G._shared_layout(bn, hd, gl.bfloat16)
    types = dict(q_desc=R.tensordesc("bf16", [bm // 2, hd], ql), o_desc=R.tensordesc("bf16", [bm // 2, hd], ql),
                 k_desc=R.tensordesc("bf16", [bn, hd], kl), v_desc=R.tensordesc("bf16", [bn, hd], kl), LSE="*fp32")
    consts = dict(HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, Q_BUFFERS=qb, IS_CAUSAL=causal, PAIRED=False,
                  CONSUMER_REGS=G.CONSUMER_REGS, **G.fwd_forms(hd, causal))
    print("fwd", hd, causal, sig(G._fwd_kernel, consts, 4, st, types), flush=True)
    bm, bn, st, dqs = G.BWD_TILES[hd]
    lay = G.bwd_layouts(hd, gl.bfloat16, False)
    d = lambda r, l, t="bf16": R.tensordesc(t, [r, hd], lay[l])  # noqa: E731
    types = dict(q_desc=d(bm, "q_layout"), do_desc=d(bm, "q_layout"), k_desc=d(bn, "kv_layout"),
                 v_desc=d(bn, "kv_layout"), dk_desc=d(bn, "kv_layout"), dv_desc=d(bn, "kv_layout"),
                 dqa_desc=d(bm, "dqa_layout", "fp32"))
    consts = dict(HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, DQ_STAGES=dqs, IS_CAUSAL=causal, WARPS=G.BWD_WARPS,
                  ds_layout=lay["ds_layout"], STATS_AT_USE=False, STATS_AHEAD=True, EARLY_RELEASE=True)
    print("bwd shipped flags", hd, causal, sig(G._bwd_kernel, consts, G.BWD_WARPS, st, types), flush=True)
