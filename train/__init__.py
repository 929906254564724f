"""Training: Hydra entry point (run.py), LightningModule (task.py), LightningDataModule (data.py),
speed/MFU/memory callbacks (callbacks.py), perplexity metric (metrics.py)."""
