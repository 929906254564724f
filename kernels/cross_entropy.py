"""Fused LM-head cross-entropy: the mean loss of `hidden @ weight.T` against next-token targets, without float32
logits and without a second pass over them in the backward.

Why: at GPT-2 small's training shape (16 x 1024 tokens, 50,304 padded vocabulary rows) the plain loss, F.cross_entropy
on `logits.float()`, spent ~20 of a 59 ms H100 step on the logits alone: the bfloat16 -> float32 copy, log_softmax,
its backward and the gradient's copy back (results/training/vocab_padding/profile/). Here, per chunk of rows:
- the logits are made by one matmul in the compute dtype (bfloat16 under autocast);
- one Triton program per row reads them twice: a running max / sum in float32 gives the log-sum-exp and the row's
  loss, then it overwrites the logits in place with the loss's gradient, (softmax - onehot) / n_targets, zero in
  the padding columns (>= vocab_size) and in rows whose target is ignore_index;
- two matmuls turn that into the gradients of hidden and weight, already in the forward (as Liger-Kernel's fused
  linear cross-entropy does): the backward only scales them by the incoming gradient.
Memory falls with it: one chunk of compute-dtype logits lives at a time, instead of the logits in two dtypes
and their gradient.

Layout of this module: @triton.jit row kernel -> checked host function (chunks, matmuls) -> operator
`flashattn::linear_cross_entropy` (kernels/ops.py; fake implementation) and the autograd Function that calls it under
torch.compile -> public `linear_cross_entropy`; `linear_cross_entropy_reference` beside it is the plain PyTorch loss.

On CUDA the row step is the kernel; on the CPU it runs as PyTorch operations (the same arithmetic in float32), and
as the kernel under TRITON_INTERPRET=1 only when KERNEL_ON_CPU is set (the tests set it: the interpreter takes
minutes for one step of a 50K vocabulary, so CPU training takes the PyTorch form). A target outside [0, vocab_size) that is not ignore_index makes
the loss NaN (no device sync to raise on; F.cross_entropy raises a device-side assert instead).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import ops

from kernels.launch import _interpreting

# Compute-dtype logits per chunk, in elements: 2^29 is 1 GiB of bfloat16 (two chunks at GPT-2 small's 16K tokens).
CHUNK_ELEMENTS = 2**29
KERNEL_ON_CPU = False  # run the kernel on CPU tensors too, under TRITON_INTERPRET=1 (tests)


@triton.jit
def _ce_rows_kernel(logits, targets, losses, inv_count, stride_row, n_cols, vocab, ignore_index,
                    BLOCK: tl.constexpr, WRITE_GRAD: tl.constexpr):
    """One row: loss = logsumexp(x[:vocab]) - x[target]; with WRITE_GRAD, x <- (softmax(x) - onehot) * inv_count."""
    row = tl.program_id(0).to(tl.int64)
    ptr = logits + row * stride_row
    target = tl.load(targets + row).to(tl.int32)
    cols = tl.arange(0, BLOCK)
    # Lane-wise running max and sum; a lane that has only seen -inf keeps sum 0 (m_safe avoids -inf - -inf).
    m_lane = tl.full([BLOCK], float("-inf"), tl.float32)
    s_lane = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        c = start + cols
        x = tl.load(ptr + c, mask=c < vocab, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_lane, x)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_lane = s_lane * tl.exp(m_lane - m_safe) + tl.exp(x - m_safe)
        m_lane = m_new
    m = tl.max(m_lane, 0)
    lse = m + tl.log(tl.sum(s_lane * tl.exp(m_lane - m), 0))
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < vocab)
    x_target = tl.load(ptr + tl.where(in_range, target, 0)).to(tl.float32)
    loss = tl.where(ignored, 0.0, tl.where(in_range, lse - x_target, float("nan")))
    tl.store(losses + row, loss)
    if WRITE_GRAD:
        scale = tl.where(ignored, 0.0, tl.load(inv_count))
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            x = tl.load(ptr + c, mask=c < n_cols, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) * scale - tl.where(c == target, scale, 0.0)
            g = tl.where(c < vocab, g, 0.0)
            tl.store(ptr + c, g.to(logits.dtype.element_ty), mask=c < n_cols)


def _rows_torch(logits, targets, losses, inv_count, vocab, ignore_index, write_grad):
    """The kernel's arithmetic in PyTorch (CPU tensors)."""
    x = logits[:, :vocab].float()
    lse = torch.logsumexp(x, dim=1)
    ignored = targets == ignore_index
    in_range = (targets >= 0) & (targets < vocab)
    x_target = x.gather(1, torch.where(in_range, targets, 0)[:, None])[:, 0]
    nan = torch.full_like(lse, float("nan"))
    losses.copy_(torch.where(ignored, 0.0, torch.where(in_range, lse - x_target, nan)))
    if write_grad:
        scale = torch.where(ignored, 0.0, inv_count)[:, None]
        g = torch.exp(x - lse[:, None]) * scale
        g.scatter_add_(1, torch.where(in_range, targets, 0)[:, None], -scale * in_range[:, None])
        logits[:, :vocab] = g.to(logits.dtype)
        logits[:, vocab:] = 0


def _check(hidden, weight, targets, vocab_size, compute_dtype):
    if hidden.dim() < 2 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden (..., D) and weight (V, D) expected; got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must have hidden's leading shape {tuple(hidden.shape[:-1])}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64 or int32 token ids, got {targets.dtype}")
    if not 1 <= vocab_size <= weight.shape[0]:
        raise ValueError(f"vocab_size {vocab_size} must be in [1, {weight.shape[0]}] (weight's rows)")
    if not (hidden.device == weight.device == targets.device):
        raise ValueError(f"hidden, weight and targets on different devices: {hidden.device}, {weight.device}, "
                         f"{targets.device}")
    if compute_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"compute dtype {compute_dtype} not supported (float16, bfloat16, float32)")


def _forward(hidden, weight, targets, vocab_size, ignore_index, compute_dtype, need_grad, chunk_elements):
    """-> (mean loss (float32 scalar), d loss / d hidden, d loss / d weight); the gradients are empty without need_grad."""
    d = hidden.shape[-1]
    h = hidden.reshape(-1, d).to(compute_dtype)
    t = targets.reshape(-1)
    w = weight.to(compute_dtype)
    n, n_cols = h.shape[0], w.shape[0]
    losses = torch.empty(n, dtype=torch.float32, device=h.device)
    count = (t != ignore_index).sum()
    inv_count = (1.0 / count.float()).reshape(1)  # a tensor: no host sync
    dh = torch.empty_like(h) if need_grad else h.new_empty(0)
    dw = torch.zeros(n_cols, d, dtype=torch.float32, device=h.device) if need_grad else h.new_empty(0)
    rows = max(1, min(n, chunk_elements // n_cols))
    use_kernel = h.is_cuda or (KERNEL_ON_CPU and _interpreting())
    block = min(4096, triton.next_power_of_2(vocab_size))
    with torch.autocast(h.device.type, enabled=False):
        for start in range(0, n, rows):
            end = min(n, start + rows)
            logits = h[start:end] @ w.t()
            if use_kernel:
                _ce_rows_kernel[(end - start,)](logits, t[start:end], losses[start:end], inv_count, logits.stride(0),
                                                n_cols, vocab_size, ignore_index, BLOCK=block, WRITE_GRAD=need_grad,
                                                num_warps=8 if block >= 2048 else 4)
            else:
                _rows_torch(logits, t[start:end], losses[start:end], inv_count, vocab_size, ignore_index, need_grad)
            if need_grad:
                torch.mm(logits, w, out=dh[start:end])
                dw += (logits.t() @ h[start:end]).float()
    return losses.sum() * inv_count[0], dh.reshape(hidden.shape) if need_grad else dh, dw


def _lce_fake(hidden, weight, targets, vocab_size, ignore_index, compute_dtype, need_grad, chunk_elements):
    loss = hidden.new_empty((), dtype=torch.float32)
    if not need_grad:
        return loss, hidden.new_empty(0, dtype=compute_dtype), hidden.new_empty(0, dtype=compute_dtype)
    return (loss, hidden.new_empty(hidden.shape, dtype=compute_dtype),
            weight.new_empty(weight.shape, dtype=torch.float32))


_lce_op = ops.define("linear_cross_entropy(Tensor hidden, Tensor weight, Tensor targets, SymInt vocab_size, "
                     "SymInt ignore_index, ScalarType compute_dtype, bool need_grad, SymInt chunk_elements) "
                     "-> (Tensor, Tensor, Tensor)", _forward, _lce_fake)


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss: `_forward` in eager mode, the operator under torch.compile (kernels/ops.py). The gradients are made
    in the forward, so the backward only scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_size, ignore_index, compute_dtype, need_grad, chunk_elements):
        loss, dh, dw = _lce_op(hidden, weight, targets, vocab_size, ignore_index, compute_dtype, need_grad,
                               chunk_elements)
        ctx.save_for_backward(dh, dw)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.need_grad = need_grad
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if not ctx.need_grad:
            raise RuntimeError("linear_cross_entropy ran without gradients (need_grad=False); it cannot be "
                               "differentiated")
        dh, dw = ctx.saved_tensors
        return ((dh * grad_loss).to(ctx.dtypes[0]), (dw * grad_loss).to(ctx.dtypes[1]), None, None, None, None, None,
                None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         vocab_size: int | None = None, ignore_index: int = -100,
                         chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Mean cross-entropy of the logits `hidden @ weight.T` (their first vocab_size columns) against targets.

    hidden (..., D); weight (V_padded, D), rows past vocab_size (padding) take no part and get zero gradient;
    targets (...) int64 ids, ignore_index skipped (as F.cross_entropy). The matmuls run in autocast's dtype when
    autocast is on, otherwise in hidden's and weight's promoted dtype; the softmax in float32. Equal to
    `linear_cross_entropy_reference` within the compute dtype's rounding of the logits and gradients.
    """
    vocab_size = weight.shape[0] if vocab_size is None else int(vocab_size)
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        compute_dtype = torch.get_autocast_dtype(device_type)
    else:
        compute_dtype = torch.promote_types(hidden.dtype, weight.dtype)
    _check(hidden, weight, targets, vocab_size, compute_dtype)
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(hidden, weight, targets, vocab_size, ignore_index, compute_dtype, need_grad,
                                     int(chunk_elements))


def linear_cross_entropy_reference(hidden, weight, targets, vocab_size=None, ignore_index=-100):
    """The plain PyTorch loss: float32 cross-entropy of the materialised logits."""
    vocab_size = weight.shape[0] if vocab_size is None else vocab_size
    logits = (hidden @ weight.t())[..., :vocab_size]
    return F.cross_entropy(logits.reshape(-1, vocab_size).float(), targets.reshape(-1), ignore_index=ignore_index)
