"""Compile-only probe (sm_90, on the CPU machine): the dK/dV kernel computing each tile in the scores' own
orientation (S = Q K^T, queries as rows) instead of the transposed one (S^T = K Q^T, keys as rows).

Why: the dropout mask is drawn in the scores' own MMA layout, where one Philox call's outputs sit in one thread
(kernels/flash.py `dropout_keep`). The shipped dK/dV kernel works on S^T, so it draws the tile in the (query, key)
orientation and moves it into S^T's layout through shared memory (`tl.trans` of an int8 tile); with 8-bit values
(16 scores a call, half the Philox work: results/attention/dropout_variants/) that move got costlier still (more
stores, barriers and 240 bytes of spills, see below), which is why 8-bit lost in the backward. In the natural
orientation the draw needs no move for either stream; instead P and dS must reach the dV += P^T dO and
dK += dS^T Q products transposed: as bf16 tiles, which wgmma can read from shared memory.

This compiles `_bwd_dkdv_kernel` with `_dkdv_tile` swapped for `natural_tile` (the same inputs and outputs), at
head dim 64, causal, dropout on, for the committed 16-bit stream and the 8-bit one, and prints static SASS totals,
registers, spills, shared memory and the opcodes that move data through shared memory.

    TRITON_INTERPRET=0 python results/attention/dkdv_natural/probe.py <variant> <stream> [kind]   # one, JSON
    python results/attention/dkdv_natural/probe.py [dkdv] [fused]                          # the tables

Measured before the change shipped (session 31; see README.md): there "shipped" is the keys-as-rows form
everywhere. From that commit on, `_dkdv_tile` picks the form by tile shape, so "shipped" here means that.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernels.flash as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dropout_variants"))
from dropout_variants import _bytes  # noqa: E402  (8-bit keep flags of one Philox word, its four bytes)

CONFIGS = [(32, 64, 4, 4), (64, 64, 4, 3), (64, 64, 8, 2), (64, 128, 8, 2), (128, 64, 8, 2)]
OPS = ("STS", "LDS", "BAR", "STL", "LDL", "PRMT", "HGMMA", "HMMA", "IMAD", "LOP3")


@triton.jit
def natural_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, start_m, offs_m, cols,
                 offs_d, seqlen_q, diag_offset, qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASK_ROWS: tl.constexpr):
    """kernels.flash._dkdv_tile's contract, computed on S = Q K^T (BLOCK_M queries x BLOCK_N keys)."""
    rows = start_m + offs_m
    q = F.load_tile(q_base, stride_qm, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, MASK_ROWS)
    do = F.load_tile(do_base, stride_dom, rows, offs_d, seqlen_q, HEAD_DIM, BLOCK_D, MASK_ROWS)
    lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
    delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    qk = tl.dot(q, tl.trans(k))
    p = tl.math.exp2(qk * qk_scale - lse[:, None])
    if MASK_CAUSAL:
        p = tl.where(cols[None, :] <= rows[:, None] + diag_offset, p, 0.0)
    dp = tl.dot(do, tl.trans(v)).to(tl.float32)
    if HAS_DROPOUT:
        keep = F.dropout_keep_tile(seed, bh, rows, tl.min(cols, 0), drop_thresh, cols.shape[0])
        pd = tl.where(keep, p * drop_scale, 0.0)
        dv = tl.dot(tl.trans(pd.to(do.dtype)), do, dv)
        dp = tl.where(keep, dp * drop_scale, 0.0)
    else:
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
    ds = (p * (dp - delta[:, None])).to(q.dtype)
    dk = tl.dot(tl.trans(ds), q, dk)
    return dk, dv, tl.trans(ds)


@triton.jit
def keep_tile_8bit(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    """results/attention/dropout_variants/ `new8bit_tile` with the committed Philox rounds: 16 scores a call
    (queries r, r + 8 x keys c, c + 1 + 8 j, j < 4), 8-bit values; BLOCK_N a multiple of 32."""
    BLOCK_M: tl.constexpr = rows.shape[0]
    t8 = (drop_thresh + 128) >> 8
    pair = tl.min(rows, 0) // 2 + tl.arange(0, BLOCK_M // 2)
    group = start_col // 8 + tl.arange(0, BLOCK_N // 8)
    c0 = group[None, :] + pair[:, None] * 0
    c1 = pair[:, None] + group[None, :] * 0
    x0, x1, x2, x3 = tl.philox(seed, c0, c1, c0 * 0 + bh, c0 * 0, F.PHILOX_ROUNDS)
    k = tl.join(tl.join(_bytes(x0, t8), _bytes(x2, t8)), tl.join(_bytes(x1, t8), _bytes(x3, t8)))
    k = tl.reshape(k, (BLOCK_M // 16, 8, BLOCK_N // 32, 4, 2, 2, 2, 2))
    k = tl.permute(k, (0, 6, 1, 2, 7, 5, 3, 4))
    return tl.reshape(k, (BLOCK_M, BLOCK_N)) != 0


def one(variant: str, stream: str, kind: str = "dkdv") -> dict:
    """kind "fused": the same kernel with FUSED_DQ (dQ added through the TMA reduce: kernels/flash.py `_fused_bwd`),
    where the natural orientation hands dS to dQ = dS K untransposed."""
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    from kernel_resources import resources

    if variant == "natural":
        F.__dict__["_dkdv_tile"] = natural_tile
    if stream == "8bit":
        F.__dict__["dropout_keep_tile"] = keep_tile_8bit
    out = {}
    for m, n, w, s in CONFIGS:
        c = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=True, VARLEN=False,
                 HAS_DROPOUT=stream != "none", GQA=False, **({"FUSED_DQ": True, "DQ_TMA": True} if kind == "fused" else {}))
        try:
            r = resources(F._bwd_dkdv_kernel, c, w, s, sass=True)
        except Exception as e:  # noqa: BLE001  (a tile this orientation cannot compile)
            out[str((m, n, w, s))] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            continue
        out[str((m, n, w, s))] = dict(total=sum(r["ops"].values()), regs=r["regs"], stack=r["stack"], smem=r["smem"],
                                      **{op: r["ops"].get(op, 0) for op in OPS})
    return out


def table():
    env = dict(os.environ, TRITON_INTERPRET="0")
    kinds = sys.argv[1:] or ["dkdv"]
    for kind in kinds:
        runs = {}
        for variant in ("shipped", "natural"):
            for stream in ("none", "16bit", "8bit"):
                res = subprocess.run([sys.executable, __file__, variant, stream, kind], capture_output=True, text=True,
                                     env=env)
                line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
                runs[variant, stream] = json.loads(line[0][7:]) if line else {"error": res.stderr[-300:]}
        print(f"sm_90, triton {triton.__version__}, `_bwd_dkdv_kernel`{' with FUSED_DQ' if kind == 'fused' else ''} "
              "at head dim 64, causal, MHA; static SASS (every instruction once, loops not weighted)")
        print("| config | orientation | stream | total | regs | spill B | smem B | " + " | ".join(OPS) + " |")
        print("|---|---|---|" + "---:|" * (4 + len(OPS)))
        for cfg in map(str, CONFIGS):
            for (variant, stream), r in runs.items():
                x = r.get(cfg, r)
                if "error" in x:
                    print(f"| {cfg} | {variant} | {stream} | {x['error'][:80]} |")
                    continue
                print(f"| {cfg} | {variant} | {stream} | {x['total']} | {x['regs']} | {x['stack']} | {x['smem']} | "
                      + " | ".join(str(x[op]) for op in OPS) + " |")
        print()


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] in ("shipped", "natural"):
        print("RESULT " + json.dumps(one(*sys.argv[1:])), flush=True)
    else:
        table()
