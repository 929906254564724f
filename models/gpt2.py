"""GPT-2 (Radford et al., 2019) on the shared blocks of models/layers.py, HuggingFace-compatible.

Pre-LayerNorm blocks, GELU (tanh), learned positions, tied input/output embeddings, residual
projections initialised with std 0.02 / sqrt(2 * n_layer). `GPT2.from_pretrained(folder)` reads a
`transformers.GPT2LMHeadModel` checkpoint and `save_pretrained(folder)` writes one HF reads back: the
HF names (transformer.h.{i}.attn.c_attn, ...) and HF's (in, out) Conv1D weights are mapped to the
shared blocks' names and nn.Linear layout by `hf_state_dict` / `_from_hf_state_dict`. The embedding
table has padding rows up to a multiple of 128 (`pad_vocab_multiple`, for the LM head's matmul);
checkpoints in and out hold the real vocabulary only.

Attention is injected: `attention_factory(dropout=p)` builds one core per layer (a
`kernels.attention` class, chosen by `configs/attn/*.yaml`); every layer calls it with causal=True.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch
from torch import nn

from kernels.cross_entropy import linear_cross_entropy
from models.layers import (Embeddings, Transformer, attention_score_fraction, read_hf_config, read_hf_weights,
                           rename_state_dict, transformer_flops, write_hf_folder)


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
    # Not HF's: the embedding table gets rows up to a multiple of this, so that the LM head's matmul has aligned
    # shapes. 50,257 columns send cuBLAS to an unaligned kernel that took ~30 of a 77 ms training step (H200
    # profile, results/training/profile_flash_vs_sdpa/); the extra logits are sliced off before anyone sees them.
    pad_vocab_multiple: int = 128

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        m = max(1, self.pad_vocab_multiple)
        return -(-self.vocab_size // m) * m

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d.pop("pad_vocab_multiple")
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


# ours -> HF names; the Conv1D weights among them are stored transposed by HF.
_HF_NAMES = [
    (r"embed\.word\.weight", r"transformer.wte.weight"),
    (r"embed\.position\.weight", r"transformer.wpe.weight"),
    (r"transformer\.blocks\.(\d+)\.norm1\.(\w+)", r"transformer.h.\1.ln_1.\2"),
    (r"transformer\.blocks\.(\d+)\.attn\.qkv\.(\w+)", r"transformer.h.\1.attn.c_attn.\2"),
    (r"transformer\.blocks\.(\d+)\.attn\.out\.(\w+)", r"transformer.h.\1.attn.c_proj.\2"),
    (r"transformer\.blocks\.(\d+)\.norm2\.(\w+)", r"transformer.h.\1.ln_2.\2"),
    (r"transformer\.blocks\.(\d+)\.mlp\.fc1\.(\w+)", r"transformer.h.\1.mlp.c_fc.\2"),
    (r"transformer\.blocks\.(\d+)\.mlp\.fc2\.(\w+)", r"transformer.h.\1.mlp.c_proj.\2"),
    (r"transformer\.final_norm\.(\w+)", r"transformer.ln_f.\1"),
]
_HF_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


class GPT2(nn.Module):
    """GPT-2 language model: input_ids (batch, seqlen) -> logits (batch, seqlen, vocab)."""

    causal = True
    fuses_loss = True  # forward(input_ids, targets) returns the loss (LMTask uses it)

    def __init__(self, config: GPT2Config | None = None, attention_factory: Callable | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = GPT2Config(**kwargs)
        elif kwargs:
            raise TypeError("pass either a GPT2Config or keyword arguments, not both")
        if attention_factory is None:
            from kernels.attention import StandardAttention

            attention_factory = StandardAttention
        c = self.config = config
        self.embed = Embeddings(c.padded_vocab_size, c.n_embd, c.n_positions, dropout=c.embd_pdrop)
        self.transformer = Transformer(c.n_layer, c.n_embd, c.n_head, attention_factory, final_norm=True,
                                       layer_norm_eps=c.layer_norm_epsilon, prenorm=True, activation="gelu_tanh",
                                       attn_dropout=c.attn_pdrop, resid_dropout=c.resid_pdrop)
        self.lm_head = nn.Linear(c.n_embd, c.padded_vocab_size, bias=False)
        self.lm_head.weight = self.embed.word.weight  # tied
        self.apply(self._init_weights)
        # Two residual branches per block add up, so their output projections start smaller (GPT-2 paper).
        for block in self.transformer.blocks:
            for proj in (block.attn.out, block.mlp.fc2):
                nn.init.normal_(proj.weight, mean=0.0, std=c.initializer_range / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, seqlen, vocab); with targets (batch, seqlen), the mean cross-entropy instead, through the
        fused LM-head loss (kernels/cross_entropy.py), which never makes float32 logits."""
        x, _ = self.transformer(self.embed(input_ids), causal=True)
        if targets is not None:
            return linear_cross_entropy(x, self.lm_head.weight, targets, vocab_size=self.config.vocab_size)
        # The padding rows' logits are dropped here: they never reach a loss, so their rows get no gradient.
        return self.lm_head(x)[..., : self.config.vocab_size]

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Parameter count (tied embeddings counted once); the 6N of the FLOP estimate excludes wpe."""
        c = self.config
        n = sum(p.numel() for p in self.parameters()) - (c.padded_vocab_size - c.vocab_size) * c.n_embd
        return n - self.embed.position.weight.numel() if exclude_position_embeddings else n

    def flops(self, tokens, sum_sq_len) -> float:
        """Training FLOPs of a batch of `tokens` tokens whose sequence lengths squared sum to sum_sq_len."""
        c = self.config
        return transformer_flops(self.num_params(), c.n_layer, c.n_head, c.head_dim, tokens, sum_sq_len, causal=True,
                                 score_fraction=attention_score_fraction(self, tokens, sum_sq_len))

    # ---- HuggingFace checkpoint interchange -------------------------------------------------------
    def hf_state_dict(self) -> dict:
        """The state dict under GPT2LMHeadModel's names and layouts (lm_head.weight included, tied)."""
        state = rename_state_dict(self.state_dict(), _HF_NAMES)
        for k in ("transformer.wte.weight", "lm_head.weight"):  # without the padding rows
            state[k] = state[k][: self.config.vocab_size]
        return {k: (v.t() if k.endswith(_HF_CONV1D) else v) for k, v in state.items()}

    def _from_hf_state_dict(self, state: dict) -> dict:
        """HF names and layouts -> ours; raises naming what is missing or unexpected."""
        state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
        state.setdefault("lm_head.weight", state.get("transformer.wte.weight"))
        ours_of = {hf: ours for ours, hf in zip(self.state_dict(), self.hf_state_dict())}
        out, unexpected = {}, []
        for k, v in state.items():
            if k not in ours_of:
                unexpected.append(k)
                continue
            out[ours_of[k]] = v.t() if k.endswith(_HF_CONV1D) else v
        missing = sorted(set(ours_of.values()) - set(out))
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match GPT-2: missing {missing}, unexpected {unexpected}")
        w = out["embed.word.weight"]  # zero padding rows, as many as this model has; lm_head.weight is tied to it
        out["embed.word.weight"] = out["lm_head.weight"] = torch.cat(
            [w, w.new_zeros(self.config.padded_vocab_size - w.shape[0], w.shape[1])])
        return out

    @classmethod
    def from_pretrained(cls, folder: str, attention_factory: Callable | None = None, **overrides) -> "GPT2":
        """Load a GPT2LMHeadModel checkpoint saved with `save_pretrained` (config.json + weights)."""
        hf = {**read_hf_config(folder), **overrides}
        model = cls(GPT2Config.from_hf_dict(hf), attention_factory)
        model.load_state_dict(model._from_hf_state_dict(read_hf_weights(folder)))
        return model

    def save_pretrained(self, folder: str) -> None:
        """Write config.json + model.safetensors that `GPT2LMHeadModel.from_pretrained` reads."""
        write_hf_folder(folder, self.config.to_hf_dict(), self.hf_state_dict(), tied="lm_head.weight")
