"""Perplexity as exp(mean token NLL) over a whole split, summed in float64 across batches and ranks."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchmetrics import Metric


class Perplexity(Metric):
    """update(logits (..., V), targets (...)) accumulates; compute() -> (mean NLL, exp(mean NLL)).

    Averaging per-batch losses would weight a short last batch like a full one; summing token NLLs in
    float64 and dividing once gives the exact corpus-level number however the split is batched.
    """

    full_state_update = False

    def __init__(self, ignore_index: int = -100):
        super().__init__()
        self.ignore_index = ignore_index
        self.add_state("nll_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                              ignore_index=self.ignore_index, reduction="none")
        valid = targets.reshape(-1) != self.ignore_index
        self.nll_sum += nll.double()[valid].sum()
        self.count += valid.sum()

    def compute(self):
        if self.count == 0:
            raise ValueError("perplexity of an empty split")
        mean = self.nll_sum / self.count
        return mean, torch.exp(mean)


def perplexity_from_nll(nll_sum: float, count: int) -> float:
    return math.exp(nll_sum / count)
