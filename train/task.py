"""The LightningModule for causal language modelling: loss, AdamW + warmup/cosine, val perplexity."""
from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from train.metrics import Perplexity


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup from 0 to 1 over warmup_steps, then cosine down to min_lr_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class LMTask(L.LightningModule):
    def __init__(self, model: nn.Module, lr: float = 6e-4, weight_decay: float = 0.1,
                 betas=(0.9, 0.95), eps: float = 1e-8, warmup_steps: int = 2000, max_steps: int | None = None,
                 min_lr_ratio: float = 0.1, compile: bool = False, seed: int = 1234, reseed_each_step: bool = True):
        super().__init__()
        self.save_hyperparameters(ignore=["model"])
        self.model = model
        if compile:
            model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
        self.val_ppl = Perplexity()

    def forward(self, input_ids):
        return self.model(input_ids)

    def on_train_batch_start(self, batch, batch_idx):
        # Dropout masks as a function of (seed, micro-batch): a resumed run draws the same ones.
        if self.hparams.reseed_each_step:
            accum = self.trainer.accumulate_grad_batches
            micro = self.trainer.global_step * accum + batch_idx % accum
            torch.manual_seed(self.hparams.seed * 1_000_003 + micro)

    def training_step(self, batch, batch_idx):
        x, y = batch[:, :-1], batch[:, 1:]
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch[:, :-1], batch[:, 1:]
        self.val_ppl.update(self.model(x), y)

    def on_validation_epoch_end(self):
        nll, ppl = self.val_ppl.compute()
        self.val_ppl.reset()
        self.log("val/loss", nll.float(), prog_bar=True, sync_dist=False)
        self.log("val/ppl", ppl.float(), sync_dist=False)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # Lightning's mixed-precision plugin refuses to clip for a fused AdamW (fused unscaling is an
        # fp16 loss-scaler concern). bf16 and float32 have no scaler, so clip the global norm here.
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None or gradient_clip_algorithm == "value":
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val, foreach=True)

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings; not biases or LayerNorm
        no_decay = [p for p in params if p.dim() < 2]
        fused = torch.cuda.is_available() and all(p.is_cuda for p in params)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps, fused=fused or None,
        )
        max_steps = hp.max_steps or self.trainer.max_steps
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, hp.warmup_steps, max_steps, hp.min_lr_ratio)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
