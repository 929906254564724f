"""The shipped Gluon kernels' sm_90 SASS, one line per launch config: instruction count and a hash of the instruction
text with addresses and constant-bank offsets stripped (so a new kernel argument alone does not change it). Run in two
checkouts (copy it into the older one), the lines tell whether a source change altered what runs: the backward at head
dims 64 (`_bwd_split_kernel`, dropout or not), 128 and 256, the forward at 64 and 128.

    python results/attention/gluon_bwd_early_release/sass_signature.py
"""
import hashlib
import itertools
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
            t = re.sub(r"0x[0-9a-f]{6,}", "ADDR", t)
            ins.append(t)
    return len(ins), hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12]


def bwd_sig(hd: int, causal: bool, **flags):
    """`_bwd_kernel`'s signature at head dim hd (128 / 256) with the launcher's tiles and STATS_AT_USE, plus flags."""
    bm, bn, st, dqs = G.BWD_TILES[hd]
    lay = G.bwd_layouts(hd, gl.bfloat16, False)
    d = lambda r, l, t="bf16": R.tensordesc(t, [r, hd], lay[l])  # noqa: E731
    types = dict(q_desc=d(bm, "q_layout"), do_desc=d(bm, "q_layout"), k_desc=d(bn, "kv_layout"),
                 v_desc=d(bn, "kv_layout"), dk_desc=d(bn, "kv_layout"), dv_desc=d(bn, "kv_layout"),
                 dqa_desc=d(bm, "dqa_layout", "fp32"))
    consts = dict(HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, DQ_STAGES=dqs, IS_CAUSAL=causal, WARPS=G.BWD_WARPS,
                  ds_layout=lay["ds_layout"], STATS_AT_USE=hd in G.BWD_STATS_AT_USE_HEAD_DIMS, **flags)
    return sig(G._bwd_kernel, consts, G.BWD_WARPS, st, types)


def split_sig(causal: bool, drop: bool):
    """`_bwd_split_kernel`'s at head dim 64, with or without dropout."""
    hd = 64
    bm, bn, st, dqs = G.BWD_TILES[hd]
    lay = G.bwd_layouts(hd, gl.bfloat16, True)
    d = lambda r, l, t="bf16": R.tensordesc(t, [r, hd], lay[l])  # noqa: E731
    types = dict(q_desc=d(bm, "q_layout"), do_desc=d(bm, "q_layout"), k_desc=d(bn, "kv_layout"),
                 v_desc=d(bn, "kv_layout"), dk_desc=d(lay["dkv_rows"], "dkv_layout"),
                 dv_desc=d(lay["dkv_rows"], "dkv_layout"),
                 dqa_desc=d(bm, "dqa_layout", "fp32"))
    consts = dict(HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, DQ_STAGES=dqs, IS_CAUSAL=causal,
                  ds_layout=lay["ds_layout"], KV_BUFFERS=G.BWD_SPLIT_KV_BUFFERS, PAIRED=causal,
                  CONSUMER_REGS=G.CONSUMER_REGS, HAS_DROPOUT=drop)
    return sig(G._bwd_split_kernel, consts, 4, st, types)


def fwd_sig(hd: int, causal: bool):
    """`_fwd_kernel`'s with the launcher's tiles and forms (fwd_forms) at head dim hd."""
    bm, bn, st, qb = G.FWD_TILES[hd]
    ql, kl = G._shared_layout(bm // 2, hd, gl.bfloat16), G._shared_layout(bn, hd, gl.bfloat16)
    types = dict(q_desc=R.tensordesc("bf16", [bm // 2, hd], ql), o_desc=R.tensordesc("bf16", [bm // 2, hd], ql),
                 k_desc=R.tensordesc("bf16", [bn, hd], kl), v_desc=R.tensordesc("bf16", [bn, hd], kl), LSE="*fp32")
    consts = dict(HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, Q_BUFFERS=qb, IS_CAUSAL=causal,
                  PAIRED=causal and G.fwd_persistent(hd, 4096, causal), CONSUMER_REGS=G.CONSUMER_REGS,
                  **G.fwd_forms(hd, causal))
    return sig(G._fwd_kernel, consts, 4, st, types)


def main():
    for hd, causal in itertools.product((128, 256), (False, True)):
        print("bwd", hd, causal, bwd_sig(hd, causal), flush=True)
    for causal, drop in itertools.product((False, True), (False, True)):
        print("bwd split 64", causal, drop, split_sig(causal, drop), flush=True)
    for hd, causal in itertools.product((64, 128), (False, True)):
        print("fwd", hd, causal, fwd_sig(hd, causal), flush=True)


if __name__ == "__main__":
    main()
