"""What the Gluon kernel A/B experiments under results/attention/ share (their ab.py and min_seqlen.py scripts):
launching a kernel with other constexprs than the launcher's, and two timing loops that alternate the forms'
order round by round, so that every ratio compares times from the same minutes on a shared machine.

Importing it puts the checkout and scripts/ on sys.path (kernels.*, _common).
"""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def launch_with(fn, kernels, flags: dict):
    """fn (an entry point of kernels.flash_gluon, same arguments) with every launch of one of `kernels` given `flags`
    (constexprs) on top of the launcher's own, whatever the shipped choice is."""
    import kernels.flash_gluon as G

    def call(*args, **kw):
        real = G.launch

        def launch(kernel, grid, launch_args, consts):
            real(kernel, grid, launch_args, dict(consts, **flags) if any(kernel is k for k in kernels) else consts)

        G.launch = launch
        try:
            return fn(*args, **kw)
        finally:
            G.launch = real
    return call


def with_setting(module, name: str, value, fn):
    """fn (no arguments) with module.name set to value while it runs (eager calls; a CUDA graph keeps the kernels
    chosen when it was captured)."""
    def call():
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, saved)
    return call


def alternating_rounds(fns: dict, rounds: int) -> str:
    """Each of fns (name -> call, one named "shipped") timed by do_bench in turn, `rounds` times, the order flipped
    each round: "name median-ms (shipped's time / its time)" for each."""
    import triton.testing

    times = {n: [] for n in fns}
    for r in range(rounds):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[n].append(triton.testing.do_bench(fns[n], rep=60))
    base = statistics.median(times["shipped"])
    return " ".join(f"{n} {statistics.median(t):.3f} ({base / statistics.median(t):.3f}x)" for n, t in times.items())


def eager_and_graphed(fns: dict, params=(), rounds: int = 3) -> tuple[dict, dict]:
    """Each of fns (name -> call) timed eager (do_bench: the host's launch path included) and replayed from a CUDA
    graph (the device alone; `params`' .grad cleared before each call), `rounds` alternating rounds: (the median ms
    of each "<name>_eager" / "<name>_graphed", every round's ms)."""
    from _common import capture_graph
    from triton.testing import do_bench

    graphs = {name: capture_graph(fn, params) for name, fn in fns.items()}
    times = {f"{name}_{mode}": [] for name in fns for mode in ("eager", "graphed")}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[f"{name}_eager"].append(do_bench(fns[name], warmup=25, rep=40, return_mode="median"))
            times[f"{name}_graphed"].append(do_bench(graphs[name].replay, warmup=10, rep=40, return_mode="median"))
    return {name: statistics.median(t) for name, t in times.items()}, times


def run_backward(fn, args, causal, **kw):
    """fn (kernels.flash_gluon.gluon_backward or a form of it) on args = (q, k, v, dO, LSE, delta, scale), as
    ../gluon_bwd_pp64/pp64_bwd.py's `_inputs` makes them: [dQ, dK, dV], each NaN where the kernel wrote nothing."""
    import torch

    q, k, v, do, lse, delta, scale = args
    grads = [torch.full_like(q, float("nan")) for _ in range(3)]
    fn(do, q, k, v, lse, delta, *grads, scale, causal, **kw)
    return grads


def cudnn_backward(q, k, v, do, causal):
    """A call to time: the backward of PyTorch SDPA's cuDNN attention for q, k, v, dO (batch, seqlen, heads, head
    dim), its forward run once here."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dot = do.transpose(1, 2)
    return lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)
