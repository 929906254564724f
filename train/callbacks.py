"""Speed, model-FLOPs utilisation and memory logging, the same way for every attention kind.

FLOPs per trained token = 6 N + 12 L H Q T (Kaplan et al., 2020; PaLM appendix B): N parameters
without the position embeddings, L layers, H heads, Q head dim, T sequence length; the attention
term is halved when causal, since half the score matrix is masked out and a kernel may skip it.
MFU divides achieved FLOP/s by the GPU's dense bf16 peak (`peak_flops`, or detected from the name).
"""
from __future__ import annotations

import time

import lightning as L
import torch

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
    attn = 12 * n_layer * n_head * head_dim * seq_len
    return 6 * n_params + (attn / 2 if causal else attn)


class SpeedMonitor(L.Callback):
    """Logs perf/tokens_per_s, perf/step_time_ms, perf/mfu and perf/peak_mem_gib every `every` steps.

    Time is measured over whole windows of optimizer steps with one device sync at each window edge,
    so logging costs one sync per window, not per step. The first window (compilation, cudnn autotune,
    allocator growth) is logged but kept out of `history`'s steady-state mean.
    """

    def __init__(self, every: int = 10, peak_flops: float | None = None, causal: bool = True):
        self.every, self.peak_flops, self.causal = every, peak_flops, causal
        self.history: list[dict] = []

    def _sync(self, pl_module):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer, pl_module):
        if self.peak_flops is None and pl_module.device.type == "cuda":
            self.peak_flops = detect_peak_flops(torch.cuda.get_device_name(pl_module.device))
        m = pl_module.model
        c = m.config
        self.flops_per_token = flops_per_token(m.num_params(), c.n_layer, c.n_head, c.head_dim,
                                               trainer.datamodule.seq_len, self.causal)
        self._tokens = 0
        self._world_size = trainer.world_size
        self._last_step = trainer.global_step
        self._sync(pl_module)
        self._t0 = time.perf_counter()
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._tokens += (batch.shape[1] - 1) * batch.shape[0] * trainer.world_size
        step = trainer.global_step
        if step == self._last_step or step % self.every != 0:
            return
        self._sync(pl_module)
        now = time.perf_counter()
        dt = now - self._t0
        steps = step - self._last_step
        rec = {"step": step, "steps": steps, "seconds": dt, "tokens": self._tokens,
               "tokens_per_s": self._tokens / dt, "step_time_ms": 1000 * dt / steps}
        metrics = {"perf/tokens_per_s": rec["tokens_per_s"], "perf/step_time_ms": rec["step_time_ms"]}
        if self.peak_flops:
            rec["mfu"] = self.flops_per_token * rec["tokens_per_s"] / trainer.world_size / self.peak_flops
            metrics["perf/mfu"] = rec["mfu"]
        if pl_module.device.type == "cuda":
            rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
            metrics["perf/peak_mem_gib"] = rec["peak_mem_gib"]
        self.history.append(rec)
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        pl_module.log("tok/s", rec["tokens_per_s"], prog_bar=True, logger=False, on_step=True, on_epoch=False)
        self._tokens, self._last_step = 0, step
        self._t0 = time.perf_counter()

    def steady_state(self) -> dict:
        """Token-weighted mean over every window but the first."""
        rows = self.history[1:] or self.history
        if not rows:
            return {}
        tok, sec, steps = (sum(r[k] for r in rows) for k in ("tokens", "seconds", "steps"))
        out = {"tokens_per_s": tok / sec, "step_time_ms": 1000 * sec / steps}
        if self.peak_flops:
            # tokens_per_s counts every rank; MFU is per GPU, as in the per-window records.
            out["mfu"] = self.flops_per_token * out["tokens_per_s"] / self._world_size / self.peak_flops
        if "peak_mem_gib" in rows[-1]:
            out["peak_mem_gib"] = max(r["peak_mem_gib"] for r in rows)
        return out
