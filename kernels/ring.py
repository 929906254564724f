"""Ring attention: exact attention over a sequence split across the ranks of a torch.distributed group
(context parallelism; Liu et al., 2023, "Ring Attention with Blockwise Transformers"), built on the flash
kernel's log-sum-exp output.

Algorithm
- Each of the W ranks holds one contiguous chunk of the sequence: q, k, v of shape
  (batch, seqlen / W, nheads, headdim), the layout of kernels/flash.py (`shard_sequence` cuts them).
- Forward: K and V (stacked into one buffer, one message per step) travel around the ring in W - 1
  point-to-point steps (batch_isend_irecv: send to rank + 1, receive from rank - 1). The transfer of the
  next block is started before the current block is computed, so they overlap. Each block gives a
  partial output and its LSE (`flash_block_fwd`, float32); `merge_partial` folds it into the running
  output as a softmax over the union of keys: lse = logaddexp(lse, lse_b), out = out * exp(lse_old - lse)
  + out_b * exp(lse_b - lse), in float32 (float64 for float64 inputs).
- Backward (an autograd Function): K/V go around the ring again with an fp32 dK/dV accumulator that
  travels one step behind them; every rank adds its block's share (the kernel's backward run with the
  global LSE and delta = rowsum(dO * O) of the final output: the probabilities are then the global
  ones and the shares add up), and a last step hands each accumulator back to its owner. dQ stays local.
- Causal, contiguous split: the block from a later rank is skipped, the diagonal block is causal, earlier
  blocks are full. That is unbalanced: rank r computes r full blocks plus half a block, so rank 0 idles
  while rank W-1 works W - 1/2 blocks, and since every step waits for its neighbour, the ring runs at the
  pace of the last rank (causal ring time ~ non-causal ring time, not half of it). `zigzag=True` fixes it
  (the zigzag split of zhuzilin/ring-flash-attention; Llama 3 balances its context parallelism the same
  way): the sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r
  (`shard_sequence(..., zigzag=True)`); then every step is half a block on every rank: the causal
  diagonal, all our queries against the sender's first chunk, or our second chunk against all its keys.

Supports what the flash kernel supports (fp16/bf16, fp32 for tests, GQA/MQA, head dims 8..256), any
process group (NCCL for CUDA tensors, gloo for CPU tensors, e.g. under TRITON_INTERPRET=1), and a plain
PyTorch block computation (`TORCH_BLOCKS`, any dtype incl. float64) for tests on the CPU.

Known limits: no dropout (raises); no varlen/packed sequences; every rank must pass the same shapes
(not checked: a mismatch fails or hangs in the transfers); the dK/dV accumulator travels in float32
(twice the bytes of bf16 K/V); the overlap of transfers and compute is not measured yet; not traceable by
torch.compile (the P2P calls and the Function run eagerly); W = 1 calls flash_attn_func.

Layout: helpers (sharding, the LSE merge, the block plan, the P2P ring) -> block computations (flash and
plain PyTorch) -> ring forward / backward -> autograd Function -> public `ring_attn_func`; the test
reference `ring_attn_reference` (standard attention on the full sequence, this rank's rows).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from kernels.standard import causal_mask, repeat_kv, standard_attention

# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def shard_sequence(x: torch.Tensor, rank: int, world: int, zigzag: bool = False, dim: int = 1) -> torch.Tensor:
    """This rank's chunk of a full-sequence tensor (a view): chunk `rank` of `world`, or with zigzag the
    chunks rank and 2*world-1-rank of 2*world, concatenated (a copy)."""
    n, parts = x.shape[dim], 2 * world if zigzag else world
    if n % parts != 0:
        raise ValueError(f"sequence length {n} is not divisible by {parts} "
                         f"({'2 x ' if zigzag else ''}world size {world}{', zigzag' if zigzag else ''})")
    chunks = x.chunk(parts, dim)
    return torch.cat([chunks[rank], chunks[parts - 1 - rank]], dim) if zigzag else chunks[rank]


def unshard_sequence(shards: list[torch.Tensor], zigzag: bool = False, dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's chunk (in rank order): the inverse of shard_sequence."""
    if not zigzag:
        return torch.cat(shards, dim)
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def merge_partial(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block's partial attention into the running result, in place.

    out (batch, seqlen, nheads, headdim) and lse (batch, nheads, seqlen), both in the accumulation dtype
    (views are fine); block_out / block_lse: the same for attention over one more block of keys. Start
    from out = 0, lse = -inf: the first merge then copies the block exactly. Rows that have seen no key
    yet (lse = -inf on both sides) stay 0 / -inf, without NaN.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    ref = new_lse.masked_fill(new_lse == float("-inf"), 0.0)  # exp(-inf - 0) = 0, never exp(-inf + inf)
    w_old = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(block_lse - ref).transpose(1, 2).unsqueeze(-1)
    out.mul_(w_old).add_(block_out * w_new)
    lse.copy_(new_lse)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _block_plan(rank: int, src: int, seqlen: int, causal: bool, zigzag: bool):
    """Which of this rank's query rows see which keys of the chunk that `src` owns: (query slice, key
    slice, causal) along the local sequence, or None when none does."""
    full = slice(None)
    if not causal:
        return full, full, False
    if src == rank:
        return full, full, True  # both halves in order under zigzag too: a plain causal mask
    if not zigzag:
        return (full, full, False) if src < rank else None
    half = seqlen // 2
    if src < rank:  # the sender's first chunk (src) precedes both of ours, its second follows both
        return full, slice(0, half), False
    return slice(half, None), full, False  # only our second chunk (2W-1-r) follows both of the sender's


class _Ring:
    """Point-to-point steps around the ranks of a group: send to rank + 1, receive from rank - 1."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        g = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(g, (self.rank + 1) % self.world)  # P2POp takes global ranks
        self.prev = dist.get_global_rank(g, (self.rank - 1) % self.world)

    def start(self, send: torch.Tensor):
        """Start passing `send` on; returns (receive buffer, pending). `send` must not change until the
        pending transfer is waited on; the pending tuple keeps it alive."""
        recv = torch.empty_like(send)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.next, self.group),
                                       dist.P2POp(dist.irecv, recv, self.prev, self.group)])
        return recv, (reqs, send)

    @staticmethod
    def wait(pending) -> None:
        # NCCL: makes the current stream wait for the transfer (no host sync); gloo: blocks.
        for r in pending[0]:
            r.wait()


# ---------------------------------------------------------------------------------------------------
# Block computations: attention of q against one block of keys, with the LSE for merging, and that
# block's share of the gradients given the global LSE and delta.
# ---------------------------------------------------------------------------------------------------


class BlockOps(NamedTuple):
    """fwd(q, k, v, scale, causal) -> (out, lse) in the accumulation dtype, lse natural-log
    (batch, nheads, seqlen_q); bwd(do, q, k, v, lse, delta, scale, causal) -> (dq, dk, dv) in the
    accumulation dtype. q/k/v/do may be strided views (head dim contiguous)."""

    name: str
    fwd: Callable
    bwd: Callable


def _flash_block_fwd(q, k, v, scale, causal):
    from kernels.flash import flash_block_fwd

    return flash_block_fwd(q, k, v, scale, causal)


def _flash_block_bwd(do, q, k, v, lse, delta, scale, causal):
    from kernels.flash import flash_block_bwd

    return flash_block_bwd(do, q, k, v, lse, delta, scale, causal)


def _torch_fwd(q, k, v, scale, causal):
    acc = _acc_dtype(q.dtype)
    out, lse = standard_attention(q.to(acc), k.to(acc), v.to(acc), softmax_scale=scale, causal=causal,
                                  return_lse=True)
    return out, lse.to(acc)


def _torch_bwd(do, q, k, v, lse, delta, scale, causal):
    acc = _acc_dtype(q.dtype)
    batch, seqlen_k, nheads_k, headdim = k.shape
    nheads = q.shape[2]
    q, do = q.to(acc), do.to(acc)
    kk, vv = repeat_kv(k.to(acc), nheads), repeat_kv(v.to(acc), nheads)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, kk)
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], seqlen_k, q.device), float("-inf"))
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # rows that see no key: p = 0
    p = torch.exp(s - lse[..., None])
    ds = p * (torch.einsum("bqhd,bkhd->bhqk", do, vv) - delta[..., None])
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    group = nheads // nheads_k  # query head h reads key head h // group: sum each group's shares
    dk = dk.view(batch, seqlen_k, nheads_k, group, headdim).sum(3)
    dv = dv.view(batch, seqlen_k, nheads_k, group, headdim).sum(3)
    return dq, dk, dv


FLASH_BLOCKS = BlockOps("flash", _flash_block_fwd, _flash_block_bwd)
TORCH_BLOCKS = BlockOps("torch", _torch_fwd, _torch_bwd)


# ---------------------------------------------------------------------------------------------------
# The ring
# ---------------------------------------------------------------------------------------------------


def ring_forward(q, k, v, scale: float, causal: bool, zigzag: bool, group, ops: BlockOps = FLASH_BLOCKS):
    """(out, lse) of this rank's queries against the whole sequence, in the accumulation dtype (no
    autograd). out (batch, seqlen_local, nheads, headdim), lse natural-log (batch, nheads, seqlen_local)."""
    ring = _Ring(group)
    acc = _acc_dtype(q.dtype)
    batch, seqlen, nheads, _ = q.shape
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full((batch, nheads, seqlen), float("-inf"), dtype=acc, device=q.device)
    kv = torch.stack([k, v])  # one message per step
    for step in range(ring.world):
        if step + 1 < ring.world:
            kv_next, pending = ring.start(kv)  # overlaps with this step's block
        plan = _block_plan(ring.rank, (ring.rank - step) % ring.world, seqlen, causal, zigzag)
        if plan is not None:
            qs, ks, block_causal = plan
            o_b, lse_b = ops.fwd(q[:, qs], kv[0][:, ks], kv[1][:, ks], scale, block_causal)
            merge_partial(out[:, qs], lse[:, :, qs], o_b, lse_b)
        if step + 1 < ring.world:
            ring.wait(pending)
            kv = kv_next
    return out, lse


def ring_backward(do, q, k, v, out, lse, scale: float, causal: bool, zigzag: bool, group,
                  ops: BlockOps = FLASH_BLOCKS):
    """(dq, dk, dv) of this rank's chunk, in the accumulation dtype. out: the forward's output (as
    returned, q's dtype); lse: its global natural-log LSE."""
    ring = _Ring(group)
    acc = _acc_dtype(q.dtype)
    seqlen = q.shape[1]
    delta = (do.to(acc) * out.to(acc)).sum(-1).transpose(1, 2).contiguous()  # (batch, nheads, seqlen)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = torch.stack([k, v])
    dkv, dkv_pending = None, None
    for step in range(ring.world):
        if step + 1 < ring.world:
            kv_next, kv_pending = ring.start(kv)
        plan = _block_plan(ring.rank, (ring.rank - step) % ring.world, seqlen, causal, zigzag)
        if plan is not None:
            qs, ks, block_causal = plan
            dq_b, dk_b, dv_b = ops.bwd(do[:, qs], q[:, qs], kv[0][:, ks], kv[1][:, ks], lse[:, :, qs],
                                       delta[:, :, qs], scale, block_causal)
            dq[:, qs].add_(dq_b)
        # The dK/dV accumulator of the block we hold arrived from rank - 1 during this step's compute (sent
        # at the end of the previous step); with our share added it moves on, one step behind K/V. The
        # block held at the last step is rank + 1's own, so that last transfer returns it to its owner.
        if dkv_pending is not None:
            ring.wait(dkv_pending)
        if dkv is None:
            dkv = torch.zeros(kv.shape, dtype=acc, device=q.device)
        if plan is not None:
            dkv[0][:, ks].add_(dk_b)
            dkv[1][:, ks].add_(dv_b)
        if ring.world > 1:
            dkv, dkv_pending = ring.start(dkv)
        if step + 1 < ring.world:
            ring.wait(kv_pending)
            kv = kv_next
    if dkv_pending is not None:
        ring.wait(dkv_pending)
    return dq, dkv[0], dkv[1]


class _RingAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, zigzag, group, ops):
        out, lse = ring_forward(q, k, v, scale, causal, zigzag, group, ops)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, zigzag, group, ops)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(do, q, k, v, out, lse, *ctx.args)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


# ---------------------------------------------------------------------------------------------------
# Checks and the public function
# ---------------------------------------------------------------------------------------------------


def check_ring_inputs(q, k, v, zigzag: bool, group, ops: BlockOps, dropout_p: float = 0.0) -> None:
    """Raise a clear error for inputs the ring cannot take; the kernel's own checks run for flash blocks."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"ring attention does not support dropout (got dropout_p={dropout_p}); "
                                  "use flash_attn_func on one GPU for attention dropout")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be this rank's chunk (batch, seqlen_local, nheads, headdim), "
                             f"got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"ring attention needs q, k, v chunks of the same batch, length and head dim (k and v "
                         f"of one shape), got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"nheads ({q.shape[2]}) must be a multiple of nheads_k ({k.shape[2]}) (MQA/GQA)")
    if zigzag and q.shape[1] % 2 != 0:
        raise ValueError(f"zigzag needs an even local length (two chunks per rank), got {q.shape[1]}: "
                         "the full length must be divisible by 2 x world size")
    if ops is FLASH_BLOCKS:
        from kernels.flash import check_inputs

        check_inputs(q, k, v)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring attention needs a torch.distributed process group: call "
                           "torch.distributed.init_process_group (e.g. under torchrun) first; on one device "
                           "use flash_attn_func on the whole sequence")
    if dist.get_rank(group) < 0:
        raise ValueError("this rank is not a member of the process group passed as `group`")
    backend = str(dist.get_backend(group))
    if q.device.type == "cpu" and backend == "nccl":
        raise ValueError("the NCCL process group passes CUDA tensors, got CPU tensors (use gloo for CPU)")
    if q.device.type == "cuda" and "nccl" in backend and q.device.index != torch.cuda.current_device():
        raise ValueError(f"q is on {q.device} but the current CUDA device is cuda:{torch.cuda.current_device()}: "
                         "call torch.cuda.set_device(local_rank) first (NCCL sends from the current device)")


def ring_attn_func(q, k, v, causal: bool = False, softmax_scale: float | None = None, group=None, *,
                   zigzag: bool = False, dropout_p: float = 0.0, block_ops: BlockOps | None = None):
    """Exact attention over a sequence split across the ranks of `group` (default: the world).

    q (batch, seqlen / W, nheads, headdim) and k, v (batch, seqlen / W, nheads_k, headdim): this rank's
    chunk, contiguous in the sequence (rank r holds tokens [r * n, (r + 1) * n)), or with zigzag=True the
    chunks r and 2W-1-r of 2W (balanced causal work; `shard_sequence(x, rank, W, zigzag=True)` cuts them).
    Returns this rank's rows of the output, in q's dtype; differentiable (dK/dV return to their owners).
    causal: over global positions; softmax_scale defaults to 1/sqrt(headdim). Every rank must call it with
    the same shapes and arguments. dropout_p must be 0 (not supported). block_ops: the block computation,
    FLASH_BLOCKS (default, the Triton kernel) or TORCH_BLOCKS (plain PyTorch: CPU tests, float64).
    With a group of one rank this is flash_attn_func (the chunk is the whole sequence).
    """
    ops = FLASH_BLOCKS if block_ops is None else block_ops
    check_ring_inputs(q, k, v, zigzag, group, ops, dropout_p)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if dist.get_world_size(group) == 1 and ops is FLASH_BLOCKS:
        from kernels.flash import flash_attn_func

        return flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)
    return _RingAttn.apply(q, k, v, scale, bool(causal), bool(zigzag), group, ops)


def ring_attn_reference(q_full, k_full, v_full, rank: int, world: int, causal: bool = False,
                        softmax_scale: float | None = None, zigzag: bool = False) -> torch.Tensor:
    """What ring_attn_func returns on `rank`, computed in plain PyTorch from the full sequence (tests)."""
    out = standard_attention(q_full, k_full, v_full, softmax_scale=softmax_scale, causal=causal)
    return shard_sequence(out, rank, world, zigzag)


__all__ = ["ring_attn_func", "ring_attn_reference", "shard_sequence", "unshard_sequence", "merge_partial",
           "check_ring_inputs", "ring_forward", "ring_backward", "BlockOps", "FLASH_BLOCKS", "TORCH_BLOCKS"]
