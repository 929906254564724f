"""Train any model family with the attention implementation chosen on the command line.

    python train/run.py model=gpt2 attn=flash                          # GPT-2 small, embedded corpus
    python train/run.py model=gpt2 attn=sdpa data=corpus compile=true  # after scripts/prepare_corpus.py
    python train/run.py experiment=gpt2/small-corpus attn=flash        # the paper-style GPT-2 small run
    python train/run.py experiment=synthetic/mlm attn=flash            # masked LM on synthetic padded batches
    python train/run.py debug=smoke hydra.run.dir=outputs/smoke          # 20 tiny steps on a CPU (any experiment)
    python train/run.py ... ckpt_path=outputs/<run>/checkpoints/last.ckpt   # resume the same curve
    python train/run.py ... hydra.run.dir=runs/a ckpt_path=last callbacks.calls.budget_s=500   # one call of a chain
    python train/run.py experiment=lra/pathx init_from=runs/path64/checkpoints/last.ckpt   # curriculum
    python train/run.py trainer=ddp trainer.devices=2 ...              # data-parallel on 2 GPUs

Config groups (configs/): task, model, attn, data, trainer, optimizer, scheduler, logger, callbacks,
experiment, debug. Everything a run writes (metrics.csv, checkpoints, calls.csv, wandb, .hydra) lands
under hydra.run.dir.

Chained runs: `ckpt_path=last` resumes from <run dir>/checkpoints/last.ckpt when there is one and starts
fresh when not, so every call of a run split over several invocations is the same command; the
callbacks.calls limits (budget_s, max_steps) end a call with a checkpoint, and calls.csv records which
steps each call covered. A resumed run keeps the earlier metrics.csv as metrics.partK.csv (Lightning's
CSV logger would delete it). A fresh run (no ckpt_path) in a folder that already holds a run moves that run's
files to <run dir>/previous-K/ first, so running a command twice never loses the first run.

Curriculum: `init_from=PATH` starts from the weights of a checkpoint trained on smaller images, its
learned position table interpolated on the 2D pixel grid (models.layers.load_resizing_positions);
optimizer, schedule and step start fresh. Ignored when resuming (the checkpoint has the weights).
"""
from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python train/run.py` puts train/ first on sys.path, not the repo
    sys.path.insert(0, str(REPO))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from train.config import register_resolvers  # noqa: E402

register_resolvers()


def world_size(trainer_cfg) -> int:
    """Processes the Trainer will start: devices (an int, a list, or -1/"auto" on GPUs) x num_nodes."""
    import torch

    devices = trainer_cfg.get("devices", 1)
    if devices in (-1, "-1", "auto"):
        on_gpu = torch.cuda.is_available() and trainer_cfg.get("accelerator", "auto") in ("auto", "gpu", "cuda")
        devices = torch.cuda.device_count() if on_gpu else 1
    elif not isinstance(devices, int):
        devices = len(devices) if not isinstance(devices, str) else len(devices.strip(",").split(","))
    return devices * int(trainer_cfg.get("num_nodes", 1))


def build(cfg: DictConfig):
    """Instantiate (datamodule, task, trainer) from a composed config; no side effects beyond that."""
    import torch

    on_gpu = torch.cuda.is_available() and cfg.trainer.get("accelerator", "auto") in ("auto", "gpu", "cuda")
    world = world_size(cfg.trainer)

    micro = cfg.data.batch_size
    accum = 1
    if cfg.get("global_batch_size"):
        if cfg.global_batch_size % (micro * world):
            raise ValueError(f"global_batch_size {cfg.global_batch_size} is not a multiple of "
                             f"batch_size {micro} x {world} devices")
        accum = cfg.global_batch_size // (micro * world)

    import lightning as L
    from hydra.utils import instantiate

    L.seed_everything(cfg.seed, workers=True)
    if cfg.get("matmul_precision"):
        torch.set_float32_matmul_precision(cfg.matmul_precision)

    attention_factory = instantiate(cfg.attn)
    model = instantiate(cfg.model, attention_factory=attention_factory)
    resume = resume_path(cfg)
    if cfg.get("init_from") and resume is None:
        init_from_checkpoint(model, cfg.init_from)
    task = instantiate(cfg.task, model=model, optimizer=instantiate(cfg.optimizer),
                       scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
                       compile=cfg.compile, seed=cfg.seed if cfg.get("dropout_seed") is None else cfg.dropout_seed,
                       cuda_graph=cfg.get("cuda_graph", False), compile_mode=cfg.get("compile_mode", "default"))
    datamodule = instantiate(cfg.data, num_samples=cfg.trainer.max_steps * accum * micro * world)

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    from lightning.pytorch.callbacks import ProgressBar

    from train.callbacks import CallLog, progress_bar

    if cfg.trainer.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in callbacks):
        bar = progress_bar()
        if bar is not None:
            callbacks.append(bar)

    for c in callbacks:
        if isinstance(c, CallLog):
            c.resumed_from = resume
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    if trainer_cfg.get("precision") == "auto":  # bf16-mixed on a GPU, float32 on a CPU
        trainer_cfg["precision"] = "bf16-mixed" if on_gpu else "32-true"
    trainer_cfg["accumulate_grad_batches"] = accum
    if task.step_graph is not None:
        # cuda_graph=step runs the optimizer inside its graph (Lightning's manual optimization, which refuses
        # its own clipping and accumulation): the task clips there, and one micro-batch is one step.
        if accum > 1:
            raise ValueError(f"cuda_graph=step: global_batch_size asks for {accum} micro-batches per step; a graphed "
                             "step takes one (raise data.batch_size, or cuda_graph=true graphs the model only)")
        task.gradient_clip_val = trainer_cfg.pop("gradient_clip_val", None)
    # Lightning counts val_check_interval in micro-batches; the config counts optimizer steps.
    trainer_cfg["val_check_interval"] = min(cfg.eval_every_steps, cfg.trainer.max_steps) * accum
    trainer_cfg["check_val_every_n_epoch"] = None
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False,
                          default_root_dir=cfg.output_dir)
    return datamodule, task, trainer


def resume_path(cfg: DictConfig) -> str | None:
    """The checkpoint a run resumes from: ckpt_path, where `last` means <output_dir>/checkpoints/last.ckpt
    if it exists and a fresh start if not (the first call of a chained run)."""
    path = cfg.get("ckpt_path")
    if path == "last":
        last = Path(cfg.output_dir) / "checkpoints" / "last.ckpt"
        return str(last) if last.exists() else None
    if path and not Path(path).exists():
        raise FileNotFoundError(f"ckpt_path {path} does not exist")
    return path or None


def init_from_checkpoint(model, path) -> dict:
    """Load the model weights of a train/run.py checkpoint (or a plain state dict file) into `model`,
    resizing learned position tables on the 2D pixel grid. Returns {name: (old rows, new rows)}."""
    import torch

    from models.layers import load_resizing_positions

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"init_from: no checkpoint at {path}; train the smaller resolution first "
                                "(the experiment config's header has the command)")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    state = ckpt.get("state_dict", ckpt)
    if "state_dict" in ckpt:  # a Lightning checkpoint of a Task: the model's tensors are under `model.`
        state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    try:
        resized = load_resizing_positions(model, state)
    except ValueError as e:
        raise ValueError(f"init_from {path}: {e}") from None
    sizes = ", ".join(f"{k} {a} -> {b} rows" for k, (a, b) in resized.items()) or "no position table resized"
    print(f"init_from {path}: loaded {len(state)} tensors; {sizes}", flush=True)
    return resized


def keep_earlier_metrics(run_dir) -> Path | None:
    """A resumed run writing into its earlier folder: Lightning's CSVLogger would delete the metrics.csv
    there, so keep it as metrics.partK.csv (K = 1, 2, ... in call order)."""
    m = Path(run_dir) / "metrics.csv"
    if not m.exists():
        return None
    part = first_unused(m.parent, "metrics.part{}.csv")
    os.replace(m, part)
    return part


def first_unused(folder: Path, name: str) -> Path:
    """folder / name.format(k) for the smallest k >= 1 that does not exist yet."""
    k = 1
    while (folder / name.format(k)).exists():
        k += 1
    return folder / name.format(k)


RUN_FILES = ("metrics.csv", "metrics.part*.csv", "calls.csv", "hparams.yaml", "checkpoints", "profile.md",
             "profile.json")


def set_aside_earlier_run(run_dir) -> Path | None:
    """A fresh run (no ckpt_path) in a folder that holds an earlier run: Lightning's CSV logger would delete its
    metrics and the new checkpoints would replace its own. Move what it wrote (RUN_FILES; Hydra has already
    rewritten .hydra) to <run dir>/previous-K/ and say so, so nothing is lost and the new run starts clean."""
    run_dir = Path(run_dir)
    found = [p for pattern in RUN_FILES for p in sorted(run_dir.glob(pattern))]
    if not found:
        return None
    dest = first_unused(run_dir, "previous-{}")
    dest.mkdir()
    for p in found:
        os.replace(p, dest / p.name)
    hint = " (to continue that run instead: the same command with ckpt_path=last)" \
        if (dest / "checkpoints" / "last.ckpt").exists() else ""
    print(f"{run_dir} held an earlier run; its files are now in {dest}{hint}", flush=True)
    return dest


def has_test_split(datamodule, task) -> bool:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden("test_dataloader", datamodule) and is_overridden("test_step", task)


# Lightning's warnings about a run folder that this module has already dealt with; each would greet every resumed or
# chained run with a false alarm.
HANDLED_WARNINGS = (
    # the sampler restarts at the checkpoint's sample (train/data.py ResumableSampler; the resume tests check that a
    # resumed curve equals the unsplit one)
    "You're resuming from a checkpoint that ended before the epoch ended",
    # keep_earlier_metrics / set_aside_earlier_run moved metrics.csv before the logger opened the folder
    "Experiment logs directory .* exists and is not empty",
    # the folder's checkpoints are this run's own (resumed), or were moved to previous-K/ (fresh)
    "Checkpoint directory .* exists and is not empty",
)


def train(cfg: DictConfig):
    for message in HANDLED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    resume = resume_path(cfg)
    if os.environ.get("LOCAL_RANK", "0") == "0":  # DDP: ranks > 0 start later
        if resume is not None:
            keep_earlier_metrics(cfg.output_dir)
        elif not cfg.get("ckpt_path"):  # ckpt_path=last without a checkpoint yet: a chained run's own first steps
            set_aside_earlier_run(cfg.output_dir)
    datamodule, task, trainer = build(cfg)
    trainer.fit(task, datamodule=datamodule, ckpt_path=resume)
    finished = trainer.global_step >= cfg.trainer.max_steps  # not a call stopped by callbacks.calls limits
    if cfg.get("test_after_fit") and finished and has_test_split(datamodule, task):
        fit_metrics = dict(trainer.callback_metrics)
        trainer.test(task, datamodule=datamodule)  # the weights training ended with
        # trainer.test starts the metrics afresh; keep training's last train/ and val/ values beside test/ for the
        # summary main() prints
        for name, value in fit_metrics.items():
            trainer.callback_metrics.setdefault(name, value)
    return trainer, task


def out_of_memory_hint(cfg: DictConfig) -> str:
    """What to change after a CUDA out-of-memory error: the same run with a smaller micro-batch and gradient
    accumulation, i.e. the same sequences per optimizer step and the same curve."""
    micro = int(cfg.data.batch_size)
    total = int(cfg.get("global_batch_size") or micro * world_size(cfg.trainer))
    smaller = next((d for d in range(micro // 2, 0, -1) if micro % d == 0), None)
    if smaller is None:
        return ("out of GPU memory at micro-batch 1: a smaller model, a shorter sequence, or "
                "model.activation_checkpointing=true where the model has it")
    return (f"out of GPU memory at micro-batch {micro}: the same run (the same {total} sequences per optimizer "
            f"step) with less memory per micro-batch: data.batch_size={smaller} global_batch_size={total}")


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig):
    if cfg.get("print_config"):
        print(OmegaConf.to_yaml(cfg, resolve=True))
    os.makedirs(cfg.output_dir, exist_ok=True)
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    import torch

    try:
        trainer, _ = train(cfg)
    except torch.OutOfMemoryError:
        print(out_of_memory_hint(cfg), file=sys.stderr, flush=True)
        raise
    except SIGTERMException:  # stopped at an optimizer step with checkpoints/last.ckpt (train.callbacks.CallLog)
        print(f"stopped by SIGTERM; the same command with ckpt_path=last resumes ({cfg.output_dir}/calls.csv)",
              flush=True)
        sys.exit(128 + signal.SIGTERM)  # a shell's code for a TERM-ended process, not success
    if not trainer.is_global_zero:  # DDP: one summary, rank 0's (other ranks' train/ values are their shard's)
        return
    final = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val/", "train/", "test/"))}
    from train.callbacks import SpeedMonitor

    speed = next((c.steady_state() for c in trainer.callbacks if isinstance(c, SpeedMonitor)), {})
    print(f"done: {trainer.global_step} steps, {final}, steady-state speed {speed}, outputs in {cfg.output_dir}")


if __name__ == "__main__":
    main()
