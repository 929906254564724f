"""Dropout-mask variants of the flash kernels, GPU time only (CUDA-graph replays), at the GPT-2 small attention
shape (B 16, N 1024, H 12, D 64, causal, bf16; SHAPE=B,N,H,D,causal for another, e.g. SHAPE=4,16384,4,16,0 for
Path-X's model), FLASH_AUTOTUNE=0 configs. Each variant runs in its own process
(the mask function is patched before anything compiles).

    python results/attention/dropout_variants/dropout_variants.py         # GPU: every variant, a table
    python results/attention/dropout_variants/dropout_variants.py --sass  # CPU: static SASS totals (sm_90)

Variants: none (p = 0); old (8 consecutive keys per Philox call, interleaved: the stream before 05a380c);
new (the committed stream: 2 x 4 scores per call in the MMA layout, Philox 7 rounds since 2026-11-26);
new10 (the same with 10 rounds: the committed stream of e0a92e6, measured as `new` then; its 7-round form was `new7`);
new8bit (2 x 8 scores per call, 8-bit values, 32-key period: half the Philox calls, p quantised to 1/256);
stored (the forward stores the mask as bits, the backward loads it: stored_mask.py, which says how).
Only new draws the documented mask; the others are timing experiments."""
import json, math, os, subprocess, sys
sys.path.insert(0, "scripts"); sys.path.insert(0, "."); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton
import triton.language as tl

import kernels.flash as F  # the committed stream's helpers

VARIANTS = ["none", "old", "new", "new10", "new8bit", "stored"]


@triton.jit
def _old_halves(x, drop_thresh):
    lo = ((x & 0xFFFF).to(tl.int32) >= drop_thresh).to(tl.int8)
    hi = ((x >> 16).to(tl.int32) >= drop_thresh).to(tl.int8)
    return tl.interleave(lo, hi)


@triton.jit
def old_tile(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    g = start_col // 8 + tl.arange(0, BLOCK_N // 8)
    c0 = g[None, :] + rows[:, None] * 0
    c1 = rows[:, None] + g[None, :] * 0
    x0, x1, x2, x3 = tl.philox(seed, c0, c1, c0 * 0 + bh, c0 * 0)
    k0, k1 = _old_halves(x0, drop_thresh), _old_halves(x1, drop_thresh)
    k2, k3 = _old_halves(x2, drop_thresh), _old_halves(x3, drop_thresh)
    return tl.interleave(tl.interleave(k0, k2), tl.interleave(k1, k3)) != 0


@triton.jit
def _bytes(x, t8):
    b0 = ((x & 0xFF).to(tl.int32) >= t8).to(tl.int8)
    b1 = (((x >> 8) & 0xFF).to(tl.int32) >= t8).to(tl.int8)
    b2 = (((x >> 16) & 0xFF).to(tl.int32) >= t8).to(tl.int8)
    b3 = ((x >> 24).to(tl.int32) >= t8).to(tl.int8)
    return tl.join(tl.join(b0, b1), tl.join(b2, b3))  # (..., b, jjlo)


@triton.jit
def new8bit_tile(seed, bh, rows, start_col, drop_thresh, BLOCK_N: tl.constexpr):
    BLOCK_M: tl.constexpr = rows.shape[0]
    t8 = (drop_thresh + 128) >> 8
    pair = tl.min(rows, 0) // 2 + tl.arange(0, BLOCK_M // 2)
    group = start_col // 8 + tl.arange(0, BLOCK_N // 8)  # 4 (col // 32) + (col % 8) // 2
    c0 = group[None, :] + pair[:, None] * 0
    c1 = pair[:, None] + group[None, :] * 0
    x0, x1, x2, x3 = tl.philox(seed, c0, c1, c0 * 0 + bh, c0 * 0)
    k = tl.join(tl.join(_bytes(x0, t8), _bytes(x2, t8)), tl.join(_bytes(x1, t8), _bytes(x3, t8)))  # (.., b, jjlo, rb, jjhi)
    k = tl.reshape(k, (BLOCK_M // 16, 8, BLOCK_N // 32, 4, 2, 2, 2, 2))  # (a, i, h, q, b, jjlo, rb, jjhi)
    k = tl.permute(k, (0, 6, 1, 2, 7, 5, 3, 4))                          # (a, rb, i, h, jjhi, jjlo, q, b)
    return tl.reshape(k, (BLOCK_M, BLOCK_N)) != 0


def patch(variant, bits=None):
    if variant == "stored":  # the forward's step and the backward's tile swapped, the seed slot holding `bits`
        import stored_mask
        import torch

        stored_mask.patch_stored(bits if bits is not None else torch.zeros(1, dtype=torch.uint8))
        return F
    fn = {"old": old_tile, "new8bit": new8bit_tile}.get(variant)
    if fn is not None:
        F.__dict__["dropout_keep_tile"] = fn
    if variant == "new10":  # the committed tile with 10 rounds (set before anything compiles)
        F.PHILOX_ROUNDS = tl.constexpr(10)
    return F


def sass(variant):
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    from kernel_resources import resources
    F = patch(variant)
    out = {}
    for name, fn, cfg in (("fwd", F._fwd_kernel, (64, 64, 4, 3)), ("dkdv", F._bwd_dkdv_kernel, (16, 64, 4, 4)),
                          ("dq", F._bwd_dq_kernel, (64, 32, 4, 4))):
        m, n, w, s = cfg
        c = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=True, VARLEN=False,
                 HAS_DROPOUT=variant != "none")
        if "REVERSE" in fn.arg_names:
            c["REVERSE"] = True
        r = resources(fn, c, w, s, sass=True)
        out[name] = (sum(r["ops"].values()), r["regs"], r["stack"])
    return out


def gpu(variant, rep):
    import torch
    os.environ["FLASH_AUTOTUNE"] = "0"
    b, n, h, d, causal = (int(x) for x in os.environ.get("SHAPE", "16,1024,12,64,1").split(","))
    if variant == "stored":
        import stored_mask
        F = patch(variant, stored_mask.bits_buffer(b, n, h, "cuda"))
    else:
        F = patch(variant)
    causal = bool(causal)
    p = 0.0 if variant == "none" else 0.1
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, n, 3, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = qkv.unbind(2)
    do = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1.0 / math.sqrt(d)
    fwd = lambda: F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n, warp_spec=False)
    torch.manual_seed(0)
    o, lse, seed = fwd()
    delta = F.bwd_preprocess(o, do)
    bwd = lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n, delta=delta)
    res = {"fwd_ms": triton.testing.do_bench_cudagraph(fwd, rep=rep, return_mode="median"),
           "bwd_ms": triton.testing.do_bench_cudagraph(bwd, rep=rep, return_mode="median")}
    if variant in ("none", "new"):  # the peer in the same process: SDPA's FlashAttention-2 backend
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            f = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal)
            res["sdpa_flash_fwd_ms"] = triton.testing.do_bench_cudagraph(f, rep=rep, return_mode="median")
            def fb():
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal)
                torch.autograd.grad(out, (qt, kt, vt), dot)
            res["sdpa_flash_fwdbwd_ms"] = triton.testing.do_bench_cudagraph(fb, rep=rep, return_mode="median")
    return res


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        v, mode = sys.argv[2], sys.argv[3]
        print("RESULT " + json.dumps(sass(v) if mode == "sass" else gpu(v, int(os.environ.get("REP", 100)))), flush=True)
        sys.exit(0)
    mode = "sass" if "--sass" in sys.argv else "gpu"
    rounds = int(os.environ.get("ROUNDS", 1 if mode == "sass" else 3))
    table = {}
    for r in range(rounds):  # alternate the variants, several rounds: the GPU is shared and noisy
        for v in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--one", v, mode], capture_output=True, text=True)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            res = json.loads(line[0][7:]) if line else {"error": (out.stderr or out.stdout)[-400:]}
            table.setdefault(v, []).append(res)
            print(r, v, res, flush=True)
    print("SUMMARY " + json.dumps(table))
