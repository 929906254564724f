"""Prepared GPU experiment: the forward stores its dropout mask as bits; the backward loads them instead of
drawing the mask again (twice: the dK/dV and the dQ kernels each redraw it today).

At the GPT-2 small shape (16 x 1024, 12 heads, hd 64, causal, p 0.1) dropout adds 0.049 ms to our forward and
0.154 ms to our backward (h100_philox7.txt: 0.152 vs 0.103 and 0.458 vs 0.304), against 0.087 ms in all for
FlashAttention-2, and the backward's two redraws are most of GPT-2's remaining end-to-end gap to attn=sdpa
(0.985-0.99x). Each Philox4x32-7 call gives 8 keep bits (queries r, r + 8 x keys c, c + 1, c + 8, c + 9), so the
mask is stored in the counter's own index space: one byte per (query pair, key group), N/2 x N/4 bytes per head,
N^2 / 8 bytes in all (25 MB per GPT-2 layer; 1/16 of what standard attention keeps for P alone). Storing is a pack
of the 8 flags the forward already has; loading is one byte per 8 scores, then the same register renaming as
`dropout_keep_tile`, so both sides produce the mask in the scores' own layout with no shuffle.
First prediction (before compiling): backward 0.30-0.33 ms instead of 0.458 (load + unpack ~20% of a draw),
forward +0.005-0.01 ms, GPT-2 end to end +2-3%. The sm_90 compile says otherwise (static SASS instructions,
`dropout_variants.py --one V sass`, FLASH_AUTOTUNE=0 configs, 2026-11-26):

    variant   forward   dK/dV   dQ      (instructions; registers 130-170 / 238-250 / 96-116, no spills)
    none      1744      1352    1176
    new       2248      1760    1528    dropout adds 504 / 408 / 352: the shipped draw
    stored    2768      1648    1408    adds 1024 / 296 / 232: loading + unpacking saves only ~30% of a draw,
                                        while packing and storing (four scattered byte stores per thread and tile)
                                        doubles the forward's dropout code

so the revised prediction is about even (backward -0.03 to -0.05 ms, forward +0.02 to +0.05). Kept as a ready
variant of dropout_variants.py for a device run, not integrated. What would change the sums: a store layout
that one thread writes as one wide store (the four bytes of a thread adjacent), and an unpack that tests bits in
place ((byte & (1 << i)) != 0) instead of shifting each out.

How it runs without touching the shipped kernels (timing only; the integration would pass the buffer as a kernel
argument): the seed tensor the kernels load carries the bit buffer's address instead of a seed, the forward's
block step is replaced by one that draws with a fixed Philox key and stores, and `dropout_keep_tile` (what both
backward steps call) by one that loads. Everything is patched before anything compiles, in its own process, as
in dropout_variants.py, whose GPU harness this reuses (variant "stored").

    TRITON_INTERPRET=1 python results/attention/dropout_variants/stored_mask.py check   # CPU: same gradients as
                                                                                       # drawing with that key
    python results/attention/dropout_variants/dropout_variants.py                      # GPU (with "stored")
"""
import os
import sys
import types

sys.path.insert(0, ".")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernels.flash as F  # noqa: E402
from kernels.flash import PHILOX_ROUNDS  # noqa: E402

FIXED_KEY = tl.constexpr(1234)  # the Philox key of the stored run (the seed slot holds the buffer's address)
_N = int(os.environ.get("SHAPE", "16,1024,12,64,1").split(",")[1])
GROUPS = tl.constexpr(4 * triton.cdiv(_N, 16))    # key groups per query pair: the row stride of one head's bytes
HEAD_BYTES = tl.constexpr(8 * triton.cdiv(_N, 16) * 4 * triton.cdiv(_N, 16))


@triton.jit
def _flags(x, drop_thresh):
    return ((x & 0xFFFF).to(tl.int32) >= drop_thresh).to(tl.int32), ((x >> 16).to(tl.int32) >= drop_thresh).to(tl.int32)


@triton.jit
def _to_tile(b0, b1, b2, b3, b4, b5, b6, b7, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The 8 flags of each Philox call (x0 lo/hi, x1 lo/hi, x2 lo/hi, x3 lo/hi) -> the (BLOCK_M, BLOCK_N) mask in
    the scores' layout: dropout_keep_tile's join / reshape / permute."""
    k = tl.join(tl.join(tl.join(b0.to(tl.int8), b1.to(tl.int8)), tl.join(b4.to(tl.int8), b5.to(tl.int8))),
                tl.join(tl.join(b2.to(tl.int8), b3.to(tl.int8)), tl.join(b6.to(tl.int8), b7.to(tl.int8))))
    k = tl.reshape(k, (BLOCK_M // 16, 8, BLOCK_N // 16, 4, 2, 2, 2))
    k = tl.permute(k, (0, 5, 1, 2, 6, 3, 4))
    return tl.reshape(k, (BLOCK_M, BLOCK_N)) != 0


@triton.jit
def _byte_offsets(bh, rows, start_col, BLOCK_N: tl.constexpr):
    BLOCK_M: tl.constexpr = rows.shape[0]
    pair = tl.min(rows, 0) // 2 + tl.arange(0, BLOCK_M // 2)
    group = start_col // 4 + tl.arange(0, BLOCK_N // 4)
    return bh.to(tl.int64) * HEAD_BYTES + pair[:, None] * GROUPS + group[None, :], pair, group


@triton.jit
def stored_keep_tile(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    """Backward: load the bytes the forward stored (seed = the buffer's address) and unpack."""
    BLOCK_M: tl.constexpr = rows.shape[0]
    offs, pair, group = _byte_offsets(bh, rows, start_col, BLOCK_N)
    byte = tl.load(seed.to(tl.pointer_type(tl.uint8)) + offs)
    # each flag tested in place (nonzero = keep; _to_tile's int8 moves keep any nonzero value), no shifts
    return _to_tile(byte & 1, byte & 2, byte & 4, byte & 8, byte & 16, byte & 32, byte & 64, byte & 128,
                    BLOCK_M, BLOCK_N)


@triton.jit
def _draw_flags(bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    """dropout_keep_tile's Philox call with the fixed key; its 8 keep flags per call as int32 0/1 tiles, and the
    bytes' offsets."""
    offs, pair, group = _byte_offsets(bh, rows, start_col, BLOCK_N)
    c0 = group[None, :] + pair[:, None] * 0
    c1 = pair[:, None] + group[None, :] * 0
    x0, x1, x2, x3 = tl.philox(FIXED_KEY, c0, c1, c0 * 0 + bh, c0 * 0, PHILOX_ROUNDS)
    b0, b1 = _flags(x0, drop_thresh)
    b2, b3 = _flags(x1, drop_thresh)
    b4, b5 = _flags(x2, drop_thresh)
    b6, b7 = _flags(x3, drop_thresh)
    return offs, b0, b1, b2, b3, b4, b5, b6, b7


@triton.jit
def drawn_keep_tile(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    """The reference: dropout_keep_tile's draw with the fixed key (what the stored run stores)."""
    _, b0, b1, b2, b3, b4, b5, b6, b7 = _draw_flags(bh, rows, start_col, drop_thresh, BLOCK_N)
    return _to_tile(b0, b1, b2, b3, b4, b5, b6, b7, rows.shape[0], BLOCK_N)


@triton.jit
def storing_keep_tile(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    """Forward: draw with the fixed key, store the 8 flags of each call as one byte (seed = the buffer's address)."""
    offs, b0, b1, b2, b3, b4, b5, b6, b7 = _draw_flags(bh, rows, start_col, drop_thresh, BLOCK_N)
    byte = b0 | (b1 << 1) | (b2 << 2) | (b3 << 3) | (b4 << 4) | (b5 << 5) | (b6 << 6) | (b7 << 7)
    tl.store(seed.to(tl.pointer_type(tl.uint8)) + offs, byte.to(tl.uint8))
    return _to_tile(b0, b1, b2, b3, b4, b5, b6, b7, rows.shape[0], BLOCK_N)


def storing_fwd_block_step():
    """kernels.flash.fwd_block_step's own code, compiled with `dropout_keep_tile` bound to `storing_keep_tile` (the
    backward's steps, which read the module's globals, get the loading tile)."""
    fn = F.fwd_block_step.fn
    scope = dict(fn.__globals__, dropout_keep_tile=storing_keep_tile)
    return triton.jit(types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__))


def patch_stored(bits):
    """Before anything compiles: the forward stores into `bits`, the backward loads from it."""
    import torch

    F.__dict__["fwd_block_step"] = storing_fwd_block_step()
    F.__dict__["dropout_keep_tile"] = stored_keep_tile
    F.draw_dropout_seed = lambda device: torch.tensor([bits.data_ptr()], dtype=torch.int64, device=device)


def bits_buffer(b, n, h, device):
    import torch

    return torch.zeros(b * h * 8 * triton.cdiv(n, 16) * 4 * triton.cdiv(n, 16), dtype=torch.uint8, device=device)


def run(b, n, h, d, causal, p, device, dtype, stored):
    """(o, dq, dk, dv) of one forward+backward in this process's patched or reference form."""
    import torch

    torch.manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device=device, dtype=dtype) for _ in range(4))
    scale = d ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n, warp_spec=False)
    grads = F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n)
    return (o, *grads)


def check():
    """Under the interpreter, two processes: drawing with the fixed key vs storing and loading."""
    import subprocess

    import torch

    shapes = [(1, 64, 2, 16, False), (2, 80, 2, 32, True)]
    if len(sys.argv) > 2:
        b, n, h, d, causal = shapes[int(sys.argv[3])]
        if sys.argv[2] == "stored":
            patch_stored(bits_buffer(b, n, h, "cpu"))
        else:
            F.__dict__["dropout_keep_tile"] = drawn_keep_tile
        out = run(b, n, h, d, causal, 0.3, "cpu", torch.float32, sys.argv[2] == "stored")
        torch.save([t.clone() for t in out], sys.argv[4])
        return
    import tempfile

    for i, shape in enumerate(shapes):
        res = {}
        for mode in ("drawn", "stored"):
            path = tempfile.mktemp(suffix=".pt")
            env = dict(os.environ, SHAPE=",".join(str(x) for x in (*shape[:4], int(shape[4]))))
            subprocess.run([sys.executable, __file__, "check", mode, str(i), path], check=True, env=env)
            res[mode] = torch.load(path)
        err = [float((a - r).abs().max()) for a, r in zip(res["stored"], res["drawn"])]
        print(shape, "max|d| (o, dq, dk, dv) stored vs drawn:", err, flush=True)
        assert max(err) == 0.0, err
    print("stored == drawn with the same key: OK")


if __name__ == "__main__":
    check()
