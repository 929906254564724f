"""Bidirectional encoders on the shared blocks: a masked-LM model and a sequence classifier.

Both take padded batches with an attention_mask and remove the padding once per forward
(`models.layers.Transformer`), so every layer and every attention kind works on real tokens only.
`activation_checkpointing=True` recomputes each block in the backward instead of keeping its activations.

- `EncoderForMaskedLM`: BERT-style (post-LayerNorm by default, embedding LayerNorm, token types);
  returns (masked-LM logits, next-sentence logits or None). Given `masked_positions` (batch, P), the
  vocabulary projection runs only at those positions (what MLPerf's BERT does in training).
- `SequenceClassifier`: pooled (mean or first token) encoder output -> MLP -> class logits; with
  `two_inputs` it encodes two documents in one pass (stacked along the batch, so still one unpad) and
  classifies [u, v, u * v, u - v], the dual-encoder head of the LRA Retrieval task (Tay et al., 2021).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from kernels.padding import pad
from models.layers import (Embeddings, Transformer, attention_score_fraction, gather_positions, pool,
                           transformer_flops)


def _default_attention(factory):
    if factory is None:
        from kernels.attention import StandardAttention

        return StandardAttention
    return factory


class _EncoderModel(nn.Module):
    """Shared by both: sizes, init (BERT's: normal 0.02, zero biases) and the FLOP count."""

    packs_tokens = True  # a mask packs the real tokens once per forward: train.task.compile_model compiles per Block
    causal = False

    def _setup(self, n_layer, d_model, n_head, attn_dim=None):
        self.n_layer, self.d_model, self.n_head = n_layer, d_model, n_head
        self.attn_dim = attn_dim or d_model
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Parameter count; the 6N of the FLOP estimate leaves out position and token-type tables."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_position_embeddings and self.embed.position is not None:
            n -= self.embed.position.weight.numel()
            if self.embed.token_type is not None:
                n -= self.embed.token_type.weight.numel()
        return n

    def flops(self, tokens, sum_sq_len) -> float:
        """Training FLOPs of a batch of `tokens` real tokens whose lengths squared sum to sum_sq_len."""
        return transformer_flops(self.num_params(), self.n_layer, self.n_head, self.attn_dim // self.n_head,
                                 tokens, sum_sq_len, causal=False,
                                 score_fraction=attention_score_fraction(self, tokens, sum_sq_len))


class EncoderForMaskedLM(_EncoderModel):
    def __init__(self, vocab_size: int, max_positions: int = 512, d_model: int = 256, n_layer: int = 4,
                 n_head: int = 4, d_ff: int | None = None, dropout: float = 0.1, attn_dropout: float = 0.1,
                 type_vocab_size: int = 2, nsp: bool = True, prenorm: bool = False, activation: str = "gelu",
                 layer_norm_eps: float = 1e-12, activation_checkpointing: bool = False,
                 attention_factory: Callable | None = None):
        super().__init__()
        self.embed = Embeddings(vocab_size, d_model, max_positions, type_vocab_size, dropout, layer_norm_eps)
        self.transformer = Transformer(n_layer, d_model, n_head, _default_attention(attention_factory),
                                       final_norm=prenorm, layer_norm_eps=layer_norm_eps,
                                       activation_checkpointing=activation_checkpointing, hidden=d_ff,
                                       prenorm=prenorm, activation=activation, attn_dropout=attn_dropout,
                                       resid_dropout=dropout)
        self.mlm_transform = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU(),
                                           nn.LayerNorm(d_model, eps=layer_norm_eps))
        self.mlm_decoder = nn.Linear(d_model, vocab_size)
        self.pooler = nn.Linear(d_model, d_model) if nsp else None
        self.nsp_head = nn.Linear(d_model, 2) if nsp else None
        self._setup(n_layer, d_model, n_head)
        self.mlm_decoder.weight = self.embed.word.weight  # tied, as in BERT

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None, seq_lengths=None):
        """-> (logits (batch, P or seqlen, vocab), next-sentence logits (batch, 2) or None). seq_lengths:
        attention_mask.sum(1) from the host, optional (it spares packing its host sync)."""
        hidden, packed = self.transformer(self.embed(input_ids, token_type_ids), attention_mask,
                                          lengths=seq_lengths)
        if masked_positions is not None:
            at = gather_positions(hidden, packed, masked_positions)
        else:
            at = hidden if packed is None else pad(hidden, packed)
        logits = self.mlm_decoder(self.mlm_transform(at))
        nsp = None
        if self.nsp_head is not None:
            nsp = self.nsp_head(torch.tanh(self.pooler(pool(hidden, packed, "cls"))))
        return logits, nsp


class SequenceClassifier(_EncoderModel):
    def __init__(self, vocab_size: int, num_classes: int, max_positions: int = 1024, d_model: int = 256,
                 n_layer: int = 4, n_head: int = 4, d_ff: int | None = None, dropout: float = 0.1,
                 attn_dropout: float = 0.1, pooling: str = "mean", two_inputs: bool = False, prenorm: bool = True,
                 activation: str = "gelu", layer_norm_eps: float = 1e-5, positions: str = "learned",
                 embedding_std: float = 0.02, activation_checkpointing: bool = False, attn_dim: int | None = None,
                 attention_factory: Callable | None = None):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"unknown pooling {pooling!r}; choose 'mean' or 'cls'")
        self.pooling, self.two_inputs = pooling, two_inputs
        self.embed = Embeddings(vocab_size, d_model, max_positions, dropout=dropout, positions=positions)
        self.transformer = Transformer(n_layer, d_model, n_head, _default_attention(attention_factory),
                                       final_norm=prenorm, layer_norm_eps=layer_norm_eps,
                                       activation_checkpointing=activation_checkpointing, hidden=d_ff,
                                       prenorm=prenorm, activation=activation, attn_dropout=attn_dropout,
                                       resid_dropout=dropout, attn_dim=attn_dim)
        head_in = 4 * d_model if two_inputs else d_model
        self.head = nn.Sequential(nn.Linear(head_in, d_model), nn.GELU(), nn.Linear(d_model, num_classes))
        self._setup(n_layer, d_model, n_head, attn_dim)
        # LRA's encoders draw the token table from N(0, 1) (embedding_std 1.0 in configs/model/lra-*.yaml).
        # Next to a sinusoidal table (each feature in [-1, 1]) BERT's 0.02 leaves the tokens ~3% of the
        # input's norm: pixel values then barely reach attention (Pathfinder stayed at chance that way).
        nn.init.normal_(self.embed.word.weight, mean=0.0, std=embedding_std)

    def forward(self, input_ids, attention_mask=None, input_ids_2=None, attention_mask_2=None, seq_lengths=None,
                seq_lengths_2=None):
        """-> class logits (batch, num_classes). seq_lengths(_2): each mask's sum(1) from the host, optional."""
        if self.two_inputs != (input_ids_2 is not None):
            raise ValueError("this classifier was built with two_inputs="
                             f"{self.two_inputs}; pass input_ids_2 exactly when two_inputs is set")
        if self.two_inputs:
            if input_ids_2.shape != input_ids.shape:
                raise ValueError(f"the two inputs must share one padded shape, got {tuple(input_ids.shape)} "
                                 f"and {tuple(input_ids_2.shape)}")
            if (attention_mask is None) != (attention_mask_2 is None):
                raise ValueError("give both attention masks or neither")
            input_ids = torch.cat([input_ids, input_ids_2])
            if attention_mask is not None:
                attention_mask = torch.cat([attention_mask, attention_mask_2])
            seq_lengths = None if seq_lengths is None or seq_lengths_2 is None else [*seq_lengths, *seq_lengths_2]
        hidden, packed = self.transformer(self.embed(input_ids), attention_mask, lengths=seq_lengths)
        pooled = pool(hidden, packed, self.pooling)
        if self.two_inputs:
            u, v = pooled.chunk(2)
            pooled = torch.cat([u, v, u * v, u - v], dim=-1)
        return self.head(pooled)
