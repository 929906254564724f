"""Tiny stand-ins for models/encoder.py's EncoderForMaskedLM and SequenceClassifier, with the same
constructor arguments, call signatures and flops(tokens, sum_sq_len), so the task tests do not depend
on the encoder's implementation. Attention: torch's TransformerEncoderLayer with a key padding mask."""
import torch
from torch import nn


class _Encoder(nn.Module):
    def __init__(self, vocab_size, max_positions, d_model, n_layer, n_head, d_ff, dropout, attn_dropout,
                 type_vocab_size=0):
        super().__init__()
        self.n_layer, self.d_model = n_layer, d_model
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_positions, d_model)
        self.typ = nn.Embedding(type_vocab_size, d_model) if type_vocab_size else None
        layer = nn.TransformerEncoderLayer(d_model, n_head, d_ff, dropout, batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        if self.typ is not None and token_type_ids is not None:
            x = x + self.typ(token_type_ids)
        pad = None if attention_mask is None else ~attention_mask.bool()
        return self.norm(self.layers(x, src_key_padding_mask=pad))


class _Flops:
    def flops(self, tokens, sum_sq_len):
        n = sum(p.numel() for p in self.parameters()) - self.encoder.pos.weight.numel()
        return 6 * n * tokens + 12 * self.encoder.n_layer * self.encoder.d_model * sum_sq_len


class EncoderForMaskedLM(_Flops, nn.Module):
    def __init__(self, vocab_size, max_positions, d_model, n_layer, n_head, d_ff, dropout=0.0, attn_dropout=0.0,
                 type_vocab_size=2, nsp=True, attention_factory=None):
        super().__init__()
        self.encoder = _Encoder(vocab_size, max_positions, d_model, n_layer, n_head, d_ff, dropout, attn_dropout,
                                type_vocab_size)
        self.mlm_head = nn.Linear(d_model, vocab_size)
        self.nsp_head = nn.Linear(d_model, 2) if nsp else None

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None):
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        picked = h.gather(1, masked_positions[..., None].expand(-1, -1, h.shape[-1]))
        return self.mlm_head(picked), (self.nsp_head(h[:, 0]) if self.nsp_head is not None else None)


class SequenceClassifier(_Flops, nn.Module):
    def __init__(self, vocab_size, num_classes, max_positions, d_model, n_layer, n_head, d_ff, dropout=0.0,
                 attn_dropout=0.0, pooling="mean", two_inputs=False, attention_factory=None):
        super().__init__()
        self.encoder = _Encoder(vocab_size, max_positions, d_model, n_layer, n_head, d_ff, dropout, attn_dropout)
        self.pooling, self.two_inputs = pooling, two_inputs
        self.head = nn.Linear(4 * d_model if two_inputs else d_model, num_classes)

    def _pool(self, ids, mask):
        h = self.encoder(ids, mask)
        if self.pooling == "cls":
            return h[:, 0]
        m = mask.to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1)

    def forward(self, input_ids, attention_mask, input_ids_2=None, attention_mask_2=None):
        u = self._pool(input_ids, attention_mask)
        if not self.two_inputs:
            return self.head(u)
        v = self._pool(input_ids_2, attention_mask_2)
        return self.head(torch.cat([u, v, u * v, u - v], -1))
