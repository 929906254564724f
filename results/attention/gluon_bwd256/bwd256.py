"""Prototype (session 27, not shipped): the Gluon backward at head dim 256 with its accumulators split across the two
compute warpgroups by head dim, after FlashAttention-3's head-dim-256 backward (Shah et al., 2024; its 64 x 64 tiles,
two MMA warpgroups, one stage of Q / dO / P, dS).

The shipped backward (kernels/flash_gluon.py `_bwd_kernel`) lays every accumulator out one warp per 16 rows over its
8 compute warps. With 64-key tiles, the only ones whose K, V, Q, dO and dQ tiles fit shared memory at head dim 256, a
64-row tile over 8 warps is held twice, so dK and dV alone take 256 registers a thread: 1,056-1,080 bytes of spills
(../launch_direct/bwd_compile_sm90.txt). Here every (64 x n) tile is laid out [4, 2]: 4 warps down the rows, the two
warpgroups side by side along the columns.

    S^T, dP^T   (64 keys x 64 queries): each warpgroup 32 of the queries, 16 registers a thread each
    P^T, dS^T   to shared memory (bf16), where both warpgroups read all of them as the A operand of
    dV, dK      (64 keys x 256): each warpgroup 128 of the head dim, 64 registers a thread each
    dQ_i        (64 queries x 256) = dS K: likewise 64 registers, into the float32 ring for the TMA reduce

~224 registers of tiles against the 240 the compute warps get (AllocateWarpGroups: 12 warps, 168 at launch).

Prediction (written before any GPU run): correct on the first run is not assumed (never run); once correct, 1.15-1.40x
the @triton.jit backward from 2K (the Gluon backward gave 1.24-1.39x at head dim 128) and at least FlashAttention-2's
backward at 16K, which would lift head dim 256's forward+backward from 0.99x FA2 there.

The loader and the dQ writer are the shipped ones. Compiled for sm_90 on the CPU machine (compile_sm90.txt): no
spills, 214 KB of shared memory, 168 registers at launch. Not yet run on a GPU.

    TRITON_INTERPRET=1 python results/attention/gluon_bwd256/bwd256.py    # sm_90 registers / spills / shared memory
    python results/attention/gluon_bwd256/bwd256.py check                  # GPU: against the @triton.jit backward,
                                                                          # and timed against it and FA2's
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from kernels.flash import LOG2E  # noqa: E402
from kernels.flash_gluon import _GL_DTYPES, _bwd_dq_writer, _bwd_loader, _shared_layout, head_tiles  # noqa: E402
from kernels.launch import launch  # noqa: E402

BLOCK_M, BLOCK_N, STAGES, DQ_STAGES = 64, 64, 1, 1


@gluon.constexpr_function
def _split_layout(n):
    """A (64 x n) wgmma accumulator over 8 warps: 4 down the rows, the two warpgroups side by side along n."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, n // 2, 16])


@gluon.constexpr_function
def _rows_only_layout(n):
    """The shipped backward's layout (one warp per 16 rows over 8 warps), for compile_report's control row."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, n, 16])


@gluon.jit
def _tile256(k_smem, v_smem, q_s, do_s, pt_smem, ds_smem, lse, delta, i, start_n, keys, qcols, st_init, dq_init,
             dv, dk, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    dtype: gl.constexpr = q_s.dtype
    st_tok = warpgroup_mma(k_smem, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    dpt_tok = warpgroup_mma(v_smem, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(1, (st_tok,))
    pt = gl.exp2(st * qk_scale - lse)
    if IS_CAUSAL:
        if i * BLOCK_M < start_n + BLOCK_N:
            queries = i * BLOCK_M + qcols
            pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
    pt_smem.store(pt.to(dtype))
    dpt = warpgroup_mma_wait(0, (dpt_tok,))
    ds_smem.store((pt * (dpt - delta)).to(dtype))
    fence_async_shared()  # both warpgroups' halves of P^T and dS^T, before the wgmma that read all of them
    dv_tok = warpgroup_mma(pt_smem, do_s, dv, is_async=True)
    dk_tok = warpgroup_mma(ds_smem, q_s, dk, is_async=True)
    dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_init, use_acc=False, is_async=True)
    dv, dk, dq = warpgroup_mma_wait(0, (dv_tok, dk_tok, dq_tok))
    return dv, dk, dq


@gluon.jit
def _compute256(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                kv_bar, ready, empty, dq_full, dq_empty, row0, col, start_n, lo, n_end, qk_scale, sm_scale,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    st_layout: gl.constexpr = _split_layout(BLOCK_M)
    acc_layout: gl.constexpr = _split_layout(HEAD_DIM)
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=acc_layout)
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=acc_layout)
    mbarrier.wait(kv_bar, 0)
    for i in range(lo, n_end):
        t = i - lo
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        lse = lse_smem.index(slot).load(st_layout)
        delta = delta_smem.index(slot).load(st_layout)
        dv, dk, dq = _tile256(k_smem, v_smem, q_smem.index(slot), do_smem.index(slot), pt_smem, ds_smem, lse, delta,
                              i, start_n, keys, qcols, st_init, dq_init, dv, dk, qk_scale, BLOCK_M, BLOCK_N,
                              IS_CAUSAL)
        mbarrier.arrive(empty.index(slot))
        s = t % DQ_STAGES
        mbarrier.wait(dq_empty.index(s), ((t // DQ_STAGES) & 1) ^ 1)
        dq_smem.index(s).store(dq)
        fence_async_shared()
        mbarrier.arrive(dq_full.index(s))
    k_smem.store((dk * sm_scale).to(k_smem.dtype))
    v_smem.store(dv.to(v_smem.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [row0 + start_n, col], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [row0 + start_n, col], v_smem)
    tma.store_wait(0)


@gluon.jit
def _bwd256_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, seqlen, nheads, qk_scale,
                   sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, ds_layout: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    col = h * HEAD_DIM
    row0 = b * seqlen
    start_n = pid_n * BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    lo = start_n // BLOCK_M if IS_CAUSAL else 0
    n_end = seqlen // BLOCK_M
    stat_base = bh.to(gl.int64) * seqlen
    gl.warp_specialize([
        (_compute256, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem,
                       delta_smem, kv_bar, ready, empty, dq_full, dq_empty, row0, col, start_n, lo, n_end, qk_scale,
                       sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, IS_CAUSAL)),
        (_bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, LSE,
                       DELTA, lse_smem, delta_smem, stat_base, row0, col, start_n, lo, n_end, BLOCK_M, STAGES)),
        (_bwd_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, row0, col, lo, n_end, BLOCK_M, DQ_STAGES))],
        [1, 1], [24, 24])


def backward256(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale, causal):
    """As kernels.flash_gluon.gluon_backward, at head dim 256 (MHA, seqlen a multiple of 64)."""
    batch, seqlen, nheads, head_dim = q.shape
    assert head_dim == 256 and seqlen % BLOCK_N == 0 and k.shape == q.shape
    dqa = torch.zeros(batch, seqlen, nheads, head_dim, dtype=torch.float32, device=q.device)
    dtype = _GL_DTYPES[q.dtype]
    rows_layout = _shared_layout(BLOCK_M, head_dim, dtype)
    keys_layout = _shared_layout(BLOCK_N, head_dim, dtype)
    launch(_bwd256_kernel, (seqlen // BLOCK_N, batch * nheads),
           (head_tiles(q, BLOCK_M, rows_layout), head_tiles(do, BLOCK_M, rows_layout),
            *(head_tiles(t, BLOCK_N, keys_layout) for t in (k, v, dk, dv)),
            head_tiles(dqa, BLOCK_M, _shared_layout(BLOCK_M, head_dim, gl.float32)), lse, delta, seqlen, nheads,
            softmax_scale * LOG2E, softmax_scale),
           dict(HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES, DQ_STAGES=DQ_STAGES,
                IS_CAUSAL=causal, ds_layout=_shared_layout(BLOCK_N, BLOCK_M, dtype), num_warps=8))
    torch.mul(dqa, softmax_scale, out=dq)


def check():
    """GPU: gradients against the @triton.jit backward on the same O and LSE (and bit-identical dK, dV on a rerun),
    then backward times against it and FlashAttention-2's (SDPA's flash backend: its forward+backward minus forward)."""
    import torch.nn.functional as TF
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import kernels.flash as F
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; head dim 256, bf16, 16K tokens, 8 heads; backward ms "
          f"(do_bench median); x: @triton.jit / prototype; err: max |g - g_triton| / max |g_triton|", flush=True)
    for n, causal in [(512, False), (2048, False), (2048, True), (8192, False), (16384, False), (16384, True)]:
        b, h, d = max(16384 // n, 1), 8, 256
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        delta = F.bwd_preprocess(o, do)
        ref = F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n, gluon=False)
        grads = tuple(torch.empty_like(x) for x in (q, k, v))

        def proto():
            backward256(do, q, k, v, lse, delta, *grads, scale, causal)

        proto()
        torch.cuda.synchronize()
        err = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(grads, ref))
        first = tuple(g.clone() for g in grads)
        proto()
        rerun = torch.equal(first[1], grads[1]) and torch.equal(first[2], grads[2])
        t_proto = do_bench(proto, warmup=25, rep=60, return_mode="median")
        t_triton = do_bench(lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None,
                                                 n, n, delta=delta, gluon=False), warmup=25, rep=60,
                            return_mode="median")
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            f2 = do_bench(lambda: TF.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=25, rep=60,
                          return_mode="median")
            fb2 = do_bench(lambda: torch.autograd.grad(TF.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                                       (qt, kt, vt), do.transpose(1, 2)), warmup=25, rep=60,
                           return_mode="median")
        print(f"n {n:>5} {'causal' if causal else 'full  '} | prototype {t_proto:.3f} | triton {t_triton:.3f} "
              f"x{t_triton / t_proto:.2f} | FA2 bwd {fb2 - f2:.3f} x{(fb2 - f2) / t_proto:.2f} | err {err:.1e} | "
              f"dK, dV rerun identical: {rerun}", flush=True)


def compile_report():
    from tests.test_kernel_resources import compile_sm90
    print("BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, causal | registers at launch, spill stack (bytes a thread), shared "
          "memory (bytes), HGMMA count")
    for bm, bn, stages, dq_stages, control in [(64, 64, 1, 1, False), (64, 64, 1, 1, True)]:
        for causal in (False, True):
            setup = ("import sys; sys.path.insert(0, 'results/attention/gluon_bwd256'); import bwd256 as P; "
                     + ("P._split_layout = P._rows_only_layout; " if control else "") +
                     "import kernels.flash_gluon as G; from triton.experimental.gluon import language as gl; "
                     "lay = lambda r, c, t=gl.bfloat16: G._shared_layout(r, c, t); "
                     "desc = lambda r, t='bf16', dt=gl.bfloat16: R.tensordesc(t, [r, 256], lay(r, 256, dt))")
            consts = (f"dict(HEAD_DIM=256, BLOCK_M={bm}, BLOCK_N={bn}, STAGES={stages}, DQ_STAGES={dq_stages}, "
                      f"IS_CAUSAL={causal}, ds_layout=lay({bn}, {bm}))")
            types = (f"dict(q_desc=desc({bm}), do_desc=desc({bm}), "
                     f"**{{n: desc({bn}) for n in ('k_desc', 'v_desc', 'dk_desc', 'dv_desc')}}, "
                     f"dqa_desc=desc({bm}, 'fp32', gl.float32))")
            r = compile_sm90("P._bwd256_kernel", consts, 8, stages, setup, types)
            print(f"{bm}, {bn}, {stages}, {dq_stages}, {'causal' if causal else 'non-causal'}"
                  f"{', control: [8, 1] layouts' if control else ''} | {r['regs']}, {r['stack']}, {r['smem']}, "
                  f"{r['ops'].get('HGMMA', 0)}", flush=True)


if __name__ == "__main__":
    check() if sys.argv[1:] == ["check"] else compile_report()
