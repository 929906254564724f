"""BERT (Devlin et al., 2019) on the shared encoder, HuggingFace `BertForPreTraining`-compatible.

`BertForPreTraining` is `models.encoder.EncoderForMaskedLM` (post-LayerNorm, exact-erf GELU, learned
positions, token types, embedding LayerNorm, masked-LM transform + decoder tied to the word embeddings,
pooler + next-sentence head) with HuggingFace's parameter names at the checkpoint boundary:

    model = BertForPreTraining.from_pretrained(folder, attention_factory=FlashAttention)  # HF folder
    prediction_logits, seq_relationship_logits = model(input_ids, attention_mask, token_type_ids)
    model.save_pretrained(out)            # transformers.BertForPreTraining.from_pretrained(out) reads it

HF keeps query/key/value as three Linear layers; the shared block has one fused qkv Linear, so loading
concatenates them (rows q, k, v) and saving splits them again. Unpadded end to end: given an
attention_mask the encoder packs the real tokens once per forward, and with `masked_positions`
(batch, P) the vocabulary projection runs only there (MLPerf's "dense_seq_output").

Hydra builds it from the encoder's own keyword names (configs/model/bert-*.yaml: d_model, n_layer, ...);
`BertConfig` carries HF's names for config.json.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch

from models.encoder import EncoderForMaskedLM
from models.layers import read_hf_config, read_hf_weights, rename_state_dict, write_hf_folder


@dataclass
class BertConfig:
    """The fields of HF's BertConfig this model uses, under HF's names (bert-base-uncased defaults)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    def encoder_kwargs(self) -> dict:
        """The same sizes under EncoderForMaskedLM's keyword names."""
        return dict(vocab_size=self.vocab_size, max_positions=self.max_position_embeddings, d_model=self.hidden_size,
                    n_layer=self.num_hidden_layers, n_head=self.num_attention_heads, d_ff=self.intermediate_size,
                    dropout=self.hidden_dropout_prob, attn_dropout=self.attention_probs_dropout_prob,
                    type_vocab_size=self.type_vocab_size, layer_norm_eps=self.layer_norm_eps)

    @classmethod
    def from_encoder_kwargs(cls, kw: dict) -> "BertConfig":
        return cls(vocab_size=kw["vocab_size"], hidden_size=kw["d_model"], num_hidden_layers=kw["n_layer"],
                   num_attention_heads=kw["n_head"], intermediate_size=kw["d_ff"] or 4 * kw["d_model"],
                   hidden_dropout_prob=kw["dropout"], attention_probs_dropout_prob=kw["attn_dropout"],
                   max_position_embeddings=kw["max_positions"], type_vocab_size=kw["type_vocab_size"],
                   layer_norm_eps=kw["layer_norm_eps"])

    def to_hf_dict(self) -> dict:
        return dict(asdict(self), model_type="bert", architectures=["BertForPreTraining"],
                    position_embedding_type="absolute", tie_word_embeddings=True)

    @classmethod
    def from_hf_dict(cls, d: dict) -> "BertConfig":
        if d.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {d['hidden_act']!r}: this BERT uses exact (erf) GELU")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported position_embedding_type {d['position_embedding_type']!r}")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})


# ours -> HF (q/k/v handled separately: one fused tensor of ours is three of HF's)
_HF_NAMES = [
    (r"embed\.word\.weight", r"bert.embeddings.word_embeddings.weight"),
    (r"embed\.position\.weight", r"bert.embeddings.position_embeddings.weight"),
    (r"embed\.token_type\.weight", r"bert.embeddings.token_type_embeddings.weight"),
    (r"embed\.norm\.(\w+)", r"bert.embeddings.LayerNorm.\1"),
    (r"transformer\.blocks\.(\d+)\.attn\.out\.(\w+)", r"bert.encoder.layer.\1.attention.output.dense.\2"),
    (r"transformer\.blocks\.(\d+)\.norm1\.(\w+)", r"bert.encoder.layer.\1.attention.output.LayerNorm.\2"),
    (r"transformer\.blocks\.(\d+)\.mlp\.fc1\.(\w+)", r"bert.encoder.layer.\1.intermediate.dense.\2"),
    (r"transformer\.blocks\.(\d+)\.mlp\.fc2\.(\w+)", r"bert.encoder.layer.\1.output.dense.\2"),
    (r"transformer\.blocks\.(\d+)\.norm2\.(\w+)", r"bert.encoder.layer.\1.output.LayerNorm.\2"),
    (r"mlm_transform\.0\.(\w+)", r"cls.predictions.transform.dense.\1"),
    (r"mlm_transform\.2\.(\w+)", r"cls.predictions.transform.LayerNorm.\1"),
    (r"mlm_decoder\.weight", r"cls.predictions.decoder.weight"),
    (r"mlm_decoder\.bias", r"cls.predictions.bias"),
    (r"pooler\.(\w+)", r"bert.pooler.dense.\1"),
    (r"nsp_head\.(\w+)", r"cls.seq_relationship.\1"),
]
_QKV = r"transformer\.blocks\.(\d+)\.attn\.qkv\.(\w+)"
_HF_QKV = "bert.encoder.layer.{}.attention.self.{}.{}"
# Keys HF checkpoints may carry that hold no parameter of ours: buffers, and the decoder copies of tied tensors.
_HF_IGNORED = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


class BertForPreTraining(EncoderForMaskedLM):
    """BERT with masked-LM and next-sentence heads: (input_ids, attention_mask, token_type_ids) ->
    (prediction_logits (batch, seqlen or P, vocab), seq_relationship_logits (batch, 2)).

    Build from a BertConfig (HF names) or from EncoderForMaskedLM's keyword names (the Hydra configs).
    """

    def __init__(self, config: BertConfig | None = None, attention_factory: Callable | None = None, **kwargs):
        if config is not None and kwargs:
            raise TypeError("pass either a BertConfig or keyword sizes, not both")
        kw = config.encoder_kwargs() if config is not None else dict(kwargs)
        for fixed in ("nsp", "prenorm", "activation"):
            if fixed in kw:
                raise TypeError(f"BERT fixes {fixed!r} (next-sentence head, post-LayerNorm, erf GELU)")
        super().__init__(**kw, nsp=True, prenorm=False, activation="gelu", attention_factory=attention_factory)
        full = dict(vocab_size=None, max_positions=512, d_model=256, n_layer=4, n_head=4, d_ff=None, dropout=0.1,
                    attn_dropout=0.1, type_vocab_size=2, layer_norm_eps=1e-12)
        full.update(kw)
        self.config = config or BertConfig.from_encoder_kwargs(full)

    # ---- HuggingFace checkpoint interchange -------------------------------------------------------
    def hf_state_dict(self) -> dict:
        """The state dict under BertForPreTraining's names, q/k/v split (the tied decoder weight included)."""
        out = {}
        for key, value in self.state_dict().items():
            m = re.fullmatch(_QKV, key)
            if m:
                for name, part in zip(("query", "key", "value"), value.chunk(3, dim=0)):
                    out[_HF_QKV.format(m[1], name, m[2])] = part
            else:
                out.update(rename_state_dict({key: value}, _HF_NAMES))
        return out

    def _from_hf_state_dict(self, state: dict) -> dict:
        """HF names -> ours (q/k/v concatenated); raises naming every missing and unexpected key."""
        # TF-era checkpoints name LayerNorm parameters gamma/beta
        state = {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
                 for k, v in state.items()}
        state = {(k[5:] if k.startswith("bert.bert.") else k): v for k, v in state.items()}
        out, used, missing = {}, set(), []
        for ours in self.state_dict():
            if re.fullmatch(_QKV, ours) or ours == "mlm_decoder.weight":  # q/k/v below; decoder tied to embeddings
                continue
            hf = next(iter(rename_state_dict({ours: None}, _HF_NAMES)))
            if hf in state:
                out[ours] = state[hf]
                used.add(hf)
            else:
                missing.append(hf)
        for i in range(self.n_layer):
            for p in ("weight", "bias"):
                names = [_HF_QKV.format(i, n, p) for n in ("query", "key", "value")]
                present = [n for n in names if n in state]
                missing += [n for n in names if n not in state]
                used.update(present)  # an incomplete triple reports only what is missing
                if len(present) == 3:
                    out[f"transformer.blocks.{i}.attn.qkv.{p}"] = torch.cat([state[n] for n in names], dim=0)
        unexpected = sorted(set(state) - used - set(_HF_IGNORED))
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match this BertForPreTraining ({self.n_layer} layers): "
                             f"missing {sorted(missing)}, unexpected {unexpected}")
        expected = {k: v.shape for k, v in self.hf_state_dict().items()}
        bad = [f"{k} {tuple(state[k].shape)} (config.json implies {tuple(expected[k])})"
               for k in sorted(used) if k in expected and state[k].shape != expected[k]]
        if bad:
            raise ValueError(f"checkpoint shapes do not match its config.json: {bad}")
        out["mlm_decoder.weight"] = out["embed.word.weight"]
        return out

    @classmethod
    def from_pretrained(cls, folder: str, attention_factory: Callable | None = None, **overrides) -> "BertForPreTraining":
        """Load a HF BertForPreTraining folder (config.json + model.safetensors or pytorch_model.bin);
        `overrides` replace config.json fields (e.g. hidden_dropout_prob=0.0)."""
        hf = {**read_hf_config(folder), **overrides}
        model = cls(BertConfig.from_hf_dict(hf), attention_factory)
        model.load_state_dict(model._from_hf_state_dict(read_hf_weights(folder)))
        return model

    def save_pretrained(self, folder: str) -> None:
        """Write config.json + model.safetensors that `transformers.BertForPreTraining.from_pretrained` reads."""
        write_hf_folder(folder, self.config.to_hf_dict(), self.hf_state_dict(), tied="cls.predictions.decoder.weight")
