"""Train any model family with the attention implementation chosen on the command line.

    python train/run.py model=gpt2 attn=flash                          # GPT-2 small, embedded corpus
    python train/run.py model=gpt2 attn=sdpa data=corpus compile=true  # after scripts/prepare_corpus.py
    python train/run.py experiment=gpt2/small-corpus attn=flash        # the paper-style GPT-2 small run
    python train/run.py experiment=synthetic/mlm attn=flash            # masked LM on synthetic padded batches
    python train/run.py debug=smoke hydra.run.dir=outputs/smoke          # 20 tiny steps on a CPU (any experiment)
    python train/run.py ... ckpt_path=outputs/<run>/checkpoints/last.ckpt   # resume the same curve
    python train/run.py trainer=ddp trainer.devices=2 ...              # data-parallel on 2 GPUs

Config groups (configs/): task, model, attn, data, trainer, optimizer, scheduler, logger, callbacks,
experiment, debug. Everything a run writes (metrics.csv, checkpoints, wandb, .hydra) lands under
hydra.run.dir.
"""
from __future__ import annotations

import os
import sys
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
    task = instantiate(cfg.task, model=model, optimizer=instantiate(cfg.optimizer),
                       scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
                       compile=cfg.compile, seed=cfg.seed)
    datamodule = instantiate(cfg.data, num_samples=cfg.trainer.max_steps * accum * micro * world)

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    if trainer_cfg.get("precision") == "auto":  # bf16-mixed on a GPU, float32 on a CPU
        trainer_cfg["precision"] = "bf16-mixed" if on_gpu else "32-true"
    trainer_cfg["accumulate_grad_batches"] = accum
    # Lightning counts val_check_interval in micro-batches; the config counts optimizer steps.
    trainer_cfg["val_check_interval"] = min(cfg.eval_every_steps, cfg.trainer.max_steps) * accum
    trainer_cfg["check_val_every_n_epoch"] = None
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False,
                          default_root_dir=cfg.output_dir)
    return datamodule, task, trainer


def has_test_split(datamodule, task) -> bool:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden("test_dataloader", datamodule) and is_overridden("test_step", task)


def train(cfg: DictConfig):
    datamodule, task, trainer = build(cfg)
    trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    if cfg.get("test_after_fit") and has_test_split(datamodule, task):
        trainer.test(task, datamodule=datamodule)  # the weights training ended with
    return trainer, task


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig):
    if cfg.get("print_config"):
        print(OmegaConf.to_yaml(cfg, resolve=True))
    os.makedirs(cfg.output_dir, exist_ok=True)
    trainer, _ = train(cfg)
    final = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val/", "train/", "test/"))}
    from train.callbacks import SpeedMonitor

    speed = next((c.steady_state() for c in trainer.callbacks if isinstance(c, SpeedMonitor)), {})
    print(f"done: {trainer.global_step} steps, {final}, steady-state speed {speed}, outputs in {cfg.output_dir}")


if __name__ == "__main__":
    main()
