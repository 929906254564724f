"""Prototype (session 23, not yet run on a GPU): the forward written in Gluon, Triton 3.6's explicit-layout dialect,
to do by hand on Hopper what `@triton.jit` leaves to the compiler: Q, K, V arrive by TMA (K and V in a STAGES-deep
ring, each tile behind its own mbarrier), the two matmuls are asynchronous wgmma, and the main loop has
FlashAttention-3's order (Shah et al., 2024, section 3.2), so that the scores of tile j are computed while the
product with tile j-1's probabilities is still on the tensor cores:

    per tile j = 1 .. n-1, one warpgroup per 64 query rows (8 warps: 128 rows):
    wait K(j); issue S(j) = Q K(j)^T                          (async)
    O *= alpha(j-1) (O into tile j-1's max frame); wait V(j-1); issue O += P(j-1) V(j-1)   (async, P in registers)
    wait until one wgmma is left: S(j) done; softmax of S(j) -> P(j), alpha(j)
    wait for the other: O done; refill tile j-1's ring slots with tile j-1+STAGES

then O += P(n-1) V(n-1), O /= l, O out through Q's shared tile by TMA, and the log-sum-exp (base 2, as
kernels/flash.py keeps it) to LSE.

What the sm_90 compile shows (CPU, `compile` and README.md): no spills at any config, and ptxas puts the second
wait right after the first, before the softmax's exponentials, whatever the source order (P in registers or in
shared memory, with or without the row-max shuffles). So the overlap within a warpgroup does not survive ptxas;
what overlaps is one warpgroup's softmax with the other's matmuls, as FlashAttention-3's authors say of theirs
(flash-attention issue #1764), which orders the two with named barriers (ping-pong). Variant "ws" does that: a
loader warp and two consumer warpgroups that take turns through mbarriers (its protocol is simulated on the CPU in
protocol_sim.py). It won on the H100 (README.md) and ships as kernels/flash_gluon.py, whose `_fwd_kernel` this file
now runs as "ws" (session 24's measurements ran this file's own copy of it, at 817f37a: the same kernel without
GQA and row strides).

Scope: dense self-attention, (batch, seqlen, heads, head_dim) contiguous bf16, head dim 64 or 128, seqlen a
multiple of the tiles, causal or not, no dropout. Not wired into kernels/: a device A/B decides whether the
route is worth the features.

    python results/attention/gluon_fwd/gluon_fwd.py compile    # CPU: compiles for sm_90, registers / spills / smem
    python results/attention/gluon_fwd/gluon_fwd.py check [plain|ws] [hd256]  # GPU: against float64 attention and ours
    python results/attention/gluon_fwd/gluon_fwd.py bench [plain ws] [hd256]  # GPU: forward ms against ours, FA2, cuDNN
    python results/attention/gluon_fwd/gluon_fwd.py short      # GPU: the shipped forward at 512-2K, with and without Gluon
"""
import math
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from kernels.flash_gluon import _fwd_kernel as _attn_fwd_ws, _softmax_tile  # noqa: E402

LOG2E = 1.4426950408889634


@gluon.jit
def head_tiles(ptr, total_rows, nheads, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr, layout: gl.constexpr):
    """TMA descriptor, built by the program, of contiguous (batch, seqlen, nheads, HEAD_DIM) data viewed as
    (batch * seqlen, nheads * HEAD_DIM), in blocks of BLOCK rows by one head (the shipped kernels take host-built
    ones: kernels.flash_gluon.head_tiles)."""
    return tma.make_tensor_descriptor(ptr, [total_rows, nheads * HEAD_DIM], [nheads * HEAD_DIM, 1],
                                      [BLOCK, HEAD_DIM], layout)


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, tile, slot, kv_row0, col, n_tiles,
             BLOCK_N: gl.constexpr, KV_BYTES: gl.constexpr):
    pred = tile < n_tiles
    mbarrier.expect(k_bars.index(slot), KV_BYTES, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [kv_row0 + tile * BLOCK_N, col], k_bars.index(slot), k_smem.index(slot),
                                    pred=pred)
    mbarrier.expect(v_bars.index(slot), KV_BYTES, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [kv_row0 + tile * BLOCK_N, col], v_bars.index(slot), v_smem.index(slot),
                                    pred=pred)


@gluon.jit
def _attn_fwd(Q, K, V, O, LSE, total_rows, seqlen, nheads, qk_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              IS_CAUSAL: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr, s_layout: gl.constexpr,
              o_layout: gl.constexpr, p_layout: gl.constexpr):
    dtype: gl.constexpr = Q.dtype.element_ty
    KV_BYTES: gl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    Q_BYTES: gl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    n_m = gl.num_programs(0)
    pid_m = gl.program_id(0)
    if IS_CAUSAL:  # the longest rows first, so the short ones fill the last wave
        pid_m = n_m - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    col = h * HEAD_DIM
    kv_row0 = b * seqlen
    start_m = pid_m * BLOCK_M
    q_desc = head_tiles(Q, total_rows, nheads, BLOCK_M, HEAD_DIM, q_layout)
    k_desc = head_tiles(K, total_rows, nheads, BLOCK_N, HEAD_DIM, kv_layout)
    v_desc = head_tiles(V, total_rows, nheads, BLOCK_N, HEAD_DIM, kv_layout)
    o_desc = head_tiles(O, total_rows, nheads, BLOCK_M, HEAD_DIM, q_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    if IS_CAUSAL:
        n_tiles = gl.cdiv(start_m + BLOCK_M, BLOCK_N)
        n_full = (start_m + 1) // BLOCK_N  # tiles whose last key every row of this tile sees: no mask
    else:
        n_tiles = seqlen // BLOCK_N
        n_full = n_tiles

    mbarrier.expect(q_bar, Q_BYTES)
    tma.async_copy_global_to_shared(q_desc, [kv_row0 + start_m, col], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, i, kv_row0, col, n_tiles, BLOCK_N, KV_BYTES)

    rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    # tile 0: scores and softmax, nothing to overlap with yet
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, (s_tok,))
    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, 0, rows, n_full < 1, IS_CAUSAL, s_layout)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
        # O into tile j-1's max frame now, before its P V, as FlashAttention-3 orders it: after the wait below
        # nothing reads O, so the compiler has no reason to pull that wait up into the softmax
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, (s_tok,))  # S(j) was issued first, so it is the one done
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j * BLOCK_N, rows, j >= n_full, IS_CAUSAL,
                                           s_layout)
        acc = warpgroup_mma_wait(0, (acc_tok,))
        _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j - 1 + STAGES, prev, kv_row0, col, n_tiles,
                 BLOCK_N, KV_BYTES)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    last = (n_tiles - 1) % STAGES
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, (acc_tok,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    q_smem.store(acc.to(dtype))  # Q is no longer read: its tile takes O on the way out
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [kv_row0 + start_m, col], q_smem)
    gl.store(LSE + bh.to(gl.int64) * seqlen + rows, m_i + gl.log2(l_i))
    tma.store_wait(0)

def layouts(head_dim: int, block_m: int, block_n: int, warps: int, dtype=gl.bfloat16) -> dict:
    """The kernel's layout constexprs for a (block_m, head_dim) query tile computed by `warps` warps (one per 16
    rows: warps / 4 warpgroups of 64 rows): shared (TMA + wgmma operands) and the wgmma accumulators'."""
    s_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, block_n, 16])
    o_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, head_dim, 16])
    return dict(q_layout=gl.NVMMASharedLayout.get_default_for([block_m, head_dim], dtype),
                kv_layout=gl.NVMMASharedLayout.get_default_for([block_n, head_dim], dtype),
                s_layout=s_layout, o_layout=o_layout,
                p_layout=gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))


# name -> (kernel, configs (BLOCK_M, BLOCK_N, STAGES, warps of the launch), constexprs beyond the tiles). "ws":
# the launch's 4 warps are consumer 0; consumer 1 (4 warps) and the loader (1 warp) are partitions beside it.
VARIANTS = {
    "plain": (_attn_fwd, [(128, 128, 2, 8), (128, 64, 3, 8), (128, 128, 3, 8), (64, 128, 2, 4)],
              lambda d, m, n, w: layouts(d, m, n, w)),
    "ws": (_attn_fwd_ws, [(128, 128, 2, 4), (128, 128, 3, 4), (128, 64, 3, 4)],
           lambda d, m, n, w: dict(q_layout=gl.NVMMASharedLayout.get_default_for([m // 2, d], gl.bfloat16),
                                   kv_layout=gl.NVMMASharedLayout.get_default_for([n, d], gl.bfloat16),
                                   CONSUMER_REGS=240)),
}
CONFIGS = [(variant, cfg) for variant, (_, cfgs, _) in VARIANTS.items() for cfg in cfgs]
# Head dim 256 (session 24, compiled, not yet run): the ws kernel with 64-key tiles and 2 stages, the one config that
# fits shared memory (197 KB) without spills; (128, 128, 2) spills and needs 328 KB.
CONFIGS_256 = [("ws", (128, 64, 2, 4))]


def configs_for(head_dim: int, variants) -> list:
    return [c for c in (CONFIGS_256 if head_dim == 256 else CONFIGS) if c[0] in variants]


def gluon_attention(q, k, v, causal: bool, config=CONFIGS[0]):
    """(out, lse base 2 of shape (batch, heads, seqlen)) for q, k, v (batch, seqlen, heads, head_dim);
    config: (variant, (BLOCK_M, BLOCK_N, STAGES, warps))."""
    variant, (block_m, block_n, stages, warps) = config
    kernel, _, extra = VARIANTS[variant]
    batch, seqlen, nheads, head_dim = q.shape
    if not (q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype and q.dtype in (torch.bfloat16,)):
        raise ValueError("q, k, v: one shape, bfloat16")
    if head_dim not in (64, 128, 256) or seqlen % block_m or seqlen % block_n:
        raise ValueError(f"head dim 64, 128 or 256 and seqlen a multiple of {block_m} and {block_n}; got {q.shape}")
    q, k, v = (x.contiguous() for x in (q, k, v))
    from kernels.flash import _ensure_tma_allocator  # the plain kernel's in-kernel descriptors take global scratch

    _ensure_tma_allocator()
    o = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen, dtype=torch.float32, device=q.device)
    if variant == "ws":  # the shipped kernel, through its launcher (host-built descriptors since session 25)
        from kernels.flash_gluon import gluon_forward

        gluon_forward(q, k, v, o, lse, LOG2E / math.sqrt(head_dim), causal, tiles=(block_m, block_n, stages))
        return o, lse
    kernel[(seqlen // block_m, batch * nheads)](
        q, k, v, o, lse, batch * seqlen, seqlen, nheads, LOG2E / math.sqrt(head_dim), head_dim, block_m,
        block_n, stages, causal, **extra(head_dim, block_m, block_n, warps), num_warps=warps)
    return o, lse


def compile_report():
    """sm_90 compile on the CPU (scripts/kernel_resources.py's `resources`): registers, spills and shared memory per
    config, head dim and causality."""
    sys.path.insert(0, "scripts")
    from kernel_resources import resources

    for head_dim in (64, 128, 256):
        for causal in (False, True):
            for variant, cfg in configs_for(head_dim, tuple(VARIANTS)):
                kernel, _, extra = VARIANTS[variant]
                block_m, block_n, stages, warps = cfg
                consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, IS_CAUSAL=causal,
                              **extra(head_dim, block_m, block_n, warps))
                types = None
                if variant == "ws":  # the shipped kernel takes host-built descriptors in the layouts' place
                    from kernel_resources import tensordesc

                    q_desc = tensordesc("bf16", [block_m // 2, head_dim], consts.pop("q_layout"))
                    kv_desc = tensordesc("bf16", [block_n, head_dim], consts.pop("kv_layout"))
                    types = dict(q_desc=q_desc, o_desc=q_desc, k_desc=kv_desc, v_desc=kv_desc)
                r = resources(kernel, consts, warps, stages, types=types)
                print(f"hd {head_dim} causal {causal} {variant} (BLOCK_M, BLOCK_N, STAGES, warps) {cfg}: regs "
                      f"{r['regs']}, spill stack {r['stack']} B, smem {r['smem']} B", flush=True)


def check(variants=tuple(VARIANTS), head_dims=(64, 128)):
    from kernels.flash import flash_attn_func
    from kernels.standard import standard_attention

    torch.manual_seed(0)
    failures = []
    for head_dim in head_dims:
        for causal in (False, True):
            for seqlen in (128, 512, 1024):
                q, k, v = (torch.randn(2, seqlen, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                ref = standard_attention(q.double(), k.double(), v.double(), causal=causal)
                ours = flash_attn_func(q, k, v, causal=causal)
                base = (ours.double() - ref).abs().max().item()
                scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(head_dim)
                if causal:
                    scores.masked_fill_(torch.ones(seqlen, seqlen, dtype=torch.bool, device="cuda").triu(1),
                                        float("-inf"))
                lse_ref = torch.logsumexp(scores, dim=-1) / math.log(2)  # base 2, (batch, heads, seqlen)
                for cfg in configs_for(head_dim, variants):
                    try:
                        o, lse = gluon_attention(q, k, v, causal, cfg)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 (a config that does not build or run: say so, go on)
                        print(f"hd {head_dim} causal {causal} n {seqlen} {cfg}: WRONG, raised {type(e).__name__}: "
                              f"{str(e)[:300]}", flush=True)
                        if not failures:  # the first failure's whole traceback: a device call to debug it is costly
                            import traceback
                            traceback.print_exc()
                        failures.append(cfg)
                        continue
                    err = (o.double() - ref).abs().max().item()
                    lse_err = (lse.double() - lse_ref).abs().max().item()
                    ok = err <= 2 * base + 1e-3 and lse_err < 1e-3
                    print(f"hd {head_dim} causal {causal} n {seqlen} {cfg}: max err {err:.2e} (ours {base:.2e}), "
                          f"lse {lse_err:.1e} {'ok' if ok else 'WRONG'}", flush=True)


def bench(variants=tuple(VARIANTS), head_dims=(64, 128)):
    from triton.testing import do_bench

    from kernels.flash import flash_attn_func

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for head_dim in head_dims:
        for seqlen in (1024, 4096, 16384):
            for causal in (False, True):
                batch, nheads = 16384 // seqlen, 2048 // head_dim
                q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                flops = 4 * batch * nheads * seqlen * seqlen * head_dim / (2 if causal else 1)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                    cudnn = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                                            is_causal=causal))
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):  # FA2
                    fa2 = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                                          is_causal=causal))
                ours = do_bench(lambda: flash_attn_func(q, k, v, causal=causal))
                cells = []
                for cfg in configs_for(head_dim, variants):
                    if seqlen % cfg[1][0] or seqlen % cfg[1][1]:
                        continue
                    ms = do_bench(lambda: gluon_attention(q, k, v, causal, cfg))
                    cells.append(f"{cfg} {ms:.3f} ms ({flops / ms * 1e-9:.0f} TF/s, x{ours / ms:.2f} ours, "
                                 f"x{fa2 / ms:.2f} FA2, x{cudnn / ms:.2f} cuDNN)")
                print(f"hd {head_dim} n {seqlen} causal {causal}: ours {ours:.3f} ms ({flops / ours * 1e-9:.0f}), "
                      f"FA2 {fa2:.3f} ms ({flops / fa2 * 1e-9:.0f}), cuDNN {cudnn:.3f} ms ({flops / cudnn * 1e-9:.0f}) | "
                      + " | ".join(cells), flush=True)


def short():
    """The shipped forward at the short lengths that decide flash_gluon.MIN_SEQLEN: kernels/flash.py's forward with
    the Gluon kernel (its length limit lifted) against the same launcher without it (FLASH_GLUON=0's path, autotuned)
    and FlashAttention-2, head dims 128 and 256, bf16, 16K tokens a batch."""
    from triton.testing import do_bench

    import kernels.flash as F
    import kernels.flash_gluon as G

    G.MIN_SEQLEN = dict.fromkeys(G.MIN_SEQLEN, 0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for head_dim in (128, 256):
        for causal in (False, True):
            for seqlen in (512, 1024, 2048):
                batch, nheads = 16384 // seqlen, 2048 // head_dim
                q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                flops = 4 * batch * nheads * seqlen * seqlen * head_dim / (2 if causal else 1)
                assert F._gluon_unsupported(q, k, v, causal, 0.0, False, None) is None
                times = {}
                for name, on in (("gluon", True), ("triton", False)):
                    F.GLUON_KERNELS = on
                    times[name] = do_bench(lambda: F.flash_attn_func(q, k, v, causal=causal))
                F.GLUON_KERNELS = True
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    fa2 = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                                          is_causal=causal))
                g, t = times["gluon"], times["triton"]
                print(f"hd {head_dim} n {seqlen} causal {causal}: gluon {g:.3f} ms ({flops / g * 1e-9:.0f} TF/s) | "
                      f"triton {t:.3f} ms ({flops / t * 1e-9:.0f}) | FA2 {fa2:.3f} ms ({flops / fa2 * 1e-9:.0f}) | "
                      f"gluon x{t / g:.2f} triton, x{fa2 / g:.2f} FA2", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "bench"
    if mode == "compile":
        compile_report()
    elif mode == "short":
        short()
    else:  # check / bench [variant ...] [hd<D> ...], e.g. `check ws hd256`
        words = sys.argv[2:]
        kwargs = {}
        if [w for w in words if not w.startswith("hd")]:
            kwargs["variants"] = tuple(w for w in words if not w.startswith("hd"))
        if [w for w in words if w.startswith("hd")]:
            kwargs["head_dims"] = tuple(int(w[2:]) for w in words if w.startswith("hd"))
        {"check": check, "bench": bench}[mode](**kwargs)
