"""Device A/B (run 2026-11-26, one_launch.txt; the PAIRED variant not yet run): FlexAttention's backward structure
with our building blocks. One launch whose grid
holds the dK/dV programs (a key tile each, looping over query tiles) and then the dQ programs (a query tile each,
looping over key tiles), so the two share the SMs; the tiles and the inner steps are the shipped kernels'
(`bwd_dkdv_block_step`, `bwd_dq_block_step`). Dense self-attention only (no varlen, no GQA), head dims 64 / 128,
seqlen a multiple of the tiles. Configs (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, warps, stages): Flex's sm90
defaults first (torch 2.13, torch/_inductor/template_heuristics/triton.py).

PAIRED (causal only): each program takes two tiles of its kind, j and last - j, so every program carries the same
causal work (a long row of tiles and a short one) instead of the grid holding programs from 1 to n/BLOCK tiles
long. The first run lost 2-10% causal with one tile per program (one_launch.txt); this asks whether the work
imbalance is why. Prediction: causal at least even with the shipped backward at 4K-16K head dim 128, the
non-causal gain (1.05-1.07x) unchanged; GPT-2's shape about even.

    python results/attention/bwd_streams/one_launch.py           # on a GPU: times against the shipped backward
    TRITON_INTERPRET=1 python results/attention/bwd_streams/one_launch.py check   # CPU: equals the shipped one
    python results/attention/bwd_streams/one_launch.py compile   # CPU: sm_90 registers / spills per config
"""
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernels.flash as F  # noqa: E402
from kernels.flash import bwd_dkdv_block_step, bwd_dq_block_step, load_row_stats, load_tile, _key_stages  # noqa: E402

CONFIGS = {128: [(64, 128, 128, 64, 8, 3), (32, 128, 128, 32, 8, 3), (64, 128, 128, 64, 8, 2), (32, 128, 128, 64, 8, 2)],
           64: [(64, 64, 64, 64, 4, 3), (32, 128, 128, 32, 4, 3), (32, 64, 64, 32, 4, 4), (64, 128, 128, 64, 8, 3)]}


@triton.jit
def _dkdv_tile(kv_tile, Q, K, V, DO, DK, DV, lse_base, delta_base, base, seed, bh, seqlen, sm_scale, qk_scale,
               drop_thresh, drop_scale, stride_n, HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr,
               BLOCK_N1: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    """dK, dV of one key tile (the shipped dK/dV kernel's loop)."""
    offs_d = tl.arange(0, HEAD_DIM)
    start_n = kv_tile * BLOCK_N1
    cols = start_n + tl.arange(0, BLOCK_N1)
    offs_m = tl.arange(0, BLOCK_M1)
    k = load_tile(K + base, stride_n, cols, offs_d, seqlen, HEAD_DIM, HEAD_DIM, True)
    v = load_tile(V + base, stride_n, cols, offs_d, seqlen, HEAD_DIM, HEAD_DIM, True)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:  # query tiles before lo see none of these keys; [lo, mid) straddle the diagonal
        lo = (start_n // BLOCK_M1) * BLOCK_M1
        mid = tl.minimum(tl.maximum(tl.cdiv(start_n + BLOCK_N1 - 1, BLOCK_M1) * BLOCK_M1, lo),
                         tl.cdiv(seqlen, BLOCK_M1) * BLOCK_M1)
    else:
        lo = 0
        mid = 0
    for start_m in range(lo, mid, BLOCK_M1):
        dk, dv = bwd_dkdv_block_step(dk, dv, k, v, Q + base, DO + base, lse_base, delta_base, stride_n, stride_n,
                                     start_m, offs_m, cols, offs_d, seqlen, 0, qk_scale, seed, bh, drop_thresh,
                                     drop_scale, HEAD_DIM, HEAD_DIM, True, HAS_DROPOUT)
    for start_m in range(mid, seqlen, BLOCK_M1):
        dk, dv = bwd_dkdv_block_step(dk, dv, k, v, Q + base, DO + base, lse_base, delta_base, stride_n, stride_n,
                                     start_m, offs_m, cols, offs_d, seqlen, 0, qk_scale, seed, bh, drop_thresh,
                                     drop_scale, HEAD_DIM, HEAD_DIM, False, HAS_DROPOUT)
    ptrs = base + cols[:, None].to(tl.int64) * stride_n + offs_d[None, :]
    tl.store(DK + ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=cols[:, None] < seqlen)
    tl.store(DV + ptrs, dv.to(DV.dtype.element_ty), mask=cols[:, None] < seqlen)


@triton.jit
def _dq_tile(q_tile, Q, K, V, DO, DQ, lse_base, delta_base, base, seed, bh, seqlen, sm_scale, qk_scale, drop_thresh,
             drop_scale, stride_n, HEAD_DIM: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
             IS_CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    """dQ of one query tile (the shipped dQ kernel's loop)."""
    offs_d = tl.arange(0, HEAD_DIM)
    start_m = q_tile * BLOCK_M2
    rows = start_m + tl.arange(0, BLOCK_M2)
    offs_n = tl.arange(0, BLOCK_N2)
    q = load_tile(Q + base, stride_n, rows, offs_d, seqlen, HEAD_DIM, HEAD_DIM, True)
    do = load_tile(DO + base, stride_n, rows, offs_d, seqlen, HEAD_DIM, HEAD_DIM, True)
    lse, delta = load_row_stats(lse_base, delta_base, rows, seqlen)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
    mid, hi = _key_stages(start_m, seqlen, 0, IS_CAUSAL, BLOCK_M2, BLOCK_N2)
    for start_n in range(0, mid, BLOCK_N2):
        dq = bwd_dq_block_step(dq, q, do, lse, delta, K + base, V + base, stride_n, stride_n, start_n, rows, offs_n,
                               offs_d, seqlen, 0, qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM, HEAD_DIM,
                               False, False, HAS_DROPOUT)
    for start_n in range(mid, hi, BLOCK_N2):
        dq = bwd_dq_block_step(dq, q, do, lse, delta, K + base, V + base, stride_n, stride_n, start_n, rows, offs_n,
                               offs_d, seqlen, 0, qk_scale, seed, bh, drop_thresh, drop_scale, HEAD_DIM, HEAD_DIM,
                               IS_CAUSAL, True, HAS_DROPOUT)
    ptrs = base + rows[:, None].to(tl.int64) * stride_n + offs_d[None, :]
    tl.store(DQ + ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows[:, None] < seqlen)


@triton.jit
def _bwd_one_launch(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, SEED, seqlen, nheads, sm_scale, qk_scale, drop_thresh,
                    drop_scale, stride_b, stride_n, stride_h, stride_lb, stride_lh, n_kv_blocks, n_q_blocks,
                    n_kv_programs, HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, IS_CAUSAL: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, PAIRED: tl.constexpr):
    """Programs [0, n_kv_programs) do dK/dV, the rest dQ. PAIRED (causal): a program takes tile j and tile
    last - j of its kind, so that every program has the same causal work (a long and a short row of tiles);
    otherwise one tile each, causal dQ in reverse (heaviest first)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    base = b.to(tl.int64) * stride_b + h * stride_h
    lse_base = LSE + b * stride_lb + h * stride_lh
    delta_base = DELTA + b * stride_lb + h * stride_lh
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    if pid < n_kv_programs:
        _dkdv_tile(pid, Q, K, V, DO, DK, DV, lse_base, delta_base, base, seed, bh, seqlen, sm_scale, qk_scale,
                   drop_thresh, drop_scale, stride_n, HEAD_DIM, BLOCK_M1, BLOCK_N1, IS_CAUSAL, HAS_DROPOUT)
        if PAIRED:
            partner = n_kv_blocks - 1 - pid
            if partner > pid:
                _dkdv_tile(partner, Q, K, V, DO, DK, DV, lse_base, delta_base, base, seed, bh, seqlen, sm_scale,
                           qk_scale, drop_thresh, drop_scale, stride_n, HEAD_DIM, BLOCK_M1, BLOCK_N1, IS_CAUSAL,
                           HAS_DROPOUT)
    else:
        j = pid - n_kv_programs
        if PAIRED:
            _dq_tile(j, Q, K, V, DO, DQ, lse_base, delta_base, base, seed, bh, seqlen, sm_scale, qk_scale,
                     drop_thresh, drop_scale, stride_n, HEAD_DIM, BLOCK_M2, BLOCK_N2, IS_CAUSAL, HAS_DROPOUT)
            partner = n_q_blocks - 1 - j
            if partner > j:
                _dq_tile(partner, Q, K, V, DO, DQ, lse_base, delta_base, base, seed, bh, seqlen, sm_scale, qk_scale,
                         drop_thresh, drop_scale, stride_n, HEAD_DIM, BLOCK_M2, BLOCK_N2, IS_CAUSAL, HAS_DROPOUT)
        else:
            if IS_CAUSAL:
                j = n_q_blocks - 1 - j
            _dq_tile(j, Q, K, V, DO, DQ, lse_base, delta_base, base, seed, bh, seqlen, sm_scale, qk_scale,
                     drop_thresh, drop_scale, stride_n, HEAD_DIM, BLOCK_M2, BLOCK_N2, IS_CAUSAL, HAS_DROPOUT)


def bwd_one_launch(do, q, k, v, o, lse, seed, scale, causal, dropout_p, cfg, paired=False):
    m1, n1, m2, n2, warps, stages = cfg
    b, n, h, d = q.shape
    assert k.shape == q.shape and n % max(n1, m2) == 0 and d in (64, 128) and do.stride() == q.stride()
    delta = F.bwd_preprocess(o, do, False, None, n)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    thresh, drop_scale = F._drop_consts(dropout_p)
    slb, slh = F.lse_strides(lse, False)
    n_kv, n_q = n // n1, n // m2
    kv_programs, q_programs = ((n_kv + 1) // 2, (n_q + 1) // 2) if paired else (n_kv, n_q)
    _bwd_one_launch[(kv_programs + q_programs, b * h)](
        q, k, v, do, dq, dk, dv, lse, delta, seed, n, h, scale, scale * F.LOG2E, thresh, drop_scale,
        q.stride(0), q.stride(1), q.stride(2), slb, slh, n_kv, n_q, kv_programs, HEAD_DIM=d, BLOCK_M1=m1,
        BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2, IS_CAUSAL=causal, HAS_DROPOUT=dropout_p > 0, PAIRED=paired,
        num_warps=warps, num_stages=stages)
    return dq, dk, dv


def check():
    """Under the interpreter: equal to the shipped two-kernel backward (float16, small shapes)."""
    # 192 / 64: an odd number of tiles, whose middle tile a paired program takes alone
    for b, n, h, d, causal, p in [(2, 128, 2, 64, False, 0.0), (1, 256, 2, 64, True, 0.0), (1, 128, 2, 64, True, 0.1),
                                  (1, 192, 2, 64, True, 0.0), (1, 192, 2, 64, True, 0.1)]:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, dtype=torch.float16) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n)
        ref = F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n)
        for cfg in [(32, 64, 64, 32, 4, 2), (64, 64, 64, 64, 4, 2)]:
            for paired in ((False, True) if causal else (False,)):
                got = bwd_one_launch(do, q, k, v, o, lse, seed, scale, causal, p, cfg, paired)
                err = [float((a.float() - r.float()).abs().max()) for a, r in zip(got, ref)]
                print((b, n, h, d, causal, p), cfg, "paired" if paired else "", "max|d| (dq, dk, dv)", err, flush=True)
                assert max(err) < 2e-3, err


def compile_only():
    sys.path.insert(0, "scripts")
    from kernel_resources import resources

    for d, cfgs in CONFIGS.items():
        for causal in (False, True):
            for m1, n1, m2, n2, w, s in cfgs:
                for paired in ((False, True) if causal else (False,)):
                    consts = dict(HEAD_DIM=d, BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2, IS_CAUSAL=causal,
                                  HAS_DROPOUT=False, PAIRED=paired)
                    r = resources(_bwd_one_launch, consts, w, s)
                    print(f"hd {d} causal={causal} paired={paired} {(m1, n1, m2, n2, w, s)}: {r['regs']} registers, "
                          f"{r['stack']} bytes stack", flush=True)


def main():
    from triton.testing import do_bench

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    for b, n, h, d, causal, p in [(4, 4096, 16, 128, False, 0.0), (4, 4096, 16, 128, True, 0.0),
                                  (1, 16384, 16, 128, False, 0.0), (1, 16384, 16, 128, True, 0.0),
                                  (16, 1024, 16, 128, True, 0.0), (16, 1024, 12, 64, True, 0.0),
                                  (16, 1024, 12, 64, True, 0.1)]:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, p, False, None, None, n, n)

        def shipped():
            return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, p, False, None, None, n, n)

        ref = shipped()
        t_ref = sorted(do_bench(shipped, rep=200) for _ in range(3))[1]
        tag = f"{b}x{n} h{h} d{d} {'causal' if causal else 'full'}{f' p{p}' if p else ''}"
        print(f"{tag:32s} shipped (autotuned) {t_ref:.3f} ms", flush=True)
        for cfg in CONFIGS[d]:
            for paired in ((False, True) if causal else (False,)):
                name = f"one launch{' paired' if paired else ''} {cfg}"
                try:
                    def run():
                        return bwd_one_launch(do, q, k, v, o, lse, seed, scale, causal, p, cfg, paired)

                    err = max(float((a.float() - r.float()).abs().max()) for a, r in zip(run(), ref))
                    t = sorted(do_bench(run, rep=200) for _ in range(3))[1]
                    print(f"{tag:32s} {name} {t:.3f} ms ({t_ref / t:.3f}x shipped) max|d| {err:.4f}", flush=True)
                except Exception as e:  # noqa: BLE001  (a config that does not fit: say so and go on)
                    print(f"{tag:32s} {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    {"check": check, "compile": compile_only}.get(sys.argv[1] if len(sys.argv) > 1 else "", main)()
