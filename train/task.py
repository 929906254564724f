"""The LightningModules: `Task` holds the optimisation every family shares, one subclass per objective.

    task=lm              LMTask: causal LM on (B, T + 1) token windows; train/loss, val/loss, val/ppl
    task=mlm             MLMTask: masked LM (+ optional next-sentence prediction) on padded dict batches
    task=classification  ClassificationTask: sequence classification, one input or two (retrieval)

Shared (Task): the optimizer and scheduler partials of configs/optimizer and configs/scheduler (weight
decay on matrices and embeddings only), global-norm gradient clipping that works with a fused AdamW,
per-micro-batch reseeding (a resumed run draws the dropout masks an uninterrupted one would), in-place
torch.compile, CUDA graphs (`cuda_graph`: true graphs the model's training forward and backward, step the
whole training step with the optimizer; train/cuda_graph.py), and `batch_tokens`, the real-token count the
speed/MFU callback reads.

Validation and test metrics are sums and counts over the whole split (train/metrics.py), synced over
ranks when computed; nothing is averaged over batches.
"""
from __future__ import annotations

import functools
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from train.cuda_graph import GraphedModel, GraphedStep, make_capturable
from train.metrics import Accuracy, MeanNLL, Perplexity
from train.optim import adamw, no_decay_names, param_groups

IGNORE = -100  # label of the positions a loss skips (unused MLM slots), as in torch's cross_entropy


def _describe(factory) -> dict | None:
    """A partial as plain hyperparameters ({_target_, keyword: value}) for the loggers."""
    if factory is None:
        return None
    if not isinstance(factory, functools.partial):
        return {"_target_": repr(factory)}
    f = factory.func
    kw = {k: (list(v) if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig" else v)
          for k, v in factory.keywords.items()}
    return {"_target_": f"{f.__module__}.{f.__qualname__}", **kw}


COMPILE_SCOPES = ("blocks", "model")
# torch.compile's modes (compile_mode): "reduce-overhead" replays each compiled graph as a CUDA graph (inductor's
# own, so the host's launch time drops out of the step); the default launches every kernel from the host.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# cuda_graph: false (eager), true (the model's forward and backward as graphs, GraphedModel) or "step" (the whole
# training step, optimizer included, as one graph, GraphedStep); train/cuda_graph.py says what each needs.
CUDA_GRAPH_MODES = (False, True, "step")


def compile_model(model: nn.Module, scope: str = "blocks", **compile_kwargs) -> None:
    """torch.compile in place (parameter names, and so checkpoints, stay those of the plain model).

    Models that pack their tokens (`packs_tokens`: the encoders) compile, with scope "blocks", each
    transformer Block on its own, dynamic in the token count from the first call, and run the packing,
    embeddings and heads eagerly: one dynamic Block graph serves every layer and batch. Block-wise BERT-large
    trained 1.08x faster than eager (results/bert/bench_bert.md). Whole-model compilation used to break the
    graph at the packing's host sync and recompile as lengths changed (slower than eager:
    results/archive/bert/embedded_accum1_2026-11-25/compile/). With the lengths read on the host before the
    batch moves (`seq_lengths`, Task.on_before_batch_transfer) packing has no sync, and scope "model" compiles
    the whole model as one dynamic graph per batch size (fewer graph calls a step, fusion across blocks); at
    BERT-large it did not finish compiling within 150 s (results/bert/atomic_compile/), so "blocks" stays the
    default. Other models always compile whole.
    """
    from models.layers import Block

    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile scope {scope!r}: choose one of {COMPILE_SCOPES}")
    if not getattr(model, "packs_tokens", False):
        model.compile(**compile_kwargs)
    elif scope == "model":
        model.compile(dynamic=True, **compile_kwargs)
    else:
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        if not blocks:
            raise ValueError(f"{type(model).__name__} packs tokens but has no transformer Block to compile")
        for block in blocks:
            block.compile(dynamic=True, **compile_kwargs)


# Task.on_before_batch_transfer is meant to run; the datamodules define no such hook of their own.
warnings.filterwarnings("ignore", message="You have overridden `on_before_batch_transfer` in `LightningModule`")


class Task(L.LightningModule):
    """Shared optimisation; subclasses define the steps, the metrics and, if not padded dicts, batch_tokens.

    optimizer: called as optimizer(param_groups) (default: train.optim.adamw's defaults);
    scheduler: called as scheduler(optimizer), stepped every optimizer step (default: none).
    """

    def __init__(self, model: nn.Module, optimizer=None, scheduler=None, compile: bool | str = False,
                 seed: int = 1234, reseed_each_step: bool = True, cuda_graph: bool | str = False,
                 compile_mode: str = "default"):
        super().__init__()
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode={compile_mode!r}: choose one of {COMPILE_MODES}")
        if compile_mode != "default" and not compile:
            raise ValueError(f"compile_mode={compile_mode} is torch.compile's mode: set compile=true too")
        if cuda_graph not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph={cuda_graph!r}: choose false, true (the model's forward and backward) "
                             "or step (the whole training step)")
        if cuda_graph and compile:
            raise ValueError(f"cuda_graph={str(cuda_graph).lower()} and compile: choose one (torch.compile has its "
                             "own CUDA graphs: compile_mode=reduce-overhead)")
        self.save_hyperparameters(ignore=["model", "optimizer", "scheduler"])
        self.hparams.update(optimizer=_describe(optimizer), scheduler=_describe(scheduler))
        self.model = model
        self.optimizer_factory = optimizer or functools.partial(adamw)
        self.scheduler_factory = scheduler
        self.no_decay = no_decay_names(model)  # decided on the plain model, before any wrapping
        if compile:  # True, or the scope for token-packing encoders: "blocks" (= True) or "model"
            compile_model(model, scope="blocks" if compile is True else compile,
                          **({} if compile_mode == "default" else {"mode": compile_mode}))
        self.graphed = GraphedModel(model) if cuda_graph is True else None
        self.step_graph = GraphedStep() if cuda_graph == "step" else None
        self.gradient_clip_val = None  # cuda_graph=step: clipped inside the graph (train/run.py moves it here)
        if self.step_graph is not None:  # the graph runs backward and the optimizer itself
            self.automatic_optimization = False
            # Lightning warns that a manual-optimization checkpoint holds the weights after the step's update:
            # so does an automatic one, and a resumed run continues from there either way.
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")

    def run_model(self, *args, **kwargs):
        """self.model(...), through CUDA graphs in training when cuda_graph is set."""
        return (self.graphed or self.model)(*args, **kwargs)

    def cuda_graph_problems(self) -> list[str]:
        t = self.trainer
        return [why for bad, why in [
            (self.device.type != "cuda", f"it needs a CUDA device (the model is on {self.device})"),
            (t.world_size > 1, f"it runs in one process ({t.world_size} here)"),
            (str(t.precision).startswith("16"), "fp16 with a loss scaler is not supported; use bf16-mixed"),
        ] if bad]

    def on_fit_start(self):
        if self.graphed is None and self.step_graph is None:
            return
        problems = self.cuda_graph_problems()
        if problems:
            mode = "true" if self.step_graph is None else "step"
            raise ValueError(f"cuda_graph={mode}: " + "; ".join(problems) + " (cuda_graph=false runs eagerly)")

    def training_loss(self, batch, with_logs: bool) -> tuple[torch.Tensor, dict]:
        """(loss, {name: tensor} to log as training metrics; filled only when with_logs) of one batch."""
        raise NotImplementedError

    def training_step(self, batch, batch_idx):
        logging = self.logs_this_step()
        if self.step_graph is None:
            loss, logs = self.training_loss(batch, logging)
        else:
            loss, logs = self._graphed_training_step(batch, logging)
        if logging:
            for name, value in logs.items():
                self.log(name, value, prog_bar=name == "train/loss")
        return loss

    def _graphed_training_step(self, batch, logging: bool):
        """cuda_graph=step: zero_grad, forward, loss, backward and the optimizer step in one replay; then the
        scheduler and Lightning's step count, which live on the host. The graph's outputs are overwritten by the
        next replay: what leaves this step is a copy."""
        lightning_opt = self.optimizers()
        opt = lightning_opt.optimizer
        if self.step_graph.steps == 0:
            make_capturable(opt, self.device)

        def body(b):
            opt.zero_grad(set_to_none=False)
            loss, logs = self.training_loss(b, with_logs=True)
            loss.backward()
            if self.gradient_clip_val:  # as configure_gradient_clipping: global norm, no host sync
                torch.nn.utils.clip_grad_norm_(self.parameters(), self.gradient_clip_val, foreach=True)
            opt.step()
            return loss.detach(), {k: v.detach() for k, v in logs.items()}

        lightning_opt._on_before_step()  # Lightning's manual-optimization step count (trainer.global_step)
        loss, logs = self.step_graph(body, batch)
        lightning_opt._on_after_step()
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        logs = {k: v.clone() for k, v in logs.items()} if logging else {}
        return loss.clone(), logs

    def on_before_batch_transfer(self, batch, dataloader_idx):
        """For models that pack their tokens: each attention mask's per-row counts as host ints, read here
        while the batch is still on the host, so that packing needs no device-to-host copy. That copy made
        the host wait for the device at every forward, so the host could never queue work ahead of it."""
        if getattr(self.model, "packs_tokens", False) and isinstance(batch, dict):
            for key in [k for k in batch if k.startswith("attention_mask")]:
                mask = batch[key]
                if torch.is_tensor(mask) and mask.device.type == "cpu" and mask.dim() == 2:
                    batch["seq_lengths" + key[len("attention_mask"):]] = (mask != 0).sum(1).tolist()
        return batch

    # ---- what the speed/MFU callback reads ------------------------------------------------------
    def batch_tokens(self, batch) -> tuple:
        """(real tokens, sum of squared sequence lengths) of a training batch, device tensors (no sync).

        For every input_ids* key: lengths from the matching attention_mask* key (1 = real token), or
        the full width when there is none. The model's flops(tokens, sum_sq_len) turns them into FLOPs.
        """
        tokens = sum_sq = 0
        for key, ids in batch.items():
            if not key.startswith("input_ids"):
                continue
            mask = batch.get("attention_mask" + key[len("input_ids"):])
            if mask is None:
                b, n = ids.shape
                tokens, sum_sq = tokens + b * n, sum_sq + b * n * n
            else:
                lens = mask.sum(1, dtype=torch.int64)
                tokens, sum_sq = tokens + lens.sum(), sum_sq + (lens * lens).sum()
        return tokens, sum_sq

    # ---- shared optimisation --------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx):
        # Dropout masks as a function of (seed, micro-batch, rank): a resumed run draws the same ones.
        if self.hparams.reseed_each_step:
            accum = self.trainer.accumulate_grad_batches
            micro = self.trainer.global_step * accum + batch_idx % accum
            torch.manual_seed(self.hparams.seed * 1_000_003 + micro + 1_000_000_007 * self.global_rank)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # Lightning's mixed-precision plugin refuses to clip for a fused AdamW (fused unscaling is an
        # fp16 loss-scaler concern). bf16 and float32 have no scaler, so clip the global norm here.
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None or gradient_clip_algorithm == "value":
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val, foreach=True)

    def configure_optimizers(self):
        opt = self.optimizer_factory(param_groups(self.model, self.no_decay))
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}

    def logs_this_step(self) -> bool:
        """Whether Lightning writes training metrics at this step (every trainer.log_every_n_steps, and the
        last). Training steps call self.log only then: each call is hundreds of microseconds of Python, the largest
        host item left of a small model's step once it is graphed (results/lra/cuda_graph/)."""
        if self._trainer is None:
            return True
        return self.trainer._logger_connector.should_update_logs

    def log_split(self, values: dict, prog_bar: tuple = ()):
        # compute() already summed the metric's states over ranks, so every rank holds the same value
        # (sync_dist then averages equal numbers: it only keeps Lightning from warning).
        for name, value in values.items():
            self.log(name, value.float(), prog_bar=name in prog_bar, sync_dist=True)


class LMTask(Task):
    """Causal LM: batch (B, T + 1) token ids; inputs [:, :-1], targets [:, 1:]."""

    def __init__(self, model: nn.Module, optimizer=None, scheduler=None, **kw):
        super().__init__(model, optimizer, scheduler, **kw)
        self.val_ppl = Perplexity()

    def forward(self, input_ids):
        return self.model(input_ids)

    def batch_tokens(self, batch):
        b, t = batch.shape[0], batch.shape[1] - 1
        return b * t, b * t * t

    def training_loss(self, batch, with_logs):
        x, y = batch[:, :-1], batch[:, 1:]
        if getattr(self.model, "fuses_loss", False):  # GPT2: the loss without float32 logits
            loss = self.run_model(x, y)
        else:
            logits = self.run_model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        return loss, {"train/loss": loss} if with_logs else {}

    def validation_step(self, batch, batch_idx):
        x, y = batch[:, :-1], batch[:, 1:]
        if getattr(self.model, "fuses_loss", False):  # no float32 logits here either (GPT-2 small: ~8 GB a batch)
            self.val_ppl.update_mean(self.model(x, y), y.numel())
        else:
            self.val_ppl.update(self.model(x), y)

    def on_validation_epoch_end(self):
        nll, ppl = self.val_ppl.compute()
        self.val_ppl.reset()
        self.log_split({"val/loss": nll, "val/ppl": ppl}, prog_bar=("val/loss",))


class MLMTask(Task):
    """Masked LM (BERT): the model predicts only the mlm_positions slots; next-sentence prediction when
    the model returns NSP logits and the batch has nsp_labels.

    Batch: input_ids, attention_mask, token_type_ids (B, N); mlm_positions, mlm_labels (B, P), labels
    IGNORE at unused slots; optional nsp_labels (B,). Loss = MLM mean over predicted tokens + NSP mean.
    """

    def __init__(self, model: nn.Module, optimizer=None, scheduler=None, **kw):
        super().__init__(model, optimizer, scheduler, **kw)
        self.val_mlm_loss, self.val_mlm_acc, self.val_nsp_acc = MeanNLL(IGNORE), Accuracy(IGNORE), Accuracy(IGNORE)

    def forward(self, batch):
        return self.run_model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                              token_type_ids=batch.get("token_type_ids"), masked_positions=batch["mlm_positions"],
                              seq_lengths=batch.get("seq_lengths"))

    def training_loss(self, batch, with_logs):
        mlm_logits, nsp_logits = self(batch)
        mlm = F.cross_entropy(mlm_logits.flatten(0, 1).float(), batch["mlm_labels"].flatten(), ignore_index=IGNORE)
        loss, logged = mlm, {"train/mlm_loss": mlm}
        if nsp_logits is not None and "nsp_labels" in batch:
            nsp = F.cross_entropy(nsp_logits.float(), batch["nsp_labels"])
            loss, logged["train/nsp_loss"] = loss + nsp, nsp
        logged["train/loss"] = loss
        return loss, logged if with_logs else {}

    def validation_step(self, batch, batch_idx):
        mlm_logits, nsp_logits = self(batch)
        self.val_mlm_loss.update(mlm_logits, batch["mlm_labels"])
        self.val_mlm_acc.update(mlm_logits, batch["mlm_labels"])
        if nsp_logits is not None and "nsp_labels" in batch:
            self.val_nsp_acc.update(nsp_logits, batch["nsp_labels"])

    def on_validation_epoch_end(self):
        out = {"val/mlm_loss": self.val_mlm_loss.compute(), "val/mlm_acc": self.val_mlm_acc.compute()}
        if self.val_nsp_acc.update_called:
            out["val/nsp_acc"] = self.val_nsp_acc.compute()
        for m in (self.val_mlm_loss, self.val_mlm_acc, self.val_nsp_acc):
            m.reset()
        self.log_split(out, prog_bar=("val/mlm_loss",))


class ClassificationTask(Task):
    """Sequence classification: batch = model inputs (input_ids, attention_mask, and for the two-input
    retrieval form input_ids_2, attention_mask_2) + labels (B,); model(**inputs) -> logits (B, C)."""

    def __init__(self, model: nn.Module, optimizer=None, scheduler=None, **kw):
        super().__init__(model, optimizer, scheduler, **kw)
        self.split_metrics = nn.ModuleDict({
            split: nn.ModuleDict({"loss": MeanNLL(), "acc": Accuracy()}) for split in ("val", "test")})

    def forward(self, batch):
        return self.run_model(**{k: v for k, v in batch.items() if k != "labels"})

    def training_loss(self, batch, with_logs):
        logits = self(batch)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        if not with_logs:
            return loss, {}
        return loss, {"train/loss": loss, "train/acc": (logits.argmax(-1) == batch["labels"]).float().mean()}

    def _eval_step(self, split, batch):
        logits = self(batch)
        for m in self.split_metrics[split].values():
            m.update(logits, batch["labels"])

    def _eval_end(self, split):
        ms = self.split_metrics[split]
        out = {f"{split}/{name}": m.compute() for name, m in ms.items()}
        for m in ms.values():
            m.reset()
        self.log_split(out, prog_bar=(f"{split}/acc",))

    def validation_step(self, batch, batch_idx):
        self._eval_step("val", batch)

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step("test", batch)

    def on_test_epoch_end(self):
        self._eval_end("test")
