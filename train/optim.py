"""Optimizers and learning-rate schedules behind configs/optimizer/ and configs/scheduler/.

Both groups are Hydra partials (`_partial_: true`): the task calls `optimizer(param_groups)` and then
`scheduler(optimizer)`. Parameter groups come from `param_groups`: weight decay on matrices and
embeddings, none on biases, norms and other 1-d parameters (the group without decay sets
weight_decay 0; the other inherits the optimizer's own value).

Schedules are per optimizer step: linear warmup from lr/warmup_steps to lr, then a decay to
lr * min_lr_ratio at max_steps (cosine, linear, polynomial, or none), constant afterwards.
"""
from __future__ import annotations

import math

import torch
from torch import nn

DECAYS = ("cosine", "linear", "poly", "constant")


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters that take no weight decay: biases, norm weights, anything 1-d."""
    out = set()
    for mod_name, mod in model.named_modules():
        is_norm = isinstance(mod, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or type(mod).__name__.endswith("Norm")
        for p_name, p in mod.named_parameters(recurse=False):
            if is_norm or p.ndim < 2 or p_name == "bias":
                out.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    return out


def param_groups(model: nn.Module, no_decay: set[str] | None = None) -> list[dict]:
    """[{params: decayed}, {params: not decayed, weight_decay: 0}], each in model.parameters() order.

    `no_decay` (names from `no_decay_names`) can be computed before a strategy reshapes parameters
    (FSDP flattens them to 1-d), so the choice never depends on the wrapped shapes.
    """
    skip = no_decay_names(model) if no_decay is None else no_decay
    decay, plain = [], []
    for name, p in model.named_parameters():  # tied weights are yielded once
        if p.requires_grad:
            (plain if name in skip else decay).append(p)
    return [{"params": decay}, {"params": plain, "weight_decay": 0.0}]


def adamw(params, lr: float = 6e-4, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1,
          fused: bool | None = None) -> torch.optim.AdamW:
    """torch.optim.AdamW, fused (one kernel for all parameters) when every parameter is on a GPU."""
    params = list(params)
    if fused is None:
        tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        fused = torch.cuda.is_available() and all(p.is_cuda for p in tensors) or None
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=fused)


def lr_multiplier(step: int, warmup_steps: int, max_steps: int, decay: str = "cosine",
                  min_lr_ratio: float = 0.0, power: float = 1.0) -> float:
    """LR / peak LR at optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    if decay == "cosine":
        shape = 0.5 * (1 + math.cos(math.pi * progress))
    elif decay == "linear":
        shape = 1 - progress
    elif decay == "poly":
        shape = (1 - progress) ** power
    else:
        raise ValueError(f"unknown decay {decay!r}; choose one of {DECAYS}")
    return min_lr_ratio + (1 - min_lr_ratio) * shape


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    return lr_multiplier(step, warmup_steps, max_steps, "cosine", min_lr_ratio)


class _Multiplier:
    """A picklable LR lambda (LambdaLR checkpoints its attributes, so a resumed run keeps the shape)."""

    def __init__(self, **kw):
        self.kw = kw

    def __call__(self, step):
        return lr_multiplier(step, **self.kw)


def warmup_schedule(optimizer, max_steps: int, warmup_steps: int = 0, decay: str = "cosine",
                    min_lr_ratio: float = 0.0, power: float = 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; choose one of {DECAYS}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _Multiplier(
        warmup_steps=warmup_steps, max_steps=max_steps, decay=decay, min_lr_ratio=min_lr_ratio, power=power))
