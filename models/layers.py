"""Transformer building blocks shared by every model family (GPT-2, BERT, the LRA classifiers).

- `Embeddings`: token + learned or sinusoidal position (+ token type) embeddings, optional LayerNorm, dropout.
- `MultiHeadAttention`: fused QKV projection -> the injected attention core -> output projection.
- `MLP`: two linear layers around GELU (exact erf, as BERT, or tanh, as GPT-2).
- `Block`: attention and MLP sublayers with residuals, pre-LayerNorm (GPT-2) or post-LayerNorm (BERT).
- `Transformer`: a stack of blocks that removes padding once per forward; optionally recomputes each
  block's activations in the backward (`activation_checkpointing`) instead of keeping them.

Padding: `Transformer.forward(x, attention_mask)` builds one `kernels.padding.PackedBatch` from the mask,
keeps only the real tokens, and runs every block on (total_tokens, hidden): LayerNorm, MLP and
projections never touch padding, and each attention core gets the same PackedBatch (varlen kernels
for flash/block-sparse, a padded path for standard/SDPA). Without a mask, blocks run on
(batch, seqlen, hidden). Blocks work on either shape, since everything but attention is per token.

Curriculum across image sizes: `load_resizing_positions(model, state)` loads a checkpoint trained on
smaller images, its learned position table resampled on the 2D pixel grid (`resize_positions_2d`).

Parameter names here are neutral (`qkv`, `out`, `fc1`, `fc2`, `norm1`, `norm2`); each model file maps
them to and from its HuggingFace names (`rename_state_dict`) when it reads or writes HF checkpoints.
"""
from __future__ import annotations

import math
import re
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from kernels.padding import PackedBatch, unpad

ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class Embeddings(nn.Module):
    """input_ids (batch, seqlen) -> (batch, seqlen, dim): word + position (+ token type), then
    LayerNorm (BERT) if `layer_norm_eps` is set, then dropout."""

    def __init__(self, vocab_size: int, dim: int, max_positions: int, type_vocab_size: int = 0,
                 dropout: float = 0.0, layer_norm_eps: float | None = None, positions: str = "learned"):
        super().__init__()
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"unknown positions {positions!r}; choose 'learned' or 'sinusoidal'")
        self.word = nn.Embedding(vocab_size, dim)
        # sinusoidal (Vaswani et al., 2017; LRA's default): a fixed table, no parameter
        self.position = nn.Embedding(max_positions, dim) if positions == "learned" else None
        self.max_positions = max_positions
        if positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(max_positions, dim), persistent=False)
        self.token_type = nn.Embedding(type_vocab_size, dim) if type_vocab_size else None
        self.norm = nn.LayerNorm(dim, eps=layer_norm_eps) if layer_norm_eps else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        n = input_ids.shape[1]
        if n > self.max_positions:
            raise ValueError(f"sequence length {n} exceeds the {self.max_positions} positions "
                             "the model was built with")
        pos = self.sinusoid[:n] if self.position is None else self.position(torch.arange(n, device=input_ids.device))
        x = self.word(input_ids) + pos
        if self.token_type is not None:
            x = x + (self.token_type(token_type_ids) if token_type_ids is not None else self.token_type.weight[0])
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


def sinusoidal_table(n: int, dim: int) -> torch.Tensor:
    """(n, dim): sin in the first half of the features, cos in the second (timescales 1 .. 10^4),
    the layout of LRA's AddPositionEmbs."""
    half = dim // 2
    inv = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float64) / max(1, half - 1))
    angle = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    table = torch.zeros(n, dim, dtype=torch.float64)
    table[:, :half], table[:, half:2 * half] = torch.sin(angle), torch.cos(angle)
    return table.float()


class MultiHeadAttention(nn.Module):
    """x (..., dim) -> (..., dim); the core (a kernels.attention class) sees (..., heads, head_dim).
    attn_dim: the width of q, k and v (LRA's qkv_dim), dim unless set; head_dim = attn_dim / n_head."""

    def __init__(self, dim: int, n_head: int, attention_factory: Callable[..., nn.Module], attn_dropout: float = 0.0,
                 attn_dim: int | None = None):
        super().__init__()
        self.attn_dim = attn_dim or dim
        if self.attn_dim % n_head:
            raise ValueError(f"attention width {self.attn_dim} is not a multiple of the {n_head} heads")
        self.n_head = n_head
        self.qkv = nn.Linear(dim, 3 * self.attn_dim)
        self.out = nn.Linear(self.attn_dim, dim)
        self.core = attention_factory(dropout=attn_dropout)

    def forward(self, x: torch.Tensor, causal: bool = False, packed: PackedBatch | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        qkv = self.qkv(x).view(*lead, 3, self.n_head, self.attn_dim // self.n_head)
        return self.out(self.core.forward_qkv(qkv, causal=causal, packed=packed).reshape(*lead, self.attn_dim))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.activation = activation
        self._act = ACTIVATIONS[activation]

    def forward(self, x):
        return self.fc2(self._act(self.fc1(x)))


class Block(nn.Module):
    """One transformer layer. prenorm (GPT-2): x + f(LN(x)); postnorm (BERT): LN(x + f(x)).
    Dropout (resid_dropout) on each sublayer's output before the residual add."""

    def __init__(self, dim: int, n_head: int, attention_factory, hidden: int | None = None, prenorm: bool = True,
                 activation: str = "gelu", attn_dropout: float = 0.0, resid_dropout: float = 0.0,
                 layer_norm_eps: float = 1e-5, attn_dim: int | None = None):
        super().__init__()
        self.prenorm = prenorm
        self.norm1 = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.attn = MultiHeadAttention(dim, n_head, attention_factory, attn_dropout, attn_dim)
        self.norm2 = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.mlp = MLP(dim, hidden or 4 * dim, activation)
        self.dropout1 = nn.Dropout(resid_dropout)
        self.dropout2 = nn.Dropout(resid_dropout)

    def forward(self, x, causal: bool = False, packed: PackedBatch | None = None):
        if self.prenorm:
            x = x + self.dropout1(self.attn(self.norm1(x), causal, packed))
            return x + self.dropout2(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.dropout1(self.attn(x, causal, packed)))
        return self.norm2(x + self.dropout2(self.mlp(x)))


class Transformer(nn.Module):
    """n_layer Blocks (+ a final LayerNorm for pre-norm stacks), padding removed once per forward.

    activation_checkpointing: keep only each block's input in training and recompute the block in the
    backward (torch.utils.checkpoint, non-reentrant). The RNG state is restored for the recompute, so
    dropout masks (torch's and the Triton kernels', drawn from torch's generator) are the same and the
    gradients equal those without it. Costs one more forward per block; saves what standard attention
    keeps per layer (the seqlen^2 probabilities), the only way it trains long sequences at all.
    """

    def __init__(self, n_layer: int, dim: int, n_head: int, attention_factory, final_norm: bool = False,
                 layer_norm_eps: float = 1e-5, activation_checkpointing: bool = False, **block_kwargs):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, n_head, attention_factory, layer_norm_eps=layer_norm_eps,
                                          **block_kwargs) for _ in range(n_layer))
        self.final_norm = nn.LayerNorm(dim, eps=layer_norm_eps) if final_norm else None
        self.activation_checkpointing = activation_checkpointing

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, causal: bool = False,
                lengths=None):
        """x (batch, seqlen, dim) -> (hidden, packed). With a mask: hidden (total_tokens, dim) and the
        PackedBatch that locates them; without: hidden (batch, seqlen, dim) and None. lengths: the mask's
        per-row counts from the host, which spares packing its host sync (PackedBatch.from_mask)."""
        packed = None
        if attention_mask is not None:
            packed = PackedBatch.from_mask(attention_mask, lengths)
            x = unpad(x, packed)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                x = checkpoint(block, x, causal, packed, use_reentrant=False)
            else:
                x = block(x, causal, packed)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, packed


# ---- heads' helpers on packed tokens -------------------------------------------------------------
def pool(hidden: torch.Tensor, packed: PackedBatch | None, how: str) -> torch.Tensor:
    """One vector per sequence: "cls" (its first token) or "mean" (over its real tokens)."""
    if how not in ("cls", "mean"):
        raise ValueError(f"unknown pooling {how!r}; choose 'cls' or 'mean'")
    if packed is None:
        return hidden[:, 0] if how == "cls" else hidden.mean(dim=1)
    if how == "cls":
        return hidden.index_select(0, packed.cu_seqlens[:-1].long())
    seq_of_token = packed.indices // packed.seqlen
    sums = hidden.new_zeros(packed.batch, hidden.shape[-1]).index_add_(0, seq_of_token, hidden)
    return sums / packed.lengths.unsqueeze(1).to(hidden.dtype)


def gather_positions(hidden: torch.Tensor, packed: PackedBatch | None, positions: torch.Tensor) -> torch.Tensor:
    """hidden at padded positions (batch, P) -> (batch, P, dim). Positions that point at padding read
    token 0 of the pack (callers give them no label)."""
    if packed is None:
        return hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    where = torch.zeros(packed.batch * packed.seqlen, dtype=torch.long, device=hidden.device)
    where[packed.indices] = torch.arange(packed.total, device=hidden.device)
    flat = positions + torch.arange(packed.batch, device=positions.device).unsqueeze(1) * packed.seqlen
    return hidden.index_select(0, where[flat.flatten()]).view(*positions.shape, hidden.shape[-1])


# ---- accounting and checkpoints ------------------------------------------------------------------
def transformer_flops(n_params: int, n_layer: int, n_head: int, head_dim: int, tokens, sum_sq_len,
                      causal: bool, score_fraction: float = 1.0) -> float:
    """Training FLOPs (forward + backward) of a batch: 6 N per token for the weights (Kaplan et al.,
    2020) plus 12 L H Q T per token for attention scores and values (PaLM, appendix B), where a
    sequence of T tokens contributes T * T, so the batch term uses the sum of squared lengths. Causal
    halves it: half the score matrix is masked and a kernel may skip it. score_fraction: the part of
    the score matrix the model's attention computes at all (block-sparse: its layout's density; see
    attention_score_fraction), so that MFU counts the model's own work, never skipped blocks."""
    attention = 12 * n_layer * n_head * head_dim * float(sum_sq_len) * score_fraction
    return 6.0 * n_params * float(tokens) + (attention / 2 if causal else attention)


def attention_score_fraction(model: nn.Module, tokens, sum_sq_len) -> float:
    """The score_fraction of transformer_flops for a batch: asked of the model's first attention core
    (kernels.attention.Attention.score_fraction) at the batch's length-weighted mean sequence length,
    sum_sq_len / tokens: exact when the sequences share one length (LRA, GPT-2), an estimate otherwise."""
    from kernels.attention import Attention

    core = next((m for m in model.modules() if isinstance(m, Attention)), None)
    tokens, sum_sq_len = int(tokens), int(sum_sq_len)
    if core is None or tokens == 0:
        return 1.0
    return core.score_fraction(max(1, round(sum_sq_len / tokens)))


def resize_positions_2d(table: torch.Tensor, n: int, mode: str = "bicubic") -> torch.Tensor:
    """A learned position table of an image's pixels, R0 * R0 rows in row-major order, for an R1 x R1
    image (n = R1 * R1 rows): the rows as an R0 x R0 grid of vectors, resampled to R1 x R1 (bicubic, as
    ViT does when fine-tuning at a higher resolution; antialiased when shrinking), flattened row-major.

    In 2D, not along the sequence: pixel (r, c) is token R * r + c, so a 1D stretch would move a
    pixel's position onto another row."""
    old, dim = table.shape
    r0, r1 = math.isqrt(old), math.isqrt(n)
    if r0 * r0 != old or r1 * r1 != n:
        raise ValueError(f"position tables of {old} and {n} rows are not both square pixel grids (R * R): "
                         "only image positions without extra tokens ([CLS]) are resized")
    grid = table.detach().float().reshape(r0, r0, dim).permute(2, 0, 1).unsqueeze(0)
    out = F.interpolate(grid, size=(r1, r1), mode=mode, align_corners=False, antialias=r1 < r0)
    return out[0].permute(1, 2, 0).reshape(n, dim).to(table.dtype)


def load_resizing_positions(model: nn.Module, state: dict, mode: str = "bicubic") -> dict:
    """Load `state` into `model`; learned position tables whose length differs (a checkpoint trained on
    smaller images) are resized on the 2D pixel grid (`resize_positions_2d`). Every other tensor must
    match in name and shape, else a ValueError names each difference. Returns {name: (old rows, new
    rows)} of the resized tables."""
    own = model.state_dict()
    positions = {f"{name}.position.weight".lstrip(".") for name, m in model.named_modules()
                 if isinstance(m, Embeddings) and m.position is not None}
    problems = []
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    state, resized = dict(state), {}
    for key in sorted(set(own) & set(state)):
        have, want = tuple(state[key].shape), tuple(own[key].shape)
        if have == want:
            continue
        if key in positions and have[1:] == want[1:]:
            state[key] = resize_positions_2d(state[key], want[0], mode)
            resized[key] = (have[0], want[0])
        else:
            problems.append(f"{key}: checkpoint {have}, model {want}")
    if problems:
        raise ValueError("checkpoint does not fit the model (only learned position tables are resized, "
                         "along their length): " + "; ".join(problems))
    model.load_state_dict(state)
    return resized


def rename_state_dict(state: dict, rules: list[tuple[str, str]]) -> dict:
    """Rename keys by the first matching (regex, replacement) rule; unmatched keys are kept."""
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            new, n = re.subn(f"^{pattern}$", repl, key)
            if n:
                key = new
                break
        out[key] = value
    return out


def read_hf_config(folder: str) -> dict:
    """config.json of a HuggingFace model folder, failing clearly when there is none."""
    import json
    import os

    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no config.json in {folder}: not a HuggingFace model folder")
    with open(path) as f:
        return json.load(f)


def write_hf_folder(folder: str, config: dict, state: dict, tied: str) -> None:
    """Write config.json + model.safetensors (without the tied copy `tied`, as HF saves them)."""
    import json
    import os

    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    state = {k: v.detach().contiguous() for k, v in state.items() if k != tied}
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def read_hf_weights(folder: str) -> dict:
    """The state dict of a HuggingFace checkpoint folder (model.safetensors or pytorch_model.bin)."""
    import os

    st = os.path.join(folder, "model.safetensors")
    if os.path.exists(st):
        from safetensors.torch import load_file

        return load_file(st)
    binf = os.path.join(folder, "pytorch_model.bin")
    if os.path.exists(binf):
        return torch.load(binf, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder}")
