"""Split-level metrics accumulated exactly: sums and counts (float64 / int64) over every batch and rank,
divided once at the end, so a short last batch or an uneven shard weighs what its examples weigh.

MeanNLL: mean cross-entropy over the non-ignored targets (val/loss, val/mlm_loss); Perplexity: the
same plus exp of it (val/ppl); Accuracy: correct / counted (val/acc, val/mlm_acc, val/nsp_acc).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Metric


class MeanNLL(Metric):
    """update(logits (..., V), targets (...)) accumulates; compute() -> mean NLL (float64). update_mean(mean, count)
    adds a batch already reduced to its mean NLL."""

    full_state_update = False

    def __init__(self, ignore_index: int = -100):
        super().__init__()
        self.ignore_index = ignore_index
        self.add_state("nll_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor | None = None, *, count: int | None = None) -> None:
        """update(logits, targets), or update(mean_nll, count=n): see update_mean."""
        if count is not None:
            self.nll_sum += logits.double() * count
            self.count += count
            return
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                              ignore_index=self.ignore_index, reduction="none")
        valid = targets.reshape(-1) != self.ignore_index
        self.nll_sum += nll.double()[valid].sum()
        self.count += valid.sum()

    def update_mean(self, mean_nll: torch.Tensor, count: int) -> None:
        """A batch's mean NLL over its `count` targets, as a fused loss returns it (kernels/cross_entropy.py: the
        mean of float32 per-token losses, so exact to float32 rounding, ~1e-7 relative, not to float64).
        Through update(), which torchmetrics wraps: the update is counted and a cached compute() dropped."""
        self.update(mean_nll, count=count)

    def compute(self):
        if self.count == 0:
            raise ValueError(f"{type(self).__name__} of an empty split")
        return self.nll_sum / self.count


class Perplexity(MeanNLL):
    """compute() -> (mean NLL, exp(mean NLL)).

    Averaging per-batch losses would weight a short last batch like a full one; summing token NLLs in
    float64 and dividing once gives the exact corpus-level number however the split is batched.
    """

    def compute(self):
        mean = super().compute()
        return mean, torch.exp(mean)


class Accuracy(Metric):
    """update(logits (..., C), targets (...)): argmax hits over the non-ignored targets; compute() -> ratio."""

    full_state_update = False

    def __init__(self, ignore_index: int = -100):
        super().__init__()
        self.ignore_index = ignore_index
        self.add_state("correct", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        valid = targets != self.ignore_index
        self.correct += ((logits.argmax(-1) == targets) & valid).sum()
        self.count += valid.sum()

    def compute(self):
        if self.count == 0:
            raise ValueError("accuracy of an empty split")
        return self.correct.double() / self.count
