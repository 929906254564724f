"""CUDA graphs for small models whose training step is bound by host time: the model's forward and backward
(`cuda_graph=true`, GraphedModel) or the whole training step, optimizer included (`cuda_graph=step`,
GraphedStep, at the end of this file; LRA Image's default).

LRA Image's model (one layer of width 32, batch 256 x 1,025 tokens) needs ~5 ms of GPU work a step, and
about as much Python to launch its ~180 kernels; the training loop's own host time comes on top
(results/lra/host_overhead/). Here the first training call captures the model once
(torch.cuda.make_graphed_callables) and every later one replays two graphs, one in the forward and one
in the backward; the loss, metrics, optimizer and the loop stay eager and run ahead of the GPU.

What it needs, each checked with an error that says so:
- a CUDA device, one process, no torch.compile, no fp16 loss scaler (bf16-mixed or float32);
- the same input shapes at every training step (the LRA datamodules' training streams are whole
  batches), tensors only, and no attention mask (packing makes the token count change per batch).
Gradients are added into tensors the parameters own (`_OwnGradients`), never the graph's buffers, so
gradient accumulation and zeroing in place work as in eager mode.
Dropout stays random: the graphs draw from torch's CUDA generator, which advances at every replay, and
Task's per-step reseeding fixes each step's masks (the generator's state is put back after the capture's
warm-up runs, so the first step is no exception). On the H100, LRA Image's graphed and eager runs of the same
seed took the same steps for 15,000 steps with both standard and flash attention (training losses within 0.0005:
results/lra/probes/image-dropout/), i.e. the replays drew the eager run's masks.
Evaluation (the module in eval mode) runs the plain model.
"""
from __future__ import annotations

import contextlib
import gc

import torch
from torch import nn


@contextlib.contextmanager
def collector_paused():
    """Collects Python's garbage, then keeps the cyclic collector off until the block ends (for a CUDA graph
    capture).

    torch.cuda.graph stopped collecting before a capture in PyTorch 2.9 (torch.compiler.config.force_cudagraph_gc
    is off by default). An earlier graph left in a reference cycle (make_graphed_callables' autograd Function
    classes are cycles) can then be collected in the middle of a capture. Destroying a graph while a stream
    captures is refused, and the capture fails later with "operation failed due to a previous error during
    capture". The GPU tests hit that once in every run of a longer suite
    (results/attention/host_plans/gpu_tests_bind_h200.txt); pytorch/pytorch#161037 describes the same failure."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _TensorsOnly(nn.Module):
    """model(*args, **kwargs) as a function of tensors in a fixed order, what make_graphed_callables takes."""

    def __init__(self, model: nn.Module, n_args: int, names: tuple[str, ...]):
        super().__init__()
        self.model, self.n_args, self.names = model, n_args, names

    def forward(self, *tensors):
        return self.model(*tensors[:self.n_args], **dict(zip(self.names, tensors[self.n_args:])))


class _OwnGradients(torch.autograd.Function):
    """Identity on the graphed outputs. Its backward runs just before the graph's backward replay and gives
    every parameter without a gradient a zeroed one of its own (one flat buffer per dtype, one fill), so the
    replay's gradients are added into memory the parameter owns instead of being handed over: handed over
    (autograd's AccumulateGrad keeps a gradient it can steal), .grad would be memory of the graph's pool that
    the next replays reuse for activations, and a later backward or an in-place zeroing between the forward
    and the backward would corrupt one or the other."""

    @staticmethod
    def forward(ctx, params, *outputs):
        ctx.params = params
        return tuple(o.view_as(o) for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        by_dtype: dict[torch.dtype, list] = {}
        for p in ctx.params:
            if p.grad is None:
                by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, params in by_dtype.items():
            flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=params[0].device)
            at = 0
            for p in params:
                p.grad = (flat[at:at + p.numel()].view(p.shape) if p.is_contiguous()
                          else torch.zeros_like(p, memory_format=torch.preserve_format))
                at += p.numel()
        return (None, *grads)


def _signature(args, kwargs) -> tuple:
    items = [(f"argument {i}", a) for i, a in enumerate(args)] + [(k, v) for k, v in kwargs.items()]
    for name, value in items:
        if not torch.is_tensor(value):
            raise TypeError(f"cuda_graph: the model's input {name} is a {type(value).__name__}; graphs take "
                            "tensors only (packed batches, with host-side lengths, cannot be graphed)")
        if name.startswith("attention_mask"):
            raise ValueError("cuda_graph: this batch has an attention mask; padded batches are packed, and packing "
                             "changes the token count from batch to batch, which a graph cannot follow. Use it "
                             "for unpadded tasks (LRA Image, Pathfinder) or set cuda_graph=false")
    return tuple((name, tuple(v.shape), v.dtype, str(v.device)) for name, v in items)


class GraphedModel:
    """Calls `model` through one captured forward/backward graph pair; see the module docstring."""

    def __init__(self, model: nn.Module, warmup_iters: int = 3):
        self.model, self.warmup_iters = model, warmup_iters
        self.signature: tuple | None = None
        self._graphed: nn.Module | None = None

    def _capture(self, args, kwargs) -> None:
        if any(t.device.type != "cuda" for t in (*args, *kwargs.values())):
            raise RuntimeError("cuda_graph: the inputs are not on a CUDA device")
        flat = _TensorsOnly(self.model, len(args), tuple(kwargs))
        rng = torch.cuda.get_rng_state()  # the warm-up runs draw dropout masks; the first step must not see that
        # The graphs keep the autocast state of the capture; make_graphed_callables refuses autocast's
        # weight cache (cache_enabled=True, Lightning's default), so capture under the same state without it.
        with torch.autocast("cuda", enabled=torch.is_autocast_enabled("cuda"),
                            dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False), collector_paused():
            # Copies: the sample tensors become the graph's input buffers, which every later call writes into.
            self._graphed = torch.cuda.make_graphed_callables(
                flat, tuple(t.clone() for t in (*args, *kwargs.values())), num_warmup_iters=self.warmup_iters,
                allow_unused_input=True)
        torch.cuda.set_rng_state(rng)
        self._params = tuple(p for p in self.model.parameters() if p.requires_grad)

    def __call__(self, *args, **kwargs):
        if not self.model.training:
            return self.model(*args, **kwargs)
        signature = _signature(args, kwargs)
        if self._graphed is None:
            self._capture(args, kwargs)
            self.signature = signature
        elif signature != self.signature:
            raise ValueError(f"cuda_graph: the training inputs changed shape from {self.signature} to {signature}; "
                             "a graph replays fixed shapes (every training batch must be whole)")
        out, spec = torch.utils._pytree.tree_flatten(self._graphed(*args, *kwargs.values()))
        grad_at = [i for i, o in enumerate(out) if torch.is_tensor(o) and o.requires_grad]
        for i, o in zip(grad_at, _OwnGradients.apply(self._params, *(out[i] for i in grad_at))):
            out[i] = o
        return torch.utils._pytree.tree_unflatten(out, spec)


# ---------------------------------------------------------------------------------------------------
# cuda_graph=step: the whole training step as one graph
# ---------------------------------------------------------------------------------------------------
def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Make `optimizer` safe to capture: `capturable` (its step counts stay on the device, no host sync) and
    each group's learning rate a device tensor. A float rate would be baked into the graph as the value of the
    capture step; the tensor is read at every replay, and the LR scheduler fills it in place
    (torch.optim.lr_scheduler updates tensor rates with fill_), so the schedule goes on."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        lr = group["lr"]
        if not (torch.is_tensor(lr) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)


def _cuda_capture(body, static_batch):
    """Captures body(static_batch) as one CUDA graph; returns (graph, its static outputs)."""
    graph = torch.cuda.CUDAGraph()
    rng = torch.cuda.get_rng_state()
    # thread_local: a data loader's pinning thread may touch CUDA while this thread captures. Autocast's
    # weight cache off, as in GraphedModel: its cast copies would be freed at the step's end under the graph.
    with torch.autocast("cuda", enabled=torch.is_autocast_enabled("cuda"), dtype=torch.get_autocast_dtype("cuda"),
                        cache_enabled=False), collector_paused(), \
            torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = body(static_batch)
    # The capture advanced the generator without drawing anything; the replay of this very step must draw
    # the masks an eager step would have drawn after the same reseeding.
    torch.cuda.set_rng_state(rng)
    return graph, out


class GraphedStep:
    """One training step (forward, loss, backward, optimizer step) as a single CUDA graph.

    `cuda_graph=true` (GraphedModel) graphs the model only; the loss, the optimizer's Python and Lightning's
    backward/step machinery still run eagerly each step, and on LRA Image that host time kept the graphed step
    (7.8 ms) above its GPU time (5.3 ms, results/lra/cuda_graph/). Here one replay does all of it, so the
    host's work per step is the batch copy, the replay, the scheduler step and Lightning's loop.

    The first `eager_steps` calls are ordinary eager steps (real training steps, which also create the
    optimizer state and the gradient buffers the graph then updates in place); the next call captures the
    step and replays it once; every later call copies the batch into the graph's input buffers and replays.
    `body(batch) -> (loss, logs)` does zero_grad, forward, loss, backward, gradient clipping and optimizer.step.
    What it needs (checked by the task and train/run.py): a CUDA device, one process, fixed batch shapes,
    tensors only, no attention mask, no gradient accumulation, no loss scaler, no torch.compile.
    """

    def __init__(self, eager_steps: int = 3):
        self.eager_steps = eager_steps
        self.steps = 0
        self.graph = None
        self.signature: tuple | None = None
        self.static_batch: dict | None = None
        self.static_out = None

    def __call__(self, body, batch: dict | torch.Tensor):
        """batch: a dict of tensors, or one tensor (the LM task's token windows)."""
        named = batch if isinstance(batch, dict) else {"batch": batch}
        signature = _signature((), named)
        if self.signature is None:
            self.signature = signature
        elif signature != self.signature:
            raise ValueError(f"cuda_graph=step: the training batch changed shape from {self.signature} to "
                             f"{signature}; a graph replays fixed shapes (every training batch must be whole)")
        self.steps += 1
        if self.steps <= self.eager_steps:
            return body(batch)
        if self.graph is None:
            # Copies: the graph's own input buffers, which every later step writes into.
            self.static_batch = {k: v.clone() for k, v in named.items()}
            static = self.static_batch if isinstance(batch, dict) else self.static_batch["batch"]
            self.graph, self.static_out = _cuda_capture(body, static)
        else:
            for k, v in named.items():
                self.static_batch[k].copy_(v, non_blocking=True)
        self.graph.replay()
        return self.static_out
