"""Models that take their attention core from `configs/attn` (dependency injection, no branching)."""
from models.gpt2 import GPT2, GPT2Config

__all__ = ["GPT2", "GPT2Config"]
