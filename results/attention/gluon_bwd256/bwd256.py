"""The Gluon backward at head dim 256 (kernels/flash_gluon.py `_bwd_kernel` with BWD_TILES[256]): compiled for sm_90
on the CPU machine, and the GPU check that decided whether, and from which length, 256 joins BWD_HEAD_DIMS (run in
session 29: check_h100.txt; 1.08-1.30x the @triton.jit backward, shipped from 512 non-causal / 1K causal).

The tiles are FlashAttention-3's head-dim-256 backward's (Shah et al., 2024): 64 x 64, two MMA warpgroups, one stage
of Q / dO, P^T and dS^T through shared memory. With 64-key tiles, the only ones whose K, V, Q, dO and dQ tiles fit
shared memory at head dim 256, the head-dim-64/128 layout (one warp per 16 rows over 8 compute warps) holds a 64-row
tile twice, so dK and dV alone take 256 registers a thread and the kernel spills. `_tile_layout` splits such tiles
across the two warpgroups along their columns instead:

    S^T, dP^T   (64 keys x 64 queries): each warpgroup 32 of the queries, 16 registers a thread each
    P^T, dS^T   to shared memory (bf16), where both warpgroups read all of them as the A operand of
    dV, dK      (64 keys x 256): each warpgroup 128 of the head dim, 64 registers a thread each
    dQ_i        (64 queries x 256) = dS K: likewise 64 registers, into the float32 ring for the TMA reduce

It was a standalone prototype in session 27 (no spills, 214 KB); session 28 moved it into the shipped kernel, whose
SASS at head dims 64 and 128 stayed instruction for instruction the same (compile_sm90.txt).

Prediction (written before any GPU run): 1.15-1.40x the @triton.jit backward from 2K (the Gluon backward gave
1.24-1.39x at head dim 128) and at least FlashAttention-2's backward at 16K, which would lift head dim 256's
forward+backward from 0.99x FA2 there (results/attention/h100.md).

    TRITON_INTERPRET=1 python results/attention/gluon_bwd256/bwd256.py   # sm_90 registers, spills, shared memory
    python results/attention/gluon_bwd256/bwd256.py check                # GPU: gradients and times (below)
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

SHAPES = [(512, False), (512, True), (1024, False), (1024, True), (2048, False), (2048, True), (4096, False),
          (4096, True), (8192, False), (8192, True), (16384, False), (16384, True)]


def enable(on: bool) -> None:
    """Head dim 256 in the Gluon backward at every length (on), or as shipped."""
    G.BWD_HEAD_DIMS = (64, 128, 256) if on else tuple(d for d in G.BWD_HEAD_DIMS if d != 256)
    if on:
        G.BWD_MIN_SEQLEN = {**G.BWD_MIN_SEQLEN, (256, False): 0, (256, True): 0}


def check():
    """GPU, per shape (bf16, 16K tokens, 8 heads): the Gluon backward's gradients against the @triton.jit backward's
    on the same O and LSE, and whether a rerun gives bit-identical dK, dV; backward ms of both and of
    FlashAttention-2 (SDPA's flash backend: its forward+backward minus its forward); forward+backward ms through
    flash_attn_func with and without 256 in the Gluon backward, and FA2's."""
    import torch.nn.functional as TF
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    bench = lambda fn: do_bench(fn, warmup=25, rep=80, return_mode="median")  # noqa: E731
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; head dim 256, bf16, 16K tokens, 8 heads; ms, "
          "do_bench medians; err: max |g - g_triton| / max |g_triton| over dq, dk, dv; the @triton.jit kernels "
          f"{'autotuned' if F._autotuning() else 'at fixed configs (FLASH_AUTOTUNE=0): not the comparison to keep'}",
          flush=True)
    print("n causal | bwd: gluon, triton (x), FA2 (x) | fwd+bwd: with gluon bwd, without (x), FA2 (x) | err | "
          "dK, dV rerun identical", flush=True)
    for n, causal in SHAPES:
        b, h, d = max(16384 // n, 1), 8, 256
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        delta = F.bwd_preprocess(o, do)

        def bwd(gluon):
            return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n, delta=delta,
                                gluon=gluon)

        enable(True)
        why = F._gluon_bwd_unsupported(q, k, v, do, lse, delta, (q, k, v), causal, 0.0, False)
        if why is not None:
            print(f"{n} {causal} | not taken: {why}", flush=True)
            continue
        ref, got = bwd(False), bwd(True)
        torch.cuda.synchronize()
        err = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, ref))
        again = bwd(True)
        rerun = torch.equal(again[1], got[1]) and torch.equal(again[2], got[2])
        t_gluon, t_triton = bench(lambda: bwd(True)), bench(lambda: bwd(False))

        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        fwdbwd = lambda: torch.autograd.grad(F.flash_attn_func(qg, kg, vg, causal=causal), (qg, kg, vg), do)  # noqa
        fb_with = bench(fwdbwd)
        enable(False)
        fb_without = bench(fwdbwd)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            f2 = bench(lambda: TF.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            fb2 = bench(lambda: torch.autograd.grad(TF.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                                    (qt, kt, vt), do.transpose(1, 2)))
        print(f"{n:>5} {'causal' if causal else 'full  '} | bwd {t_gluon:.3f}, {t_triton:.3f} (x{t_triton / t_gluon:.2f}),"
              f" {fb2 - f2:.3f} (x{(fb2 - f2) / t_gluon:.2f}) | fwd+bwd {fb_with:.3f}, {fb_without:.3f} "
              f"(x{fb_without / fb_with:.2f}), {fb2:.3f} (x{fb2 / fb_with:.2f}) | err {err:.1e} | {rerun}", flush=True)


@gluon.constexpr_function
def _rows_only_layout(warps, rows, n):
    """compile_report's control: one warp per 16 rows whatever the tile, as at head dims 64 and 128."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 16])


def compile_report():
    """sm_90 compile of the shipped `_bwd_kernel` at head dim 256, and a control with the head-dim-128 layouts (one
    warp per 16 rows whatever the tile) to show what the split layouts remove."""
    from tests.test_flash_gluon import bwd_compile_sm90

    print("head dim, causal | registers at launch, spill stack (bytes a thread), shared memory (bytes), HGMMA count")
    rows_only = ("import sys; sys.path.insert(0, 'results/attention/gluon_bwd256'); import bwd256; "
                 "G._tile_layout = bwd256._rows_only_layout")
    for control in (False, True):
        for causal in (False, True):
            r = bwd_compile_sm90(256, causal, patch=rows_only if control else "")
            print(f"256, {'causal' if causal else 'non-causal'}{', control: one warp per 16 rows' if control else ''}"
                  f" | {r['regs']}, {r['stack']}, {r['smem']}, {r['ops'].get('HGMMA', 0)}", flush=True)


if __name__ == "__main__":
    check() if sys.argv[1:] == ["check"] else compile_report()
