"""Padding removal, done once per model forward.

A padded batch (batch, seqlen, ...) with an attention mask becomes packed tokens (total_tokens, ...):
the model calls `PackedBatch.from_mask(attention_mask)` once, `unpad`s its embeddings, runs every layer
on (total_tokens, hidden) and hands the same `PackedBatch` to each attention core, which runs a varlen
kernel on it (flash, block-sparse) or re-pads for its padded path (standard, SDPA). At the end the model
`pad`s the output back if it needs a padded result. Building the PackedBatch costs the forward's one
host sync (the sequence lengths, which size the kernel grids); nothing else reads device values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PackedBatch:
    """Where the real tokens of a padded (batch, seqlen) batch sit, and their per-sequence bounds.

    indices: (total,) int64 flat positions (b * seqlen + t) of the real tokens, in order;
    cu_seqlens: (batch + 1,) int32 prefix sums of the lengths (the varlen kernels' input);
    max_seqlen, total: host ints; mask: the (batch, seqlen) bool mask it was built from.
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    total: int
    mask: torch.Tensor

    @property
    def batch(self) -> int:
        return self.mask.shape[0]

    @property
    def seqlen(self) -> int:
        return self.mask.shape[1]

    @property
    def lengths(self) -> torch.Tensor:
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, lengths_host=None) -> "PackedBatch":
        """From a (batch, seqlen) mask, True/1 at real tokens. One device-to-host copy (the lengths), unless
        `lengths_host` gives them: the per-row counts of real tokens (a list or CPU tensor), read
        before the mask went to the device (train.task.Task adds them to every batch). Then nothing
        waits for the device, and the device checks them against the mask asynchronously (a mismatch
        fails the next synchronising call, never computes quietly on wrong bounds)."""
        if attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be (batch, seqlen), got shape {tuple(attention_mask.shape)}")
        if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
            raise TypeError(f"attention_mask must be bool or integer (1 = real token), got {attention_mask.dtype}")
        batch, seqlen = attention_mask.shape
        mask = attention_mask.bool()
        lengths = mask.sum(dim=1, dtype=torch.int32)  # on the device: cu_seqlens always come from the mask
        if lengths_host is None:
            if attention_mask.dtype != torch.bool and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                raise ValueError("attention_mask must hold only 0 and 1 (1 = real token)")
            lengths_host = lengths.tolist()  # the one sync: max_seqlen sizes the kernel grids
        else:
            lengths_host = [int(n) for n in (lengths_host.tolist() if torch.is_tensor(lengths_host) else lengths_host)]
            if len(lengths_host) != batch or any(n > seqlen or n < 0 for n in lengths_host):
                raise ValueError(f"lengths {lengths_host} do not fit an attention_mask of shape {(batch, seqlen)}")
            # The host values size the grids (max) and the packed tensor (total): the device checks both
            # against the mask without a copy either way.
            agree = (lengths.sum() == sum(lengths_host)) & (lengths.max() == max(lengths_host))
            if attention_mask.dtype != torch.bool:
                agree = agree & ((attention_mask == 0) | (attention_mask == 1)).all()
            torch._assert_async(agree, "lengths differ from attention_mask.sum(1), or the mask is not 0/1")
        if min(lengths_host) == 0:
            raise ValueError(f"sequence {lengths_host.index(0)} of the batch has no real token "
                             "(an all-zero attention_mask row); drop empty sequences before the model")
        total = sum(lengths_host)
        # A stable sort puts the real positions first, in order, without a second data-dependent sync
        # (nonzero() would need one to size its output).
        indices = torch.argsort((~mask).flatten().to(torch.int8), stable=True)[:total]
        cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        return cls(indices, cu_seqlens, max(lengths_host), total, mask)

    @classmethod
    def full(cls, batch: int, seqlen: int, device) -> "PackedBatch":
        """Every token real (no sync at all): for code paths that pack unpadded batches."""
        mask = torch.ones(batch, seqlen, dtype=torch.bool, device=device)
        cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
        return cls(torch.arange(batch * seqlen, device=device), cu, seqlen, batch * seqlen, mask)


def unpad(x: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """(batch, seqlen, ...) -> (total, ...), keeping the real tokens."""
    return x.reshape(-1, *x.shape[2:]).index_select(0, packed.indices)


def pad(x: torch.Tensor, packed: PackedBatch, value: float = 0.0) -> torch.Tensor:
    """(total, ...) -> (batch, seqlen, ...), `value` at padding positions (differentiable)."""
    out = x.new_full((packed.batch * packed.seqlen, *x.shape[1:]), value)
    out = out.index_copy(0, packed.indices, x)
    return out.view(packed.batch, packed.seqlen, *x.shape[1:])
