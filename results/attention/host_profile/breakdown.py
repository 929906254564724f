"""Where the host time of one eager flash_attn_func forward + backward goes, in real (unprofiled) time.

cProfile roughly doubles the cost of Python-heavy code, so this times each piece on its own, back to back at a shape
so small that the GPU is never the bottleneck (scripts/bench_host_overhead.py's: batch 1, 128 tokens, 4 heads of 64,
bf16), and prints microseconds per call. Needs a GPU.

    python results/attention/host_profile/breakdown.py                   # --profile: also a torch.profiler table
    python results/attention/host_profile/breakdown.py --engine-threads  # the backward rows, then again with
                                                                         # autograd's multithreading off
    python results/attention/host_profile/breakdown.py --engine-threads --profile-threads  # and a profile of each
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench_host_overhead import B, D, H, N, host_us  # noqa: E402

from kernels import flash  # noqa: E402
from kernels.launch import launch  # noqa: E402


def identity_with(work):
    """An autograd Function that passes its input through and runs work() in its backward."""
    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            work()
            return g

    return Identity


def main():
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(B, N, H, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    qh, kh, vh = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    scale = D ** -0.5
    o, lse, seed = flash._flash_fwd(q, k, v, scale, False, 0.0, False, None, None, N, N)
    do = torch.randn_like(o)
    do_expanded = torch.ones((), device=dev, dtype=dt).expand(o.shape)

    Identity = identity_with(lambda: None)
    BwdOnDeviceThread = identity_with(
        lambda: flash._flash_bwd(do, q, k, v, o, lse, seed, scale, False, 0.0, False, None, None, N, N))

    rows = {
        "ours fwd+bwd (flash_attn_func, out.sum().backward())":
            lambda: flash.flash_attn_func(q, k, v).sum().backward(),
        "sdpa_flash fwd+bwd": lambda: F.scaled_dot_product_attention(qh, kh, vh).sum().backward(),
        "ours fwd (flash_attn_func)": lambda: flash.flash_attn_func(q, k, v),
        "sdpa_flash fwd": lambda: F.scaled_dot_product_attention(qh, kh, vh),
        "autograd alone: Identity.apply(q).sum().backward()": lambda: Identity.apply(q).sum().backward(),
        "_flash_fwd (launcher, no autograd)": lambda: flash._flash_fwd(q, k, v, scale, False, 0.0, False, None, None,
                                                                       N, N),
        "_flash_bwd (launchers, no autograd)": lambda: flash._flash_bwd(do, q, k, v, o, lse, seed, scale, False, 0.0,
                                                                        False, None, None, N, N),
        "bwd_preprocess": lambda: flash.bwd_preprocess(o, do),
        "check_inputs": lambda: flash.check_inputs(q, k, v),
        "_gluon_bwd_unsupported": lambda: flash._gluon_bwd_unsupported(q, k, v, do, lse, lse, (q, k, v), False, 0.0,
                                                                       False),
        "torch.empty(q.shape)": lambda: torch.empty(q.shape, dtype=dt, device=dev),
        "do_expanded.contiguous()": lambda: do_expanded.contiguous(),
    }
    import triton

    @triton.jit
    def _nothing(x, n):
        pass

    rows["empty kernel launch via kernels.launch"] = lambda: launch(_nothing, (1,), (q, 1), {})
    rows["empty kernel launch, kernel[grid](...)"] = lambda: _nothing[(1,)](q, 1)
    many = (q, k, v, o, lse, seed) + tuple(range(1, 40))

    @triton.jit
    def _nothing45(a, b, c, d, e, f, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, x16, x17, x18,
                   x19, x20, x21, x22, x23, x24, x25, x26, x27, x28, x29, x30, x31, x32, x33, x34, x35, x36, x37, x38,
                   x39):
        pass

    rows["empty 45-argument kernel via kernels.launch"] = lambda: launch(_nothing45, (1,), many, {})
    rows["Identity whose backward runs _flash_bwd"] = lambda: BwdOnDeviceThread.apply(q).sum().backward()
    x = q.detach().clone().requires_grad_()
    rows["Identity on a tensor whose .grad stays None (autograd.grad)"] = (
        lambda: torch.autograd.grad(Identity.apply(x).sum(), x))
    rows["ours fwd + autograd.grad(out, (q, k, v), do)"] = (
        lambda: torch.autograd.grad(flash.flash_attn_func(q, k, v), (q, k, v), do))
    rows["sdpa fwd + autograd.grad(out, (q, k, v), do)"] = (
        lambda: torch.autograd.grad(F.scaled_dot_product_attention(qh, kh, vh), (qh, kh, vh), do.transpose(1, 2)))
    rows_all = dict(rows)
    if "--engine-threads" in sys.argv:
        # The same backward rows on the calling thread: autograd otherwise hands CUDA work to a device thread of its own.
        backward_rows = [name for name in rows if "bwd" in name or "backward" in name or "grad" in name]
        rows = {name: rows[name] for name in backward_rows}

        def on_calling_thread(fn):
            def call():
                with torch.autograd.set_multithreading_enabled(False):
                    fn()
            return call

        rows.update({name + ", on the calling thread": on_calling_thread(rows[name]) for name in backward_rows})
    for name, fn in rows.items():
        print(f"{host_us(fn, calls=300, repeats=7):8.1f} us  {name}", flush=True)
    if "--profile-threads" in sys.argv:
        grad_row = rows_all["ours fwd + autograd.grad(out, (q, k, v), do)"]
        for label, multithreaded in (("autograd's device thread", True), ("the calling thread", False)):
            with torch.autograd.set_multithreading_enabled(multithreaded):
                stats = profiled(grad_row, 100, cuda=False)
            print(f"\n## torch.profiler, 100 x ours fwd + autograd.grad, backward on {label}")
            print(stats.table(sort_by="self_cpu_time_total", row_limit=18))
    if "--profile" in sys.argv:
        stats = profiled(rows_all["ours fwd+bwd (flash_attn_func, out.sum().backward())"], 50, cuda=True)
        print(stats.table(sort_by="self_cpu_time_total", row_limit=30))
        print(stats.table(sort_by="self_cuda_time_total", row_limit=12))


def profiled(fn, iters: int, cuda: bool):
    """torch.profiler's per-op averages over `iters` calls of fn, after 20 untimed ones; CPU activity, and CUDA's
    with `cuda`."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages()


if __name__ == "__main__":
    main()
