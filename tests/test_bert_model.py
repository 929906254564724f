"""models.bert against HuggingFace transformers.BertForPreTraining: a random tiny HF model saved to a
folder loads into ours and gives the same logits at real tokens of a padded batch for every attention
kind (flash / block-sparse under the Triton interpreter on a CPU, float32); ours saves a folder HF
loads; a checkpoint that does not fit raises naming the keys."""
import functools
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernels.attention import BlockSparseAttention, FlashAttention, SDPAttention, StandardAttention  # noqa: E402
from models.bert import BertConfig, BertForPreTraining  # noqa: E402

KINDS = {
    "standard": StandardAttention,
    "sdpa": SDPAttention,
    "flash": FlashAttention,
    # the full layout: block-sparse machinery (varlen, per-sequence layout) computing dense attention
    "blocksparse": functools.partial(BlockSparseAttention, pattern="full", block_size=16),
}
LENGTHS, SEQLEN = [40, 9, 27], 40
TINY = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=48, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
    with torch.no_grad():  # random LayerNorm and bias values, so that a swapped name would show
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    folder = tmp_path_factory.mktemp("hf_bert")
    hf.save_pretrained(folder)
    return folder


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, TINY["vocab_size"], (len(LENGTHS), SEQLEN), generator=g)
    mask = torch.arange(SEQLEN)[None] < torch.tensor(LENGTHS)[:, None]
    types = ((torch.arange(SEQLEN)[None] >= torch.tensor(LENGTHS)[:, None] // 2) & mask).long()
    return ids.masked_fill(~mask, 0), mask, types


def _hf_logits(folder, ids, mask, types):
    hf = transformers.BertForPreTraining.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=types)
    return out.prediction_logits, out.seq_relationship_logits


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_match_hf_on_a_padded_batch(hf_folder, kind):
    ids, mask, types = _batch()
    ref_mlm, ref_nsp = _hf_logits(hf_folder, ids, mask, types)
    model = BertForPreTraining.from_pretrained(hf_folder, attention_factory=KINDS[kind]).eval()
    with torch.no_grad():
        mlm, nsp = model(ids, attention_mask=mask, token_type_ids=types)
        positions = torch.tensor([[0, 39, 5], [8, 1, 0], [26, 13, 2]])
        at, _ = model(ids, mask, types, masked_positions=positions)
    assert mlm.shape == ref_mlm.shape and nsp.shape == (3, 2)
    torch.testing.assert_close(mlm[mask], ref_mlm[mask], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nsp, ref_nsp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(at, ref_mlm.gather(1, positions[..., None].expand(-1, -1, ref_mlm.shape[-1])),
                               atol=1e-4, rtol=1e-4)


def test_unpadded_batch_and_bin_checkpoint(hf_folder, tmp_path):
    """No mask (every token real) and a pytorch_model.bin folder (the hub's older format)."""
    hf = transformers.BertForPreTraining.from_pretrained(hf_folder).eval()
    state = {k: v for k, v in hf.state_dict().items()}  # includes the tied decoder weight, as old .bin files do
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((hf_folder / "config.json").read_text())
    model = BertForPreTraining.from_pretrained(tmp_path).eval()
    ids = torch.randint(1, TINY["vocab_size"], (2, 17))
    with torch.no_grad():
        ref = hf(input_ids=ids)
        mlm, nsp = model(ids)
    torch.testing.assert_close(mlm, ref.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_save_pretrained_round_trip_through_hf(tmp_path):
    torch.manual_seed(3)
    ours = BertForPreTraining(BertConfig(**TINY)).eval()
    ours.save_pretrained(tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["hidden_size"] == 32
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=types)
        mlm, nsp = ours(ids, mask, types)
    torch.testing.assert_close(mlm[mask], ref.prediction_logits[mask], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    # and back: HF's save loads into ours with identical parameters
    hf.save_pretrained(tmp_path / "hf")
    back = BertForPreTraining.from_pretrained(tmp_path / "hf")
    for (k, a), b in zip(ours.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)
    assert back.mlm_decoder.weight is back.embed.word.weight


def test_mismatched_checkpoint_names_the_keys(hf_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(hf_folder / "model.safetensors")
    state.pop("bert.encoder.layer.1.attention.self.key.weight")
    state["bert.encoder.layer.2.output.dense.weight"] = torch.zeros(1)
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((hf_folder / "config.json").read_text())
    with pytest.raises(ValueError, match=r"(?s)missing \['bert.encoder.layer.1.attention.self.key.weight'\]"
                                         r".*unexpected \['bert.encoder.layer.2.output.dense.weight'\]"):
        BertForPreTraining.from_pretrained(tmp_path)
    # the right names with the wrong sizes
    cfg = json.loads((hf_folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=128)))
    save_file(load_file(hf_folder / "model.safetensors"), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="intermediate.dense.weight"):
        BertForPreTraining.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        BertForPreTraining.from_pretrained(tmp_path / "nowhere")


def test_construction_forms_and_flops():
    a = BertForPreTraining(BertConfig(**TINY))
    b = BertForPreTraining(vocab_size=TINY["vocab_size"], max_positions=48, d_model=32, n_layer=2, n_head=2, d_ff=64)
    assert a.config.intermediate_size == b.config.intermediate_size == 64 and b.config.hidden_size == 32
    assert a.num_params() == b.num_params()
    with pytest.raises(TypeError, match="not both"):
        BertForPreTraining(BertConfig(), n_layer=2)
    with pytest.raises(TypeError, match="prenorm"):
        BertForPreTraining(vocab_size=10, prenorm=True)
    with pytest.raises(ValueError, match="exceeds the 48 positions"):
        a(torch.zeros(1, 49, dtype=torch.long))
    assert a.flops(100, 100 * 100) > 6 * a.num_params() * 100
