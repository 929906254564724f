"""Speed, model-FLOPs utilisation and memory logging, the same way for every model family.

Tokens are real tokens: the task's `batch_tokens(batch)` returns, per micro-batch, the count of
non-padding tokens and the sum of squared sequence lengths (device tensors, so no host sync per step),
and the model's `flops(tokens, sum_sq_len)` turns a window's totals into training FLOPs (forward +
backward): 6 N tokens + 12 L H Q sum_sq_len (Kaplan et al., 2020; PaLM appendix B), the attention
term halved when causal. The formula is linear in both counts, so one call per window is exact.
tokens/s sums every rank; MFU divides the achieved FLOP/s per GPU by its dense bf16 peak
(`peak_flops`, or detected from the device name).

`CallLog`: one row per invocation of a run in <run dir>/calls.csv (which steps it covered, how long,
how it ended), and the per-call limits (time, steps) that split a long run over device calls.

`StepProfiler`: torch.profiler over a window of optimizer steps (`callbacks.profile.start=N`), where a
step's time goes, in <run dir>/profile.{json,md}.

`progress_bar()`: Lightning's progress bar, described right for runs bounded by steps.
"""
from __future__ import annotations

import csv
import datetime
import importlib.util
import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar

from models.layers import transformer_flops
from train.profiling import StepProfile, profile_markdown

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

    With the progress bar off (trainer.enable_progress_bar=false: scripts, logs of detached runs) each window
    also prints one progress line on rank 0, `progress_line`, so a long run says where it is and when it will end.
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
        if trainer.progress_bar_callback is None and trainer.is_global_zero:
            loss = trainer.callback_metrics.get("train/loss")
            print(progress_line(rec, trainer.max_steps, None if loss is None else float(loss)), flush=True)
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


def progress_line(rec: dict, max_steps: int | None, loss: float | None) -> str:
    """'step 1000/12000 (8%) | loss 3.210 | 350,123 tok/s | 45.8 ms/step | MFU 28.7% | 9.4 GiB | eta 8m 24s'
    from one SpeedMonitor window record; parts it has no value for are left out."""
    step = rec["step"]
    total = max_steps if max_steps and max_steps > 0 else None
    parts = [f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"]
    if loss is not None:
        parts.append(f"loss {loss:.3f}")
    parts += [f"{rec['tokens_per_s']:,.0f} tok/s", f"{rec['step_time_ms']:.1f} ms/step"]
    if "mfu" in rec:
        parts.append(f"MFU {100 * rec['mfu']:.1f}%")
    if "peak_mem_gib" in rec:
        parts.append(f"{rec['peak_mem_gib']:.1f} GiB")
    if total and step < total:
        eta = round((total - step) * rec["step_time_ms"] / 1000)
        parts.append("eta " + (f"{eta // 3600}h {eta % 3600 // 60:02d}m" if eta >= 3600 else f"{eta // 60}m {eta % 60:02d}s"))
    return " | ".join(parts)


def _software() -> str:
    """'torch X, triton Y' (triton absent on some CPU installs)."""
    try:
        import triton

        return f"torch {torch.__version__}, triton {triton.__version__}"
    except ImportError:
        return f"torch {torch.__version__}"


class CallLog(L.Callback):
    """Which optimizer steps each invocation (call) of a run covered, and chained runs.

    One row per call in `path` (<run dir>/calls.csv): call, start_step, end_step, steps, wall_s (training
    time of the call), started_utc, ended_utc, status, resumed_from, device, software (torch and triton
    versions: a run's numbers carry what produced them; calls.csv files from before have no such column,
    and rewriting them leaves it empty for their old rows). The row is written when
    training starts, status "running" (a call killed from outside still shows where it began; the next
    call marks it "killed (no end recorded)"), and completed when training ends: "finished" (max_steps
    reached), "stopped: budget_s" / "stopped: max_steps" (this call's limits below), "stopped: SIGTERM"
    (at the next optimizer step, with a checkpoint, as for the limits), "interrupted" (SIGINT) or
    "failed: <exception>". The same line is printed.

    A long run split over device calls of limited length: `budget_s` stops this call at the first
    optimizer step after that many seconds since the run was built (data preparation and compilation
    count), `max_steps` after that many optimizer steps of this call. Where a call stops, and at the
    run's last step, the state goes to checkpoints/last.ckpt at once (a mid-epoch checkpoint, as the
    periodic ones), so the next call, the same command with ckpt_path=last, continues with the same data
    order, dropout masks, optimizer and schedule as an unsplit run.
    """

    FIELDS = ("call", "start_step", "end_step", "steps", "wall_s", "started_utc", "ended_utc", "status",
              "resumed_from", "device", "software")

    def __init__(self, path: str, budget_s: float | None = None, max_steps: int | None = None,
                 resumed_from: str | None = None):
        self.path, self.budget_s, self.max_steps = Path(path), budget_s, max_steps
        self.resumed_from = resumed_from
        self.stopped_by: str | None = None
        self._built = time.perf_counter()
        self._between_steps = False  # set at an optimizer step's end, cleared when the next batch starts

    # ---- the rows ---------------------------------------------------------------------------------
    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))

    def _write(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.FIELDS)
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, self.path)

    @staticmethod
    def _now() -> str:
        return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def _finish(self, trainer, status: str) -> None:
        if not trainer.is_global_zero or not hasattr(self, "_row") or self._row.get("ended_utc"):
            return  # a later exception (in teardown, say) does not overwrite how training ended
        row = dict(self._row, end_step=trainer.global_step, steps=trainer.global_step - self._row["start_step"],
                   wall_s=f"{time.perf_counter() - self._t0:.1f}", ended_utc=self._now(), status=status)
        rows = self.read()
        rows[-1] = self._row = row  # this call's row, written at its start
        self._write(rows)
        print(f"call {row['call']}: steps {row['start_step']} -> {row['end_step']} in {row['wall_s']} s, {status} "
              f"({self.path})", flush=True)

    # ---- hooks ------------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()
        self._start = self._last_step = trainer.global_step
        if not trainer.is_global_zero:
            return
        rows = self.read()
        for row in rows:  # an earlier call killed from outside never completed its row
            if row["status"] == "running":
                row["status"] = "killed (no end recorded)"
        device = torch.cuda.get_device_name(pl_module.device) if pl_module.device.type == "cuda" else "cpu"
        self._row = {"call": len(rows) + 1, "start_step": trainer.global_step, "end_step": "", "steps": "",
                     "wall_s": "", "started_utc": self._now(), "ended_utc": "", "status": "running",
                     "resumed_from": self.resumed_from or "", "device": f"{device} x {trainer.world_size}",
                     "software": _software()}
        self._write(rows + [self._row])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._between_steps = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step:  # inside a gradient accumulation: not a step boundary
            return
        self._last_step = step
        self._between_steps = True  # until the next batch starts: an optimizer step's consistent state
        reason = None
        if self.max_steps is not None and step - self._start >= self.max_steps:
            reason = "max_steps"
        elif self.budget_s is not None and time.perf_counter() - self._built >= self.budget_s:
            reason = "budget_s"
        elif getattr(trainer, "received_sigterm", False):
            # A scheduler preempting the job, or `kill`: stop here, at an optimizer step, with a checkpoint.
            # Lightning then raises SIGTERMException at the end of this batch (on_exception below).
            reason = "SIGTERM"
        # every rank stops at the same step (the budget is measured on each)
        stop = trainer.strategy.reduce_boolean_decision(reason is not None, all=False)
        if stop:
            trainer.should_stop = True
            self.stopped_by = reason or "budget_s"
        if stop or 0 <= trainer.max_steps <= step:
            self._save_last(trainer)

    def _save_last(self, trainer) -> None:
        from lightning.pytorch.callbacks import ModelCheckpoint

        ckpt = trainer.checkpoint_callback
        if isinstance(ckpt, ModelCheckpoint) and ckpt.dirpath and ckpt.save_last:
            trainer.save_checkpoint(os.path.join(ckpt.dirpath, ckpt.CHECKPOINT_NAME_LAST + ckpt.FILE_EXTENSION),
                                    weights_only=False)  # a resumable checkpoint: optimizer and loops too

    def on_train_end(self, trainer, pl_module):
        self._between_steps = False  # a SIGTERM in a later trainer.test is not between two training steps
        if 0 <= trainer.max_steps <= trainer.global_step:
            status = "finished"
        else:
            status = f"stopped: {self.stopped_by}" if self.stopped_by else "ended before max_steps"
        self._finish(trainer, status)

    def on_exception(self, trainer, pl_module, exception):
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(exception, SIGTERMException):
            # Stopped at an optimizer step (last.ckpt written there by on_train_batch_end), or the signal came
            # after that hook had looked but before Lightning's own check at the end of the batch (logging,
            # a scheduler step): still between two steps, so the checkpoint is written here. Inside a gradient
            # accumulation or an evaluation no consistent state exists to save: ckpt_path=last then resumes from
            # the last checkpoint written before. With several ranks a save here could wait on a rank that
            # stopped elsewhere, so only a single-rank run saves late.
            late = (self.stopped_by != "SIGTERM" and self._between_steps and trainer.training
                    and trainer.world_size == 1)
            if late:
                self._save_last(trainer)
                self.stopped_by = "SIGTERM"
            status = ("stopped: SIGTERM" if self.stopped_by == "SIGTERM"
                      else "stopped: SIGTERM (no checkpoint: inside a gradient accumulation or an evaluation)")
        else:  # SIGINT: Lightning's graceful shutdown
            status = "interrupted" if isinstance(exception, KeyboardInterrupt) else f"failed: {type(exception).__name__}"
        self._finish(trainer, status)


class StepProfiler(L.Callback):
    """torch.profiler over optimizer steps [start, start + steps) of a training run (train.profiling):
    per step wall and GPU-busy time, kernel time by category, top kernels and host ops, written to
    `path`.json and `path`.md (rank 0) and printed. start=None (the default config) leaves it off, so a
    run pays nothing; `callbacks.profile.start=50` profiles steps 50-54 of a run. A run that ends inside
    the window reports the steps it profiled. `.summary` holds the result after the window."""

    def __init__(self, path: str | None = None, start: int | None = None, steps: int = 5):
        if start is not None and (start < 0 or steps < 1):
            raise ValueError(f"profile window: need start >= 0 and steps >= 1, got start={start}, steps={steps}")
        self.path, self.start, self.steps = path, start, steps
        self.profile = StepProfile(steps)

    @property
    def summary(self) -> dict | None:
        return self.profile.summary

    def _stop(self, trainer, steps: int) -> None:
        self.profile.steps = steps
        self.profile.stop()
        if self.path is None or not trainer.is_global_zero:
            return
        first = self.start
        window = f"optimizer steps {first}-{first + steps - 1}"
        md = "\n".join(profile_markdown([{"row": "this run", "profile": self.summary}], window)[1:] + [""])
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".json").write_text(json.dumps(dict(self.summary, start=first), indent=1))
        path.with_suffix(".md").write_text(md)
        print(md, flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.start is None or self.summary is not None:
            return
        step = trainer.global_step
        if not self.profile.running and step == self.start:
            self.profile.start()
        elif self.profile.running and step == self.start + self.steps:
            self._stop(trainer, self.steps)

    def on_train_end(self, trainer, pl_module):
        self._between_steps = False  # a SIGTERM in a later trainer.test is not between two training steps
        if self.profile.running and trainer.global_step > self.start:
            self._stop(trainer, trainer.global_step - self.start)


class StepBoundedRichBar(RichProgressBar):
    """Lightning's rich bar, whose description for a run bounded by max_steps says "Epoch N": Lightning sets
    max_epochs to -1 there, and its own bar printed "Epoch 0/-2"."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"


def progress_bar() -> L.Callback | None:
    """The progress bar for train/run.py: StepBoundedRichBar, or None where rich is missing (Lightning's tqdm bar,
    its default then, prints no epoch count)."""
    return StepBoundedRichBar() if importlib.util.find_spec("rich") is not None else None
