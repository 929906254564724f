"""Device experiment (kept beside its result, not part of the package): does Triton 3.6's warp
specialisation on Hopper (tl.range(..., warp_specialize=True) with on-device TMA descriptors,
triton-lang/triton#7658) speed up a non-causal FlashAttention forward? A minimal forward (no dropout, no
masking: seqlen a multiple of the tiles), with and without WS, against ours (kernels.flash, autotuned) and
SDPA cuDNN, at 16K tokens x 2048 width, bf16.

    python results/attention/ws_fwd_ab/ws_fwd_ab.py [--out DIR]        # GPU
    TRITON_INTERPRET=1 python results/attention/ws_fwd_ab/ws_fwd_ab.py --check   # CPU: the kernel's arithmetic only
"""
import argparse, json, os, sys, time
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())


@triton.jit
def _fwd(Q, K, V, O, qk_scale, B, H, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         WS: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    width = H * HEAD_DIM
    dq = tl.make_tensor_descriptor(Q, shape=[B * N, width], strides=[width, 1], block_shape=[BLOCK_M, HEAD_DIM])
    dk = tl.make_tensor_descriptor(K, shape=[B * N, width], strides=[width, 1], block_shape=[BLOCK_N, HEAD_DIM])
    dv = tl.make_tensor_descriptor(V, shape=[B * N, width], strides=[width, 1], block_shape=[BLOCK_N, HEAD_DIM])
    do = tl.make_tensor_descriptor(O, shape=[B * N, width], strides=[width, 1], block_shape=[BLOCK_M, HEAD_DIM])
    row0 = b * N + pid_m * BLOCK_M
    col = h * HEAD_DIM
    q = dq.load([row0, col])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in tl.range(0, N, BLOCK_N, warp_specialize=WS):
        k = dk.load([b * N + start_n, col])
        qk = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = dv.load([b * N + start_n, col])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    acc = acc / l_i[:, None]
    do.store([row0, col], acc.to(O.dtype.element_ty))


def ws_forward(q, k, v, block_m, block_n, warps, stages, ws):
    B, N, H, D = q.shape
    assert N % block_m == 0 and N % block_n == 0
    o = torch.empty_like(q)
    _fwd[(N // block_m, B * H)](q, k, v, o, D ** -0.5 * 1.4426950408889634, B, H, N, HEAD_DIM=D, BLOCK_M=block_m,
                                BLOCK_N=block_n, WS=ws, num_warps=warps, num_stages=stages)
    return o


def reference(q, k, v):
    qh, kh, vh = (x.double().transpose(1, 2) for x in (q, k, v))
    p = torch.softmax(qh @ kh.transpose(-1, -2) * q.shape[-1] ** -0.5, -1)
    return (p @ vh).transpose(1, 2)


# sm_90 compile check on the CPU (2026-11-25): with 4 warps and WS the compiler emits ttg.warp_specialize
# (12 warps in all, 168 registers); with 8 warps it does not specialise (same code as WS=False).
CONFIGS = [(128, 64, 4, 3, False), (128, 128, 8, 3, False), (128, 64, 4, 3, True), (128, 128, 4, 2, True),
           (128, 128, 4, 3, True), (128, 64, 4, 2, True), (64, 128, 4, 2, True), (128, 128, 8, 2, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    if a.check:
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 64, 2, 32, device=dev) for _ in range(3))
        for ws in (False, True):
            err = (ws_forward(q, k, v, 16, 16, 4, 2, ws).double() - reference(q, k, v)).abs().max().item()
            print(f"ws={ws}: max err {err:.2e}")
            assert err < 1e-4
        return
    from triton.testing import do_bench
    from kernels.flash import flash_attn_func
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for d, n in ((128, 4096), (64, 4096), (128, 1024), (64, 1024)):
        h, b = 2048 // d, 16384 // n
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = 4 * b * h * n * n * d
        ref = flash_attn_func(q, k, v)
        ms = do_bench(lambda: flash_attn_func(q, k, v), rep=100)
        rows.append(dict(provider="ours", hdim=d, seqlen=n, ms=ms, tflops=flops / ms * 1e-9))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt), rep=100)
        rows.append(dict(provider="sdpa_cudnn", hdim=d, seqlen=n, ms=ms, tflops=flops / ms * 1e-9))
        for cfg in CONFIGS:
            name = "ws" if cfg[4] else "tma"
            try:
                o = ws_forward(q, k, v, *cfg)
                err = (o.float() - ref.float()).abs().max().item()
                ms = do_bench(lambda: ws_forward(q, k, v, *cfg), rep=100)
                rows.append(dict(provider=name, config=cfg[:4], hdim=d, seqlen=n, ms=ms, tflops=flops / ms * 1e-9,
                                 max_abs_diff_vs_ours=err))
            except Exception as e:  # a config that does not compile on this target
                rows.append(dict(provider=name, config=cfg[:4], hdim=d, seqlen=n, error=f"{type(e).__name__}: {str(e)[:200]}"))
            print(rows[-1], flush=True)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command="python results/attention/ws_fwd_ab/ws_fwd_ab.py")
    print("| provider | config | hdim | seqlen | fwd ms | TFLOP/s | vs ours |")
    base = {(r["hdim"], r["seqlen"]): r["ms"] for r in rows if r["provider"] == "ours"}
    for r in rows:
        if "ms" in r:
            print(f"| {r['provider']} | {r.get('config', '')} | {r['hdim']} | {r['seqlen']} | {r['ms']:.3f} | "
                  f"{r['tflops']:.0f} | {base[(r['hdim'], r['seqlen'])] / r['ms']:.2f}x |")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        json.dump(dict(env=env, rows=rows), open(os.path.join(a.out, "ws_fwd_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
