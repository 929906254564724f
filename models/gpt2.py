"""GPT-2 (Radford et al., 2019) with HuggingFace-compatible parameter names and shapes.

The state dict is key-for-key and shape-for-shape that of `transformers.GPT2LMHeadModel` (projections
are stored (in, out) like HF's Conv1D), so `GPT2.from_pretrained(folder)` reads a checkpoint that HF
saved and `save_pretrained(folder)` writes one HF reads back. Pre-LayerNorm blocks, GELU (tanh),
tied input/output embeddings, residual projections initialised with std 0.02 / sqrt(2 * n_layer).

Attention is injected: `attention_factory(dropout=p)` builds one core per layer (a `kernels.attention`
class, chosen by `configs/attn/*.yaml`); the block calls `core(q, k, v, causal=True)` on
(batch, seqlen, heads, headdim) tensors and never asks which kind it holds.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], activation_function="gelu_new",
                 n_inner=None, tie_word_embeddings=True)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict) -> "GPT2Config":
        if d.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported activation {d['activation_function']!r}: GPT-2 uses tanh GELU")
        if d.get("n_inner") not in (None, 4 * d.get("n_embd", 768)):
            raise ValueError("only n_inner = 4 * n_embd is supported")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Conv1D(nn.Module):
    """A linear layer whose weight is stored (in, out), as in the original GPT-2 and HF checkpoints."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config, attention_factory: Callable[..., nn.Module]):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        self.core = attention_factory(dropout=cfg.attn_pdrop)
        self.resid_dropout = nn.Dropout(cfg.resid_pdrop)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.c_attn(x).view(b, n, 3, self.n_head, d // self.n_head).unbind(dim=2)
        y = self.core(q, k, v, causal=True)
        return self.resid_dropout(self.c_proj(y.reshape(b, n, d)))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config, attention_factory):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = SelfAttention(cfg, attention_factory)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: GPT2Config, attention_factory):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.drop = nn.Dropout(cfg.embd_pdrop)
        self.h = nn.ModuleList(Block(cfg, attention_factory) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)


class GPT2(nn.Module):
    """GPT-2 language model: input_ids (batch, seqlen) -> logits (batch, seqlen, vocab)."""

    def __init__(self, config: GPT2Config | None = None, attention_factory: Callable | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = GPT2Config(**kwargs)
        elif kwargs:
            raise TypeError("pass either a GPT2Config or keyword arguments, not both")
        if attention_factory is None:
            from kernels.attention import StandardAttention

            attention_factory = StandardAttention
        self.config = config
        self.transformer = Transformer(config, attention_factory)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.apply(self._init_weights)
        # Two residual branches per block add up, so their output projections start smaller (GPT-2 paper).
        std = config.initializer_range / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=std)

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (Conv1D, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, Conv1D):
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        if n > self.config.n_positions:
            raise ValueError(f"sequence length {n} exceeds the context size {self.config.n_positions}")
        t = self.transformer
        pos = torch.arange(n, device=input_ids.device)
        x = t.drop(t.wte(input_ids) + t.wpe(pos))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Parameter count (tied embeddings counted once); the 6N of the FLOP estimate excludes wpe."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if exclude_position_embeddings else n

    # ---- HuggingFace checkpoint interchange -------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder: str, attention_factory: Callable | None = None, **overrides) -> "GPT2":
        """Load a GPT2LMHeadModel checkpoint saved with `save_pretrained` (config.json + weights)."""
        with open(os.path.join(folder, "config.json")) as f:
            hf = json.load(f)
        hf.update(overrides)
        model = cls(GPT2Config.from_hf_dict(hf), attention_factory)
        state = _read_hf_weights(folder)
        state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match GPT-2: missing {missing}, unexpected {unexpected}")
        return model

    def save_pretrained(self, folder: str) -> None:
        """Write config.json + model.safetensors that `GPT2LMHeadModel.from_pretrained` reads."""
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config.to_hf_dict(), f, indent=2)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k != "lm_head.weight"}
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def _read_hf_weights(folder: str) -> dict:
    st = os.path.join(folder, "model.safetensors")
    if os.path.exists(st):
        from safetensors.torch import load_file

        return load_file(st)
    binf = os.path.join(folder, "pytorch_model.bin")
    if os.path.exists(binf):
        return torch.load(binf, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder}")
