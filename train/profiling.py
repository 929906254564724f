"""Where a training step's time goes: torch.profiler over a few optimizer steps, summarised per step (wall,
GPU-busy, kernel time by category, top kernels, top host ops) and rendered as markdown. Used by the
benchmark scripts (scripts/_common.py) and by training runs (train.callbacks.StepProfiler,
`callbacks.profile.start=N`)."""
from __future__ import annotations

# Kernel name fragments -> category, first match wins (lower-case). Ours: the Triton kernels of
# kernels/flash.py and kernels/blocksparse.py; peers: PyTorch's FlashAttention-2 / memory-efficient /
# cuDNN SDPA kernels; inductor's generated kernels start with "triton_".
KERNEL_CATEGORIES = (
    ("attention", ("_fwd_kernel", "_bwd_dkdv", "_bwd_dq", "_bwd_preprocess", "_bs_", "flash", "fmha", "sdpa",
                   "attention", "cudnn_generated")),
    ("optimizer", ("multi_tensor", "foreach", "fused_adam", "_amp_")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm80_", "kernel2")),
    ("compiled (inductor)", ("triton_",)),
    ("layernorm", ("layer_norm", "layernorm")),
    ("softmax / loss", ("softmax", "cross_entropy", "nll_loss", "log_softmax")),
    ("dropout / random", ("dropout", "philox", "fused_dropout", "bernoulli", "random")),
    ("copy / cat / index", ("copy", "cat", "index", "gather", "scatter", "embedding", "stack", "where")),
    ("elementwise / reduce", ("elementwise", "reduce", "vectorized", "unrolled")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    for cat, frags in KERNEL_CATEGORIES:
        if any(f in low for f in frags):
            return cat
    return "other"


class StepProfile:
    """torch.profiler around `steps` training steps: .start(), then .stop() after them; .summary is a
    dict (per step: wall ms, GPU-busy ms, kernel ms by category, top kernels, top host ops by self CPU
    time). GPU-busy is the union of kernel intervals: wall minus busy is time the GPU sat idle waiting
    for the host (launch-bound steps) or a sync. Wall includes the profiler's own overhead."""

    def __init__(self, steps: int):
        self.steps, self.summary, self._prof = steps, None, None

    @property
    def running(self) -> bool:
        """Started and not yet stopped."""
        return self._prof is not None and self.summary is None

    def start(self):
        import time

        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        torch.cuda.is_available() and torch.cuda.synchronize()
        self._prof = profile(activities=acts)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def stop(self):
        import time

        import torch

        torch.cuda.is_available() and torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        self._prof.__exit__(None, None, None)
        self.summary = profile_summary(self._prof, self.steps, wall)


def profile_summary(prof, steps: int, wall_s: float, top: int = 15) -> dict:
    from torch.autograd import DeviceType

    # Device-side events minus user annotations (Lightning runs forward and backward inside
    # `optimizer.step(closure)`, so the "Optimizer.step#..." range spans the whole step on the GPU too).
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False) and not e.name.startswith(("Optimizer.", "ProfilerStep"))]
    by_name: dict[str, float] = {}
    spans = []
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
        spans.append((e.time_range.start, e.time_range.end))
    busy, end = 0.0, float("-inf")
    for s, t in sorted(spans):  # union of the kernel intervals
        if t > end:
            busy += t - max(s, end)
            end = t
    cats: dict[str, float] = {}
    for name, us in by_name.items():
        cat = kernel_category(name)
        cats[cat] = cats.get(cat, 0.0) + us
    per = 1e-3 / steps  # us over the window -> ms per step
    host = sorted(((a.key, a.self_cpu_time_total) for a in prof.key_averages()), key=lambda x: -x[1])[:top]
    return {
        "steps": steps, "wall_ms": 1000 * wall_s / steps, "gpu_busy_ms": busy * per,
        "kernel_ms": sum(by_name.values()) * per, "launches": len(kernels) / steps,
        "categories": {k: v * per for k, v in sorted(cats.items(), key=lambda x: -x[1])},
        "top_kernels": [(n[:90], us * per) for n, us in sorted(by_name.items(), key=lambda x: -x[1])[:top]],
        "top_host_ops": [(n[:60], us * per) for n, us in host],
    }


def profile_markdown(rows: list[dict], window: str | None = None) -> list[str]:
    """Per-row breakdown tables of the rows that carry a "profile" summary. window: which steps were
    profiled, for the heading (default: the benchmarks' steps after the timed ones)."""
    rows = [r for r in rows if r.get("profile")]
    if not rows:
        return []
    cats = []
    for r in rows:
        cats += [c for c in r["profile"]["categories"] if c not in cats]
    window = window or f"{rows[0]['profile']['steps']} steps after the timed ones"
    out = ["", f"## Where a step's time goes (torch.profiler, {window}; ms per step; wall includes the "
               "profiler's overhead; GPU busy = union of kernel intervals)", "",
           "| | " + " | ".join(r["row"] for r in rows) + " |", "|---|" + "---:|" * len(rows)]
    for key, label in (("wall_ms", "wall"), ("gpu_busy_ms", "GPU busy"), ("kernel_ms", "kernel sum"),
                       ("launches", "kernel launches")):
        fmt = "{:.0f}" if key == "launches" else "{:.1f}"
        out.append(f"| {label} | " + " | ".join(fmt.format(r["profile"][key]) for r in rows) + " |")
    for c in cats:
        out.append(f"| {c} | " + " | ".join(f"{r['profile']['categories'].get(c, 0.0):.1f}" for r in rows) + " |")
    for r in rows:
        out += ["", f"{r['row']}, top kernels (ms per step): " + "; ".join(
            f"`{n}` {ms:.2f}" for n, ms in r["profile"]["top_kernels"][:10]),
            "", f"{r['row']}, top host ops (self CPU ms per step): " + "; ".join(
            f"`{n}` {ms:.2f}" for n, ms in r["profile"]["top_host_ops"][:10])]
    return out
