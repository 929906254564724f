"""Speed, model-FLOPs utilisation and memory logging, the same way for every model family.

Tokens are real tokens: the task's `batch_tokens(batch)` returns, per micro-batch, the count of
non-padding tokens and the sum of squared sequence lengths (device tensors, so no host sync per step),
and the model's `flops(tokens, sum_sq_len)` turns a window's totals into training FLOPs (forward +
backward): 6 N tokens + 12 L H Q sum_sq_len (Kaplan et al., 2020; PaLM appendix B), the attention
term halved when causal. The formula is linear in both counts, so one call per window is exact.
tokens/s sums every rank; MFU divides the achieved FLOP/s per GPU by its dense bf16 peak
(`peak_flops`, or detected from the device name).
"""
from __future__ import annotations

import time

import lightning as L
import torch

from models.layers import transformer_flops

# Dense bf16 tensor-core peaks (datasheets), matched as substrings of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989.5e12),  # SXM
    ("H200", 989.5e12),
    ("GH200", 989.5e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
]


def detect_peak_flops(device_name: str | None = None) -> float | None:
    if device_name is None:
        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int,
                    causal: bool = True) -> float:
    """Training FLOPs per token of full-length sequences of seq_len tokens."""
    return transformer_flops(n_params, n_layer, n_head, head_dim, seq_len, seq_len**2, causal) / seq_len


def model_flops(model, tokens, sum_sq_len) -> float | None:
    """model.flops(tokens, sum_sq_len), or None for a model that does not say (no MFU then)."""
    return float(model.flops(tokens, sum_sq_len)) if hasattr(model, "flops") else None


class SpeedMonitor(L.Callback):
    """Logs perf/tokens_per_s, perf/step_time_ms, perf/mfu and perf/peak_mem_gib every `every` steps.

    Time is measured over whole windows of optimizer steps with one device sync at each window edge
    (and, with several ranks, one all-reduce of the token counts), so logging costs one sync per
    window, not per step. The first window (compilation, cudnn autotune, allocator growth) is logged
    but kept out of `steady_state()`.
    """

    def __init__(self, every: int = 10, peak_flops: float | None = None):
        self.every, self.peak_flops = every, peak_flops
        self.history: list[dict] = []

    def _sync(self, pl_module):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer, pl_module):
        if self.peak_flops is None and pl_module.device.type == "cuda":
            self.peak_flops = detect_peak_flops(torch.cuda.get_device_name(pl_module.device))
        self._tokens = self._sum_sq = 0
        self._world_size = trainer.world_size
        self._last_step = trainer.global_step
        self._sync(pl_module)
        self._t0 = time.perf_counter()
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        tokens, sum_sq = pl_module.batch_tokens(batch)
        self._tokens, self._sum_sq = self._tokens + tokens, self._sum_sq + sum_sq
        step = trainer.global_step
        if step == self._last_step or step % self.every != 0:
            return
        counts = torch.stack([torch.as_tensor(c, dtype=torch.int64, device=pl_module.device)
                              for c in (self._tokens, self._sum_sq)])
        counts = trainer.strategy.reduce(counts, reduce_op="sum")  # every rank's tokens
        tokens, sum_sq = (int(v) for v in counts.tolist())  # the window's one host sync
        self._sync(pl_module)
        now = time.perf_counter()
        dt = now - self._t0
        steps = step - self._last_step
        rec = {"step": step, "steps": steps, "seconds": dt, "tokens": tokens, "sum_sq_len": sum_sq,
               "tokens_per_s": tokens / dt, "step_time_ms": 1000 * dt / steps}
        metrics = {"perf/tokens_per_s": rec["tokens_per_s"], "perf/step_time_ms": rec["step_time_ms"]}
        flops = model_flops(pl_module.model, tokens, sum_sq)
        if flops is not None:
            rec["flops"] = flops
            if self.peak_flops:
                rec["mfu"] = flops / dt / self._world_size / self.peak_flops
                metrics["perf/mfu"] = rec["mfu"]
        if pl_module.device.type == "cuda":
            rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
            metrics["perf/peak_mem_gib"] = rec["peak_mem_gib"]
        self.history.append(rec)
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        pl_module.log("tok/s", rec["tokens_per_s"], prog_bar=True, logger=False, on_step=True, on_epoch=False)
        self._tokens = self._sum_sq = 0
        self._last_step = step
        self._t0 = time.perf_counter()

    def steady_state(self) -> dict:
        """Token-weighted mean over every window but the first."""
        rows = self.history[1:] or self.history
        if not rows:
            return {}
        tok, sec, steps = (sum(r[k] for r in rows) for k in ("tokens", "seconds", "steps"))
        out = {"tokens_per_s": tok / sec, "step_time_ms": 1000 * sec / steps}
        if self.peak_flops and all("flops" in r for r in rows):
            # FLOPs count every rank; MFU is per GPU, as in the per-window records.
            out["mfu"] = sum(r["flops"] for r in rows) / sec / self._world_size / self.peak_flops
        if "peak_mem_gib" in rows[-1]:
            out["peak_mem_gib"] = max(r["peak_mem_gib"] for r in rows)
        return out
