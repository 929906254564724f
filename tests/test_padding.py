"""Padding removed once per model forward: PackedBatch, and every attention kind on padded or packed input
equal to attention over each sequence alone."""
import warnings

import pytest
import torch

from kernels.attention import BlockSparseAttention, FlashAttention, SDPAttention, StandardAttention
from kernels.padding import PackedBatch, pad, unpad
from kernels.standard import standard_attention


def ragged_mask(lengths, seqlen, device="cpu"):
    return torch.arange(seqlen, device=device)[None] < torch.tensor(lengths, device=device)[:, None]


def test_packed_batch_from_mask():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.int64)
    p = PackedBatch.from_mask(mask)
    assert p.indices.tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert p.cu_seqlens.tolist() == [0, 3, 4, 8] and p.cu_seqlens.dtype == torch.int32
    assert (p.max_seqlen, p.total, p.batch, p.seqlen) == (4, 8, 3, 4)
    assert p.lengths.tolist() == [3, 1, 4]
    # A mask with holes (left padding) packs the real tokens in order too.
    q = PackedBatch.from_mask(torch.tensor([[False, True, True], [True, False, True]]))
    assert q.indices.tolist() == [1, 2, 3, 5] and q.cu_seqlens.tolist() == [0, 2, 4]


def test_pad_unpad_round_trip_and_gradient():
    mask = ragged_mask([5, 2, 7], 7)
    p = PackedBatch.from_mask(mask)
    x = torch.randn(3, 7, 4, requires_grad=True)
    packed = unpad(x, p)
    assert packed.shape == (14, 4)
    back = pad(packed, p)
    torch.testing.assert_close(back[mask], x[mask])
    assert not back[~mask].any()
    back.sum().backward()
    assert torch.equal(x.grad, mask[..., None].float().expand_as(x))  # padding gets no gradient


@pytest.mark.parametrize("bad, words", [
    (torch.ones(2, 3, 4), "must be \\(batch, seqlen\\)"),
    (torch.tensor([[1, 2, 0]]), "only 0 and 1"),
    (torch.tensor([[0.5, 1.0]]), "bool or integer"),
    (torch.tensor([[1, 1], [0, 0]]), "sequence 1 of the batch has no real token"),
])
def test_bad_masks_raise(bad, words):
    with pytest.raises((ValueError, TypeError), match=words):
        PackedBatch.from_mask(bad)


def _per_sequence(q, k, v, lengths, causal, layout=None):
    """Attention over each sequence alone (float64), padded back with zeros."""
    out = torch.zeros_like(q, dtype=torch.float64)
    for b, n in enumerate(lengths):
        mask = None if layout is None else layout.to_dense()[:, :n, :n].unsqueeze(0)
        out[b, :n] = standard_attention(*(t[b:b + 1, :n].double() for t in (q, k, v)), causal=causal, mask=mask)[0]
    return out


CORES = {
    "standard": lambda: StandardAttention(),
    "sdpa": lambda: SDPAttention(),
    "flash": lambda: FlashAttention(),
    "blocksparse": lambda: BlockSparseAttention(pattern="random", block_size=16, density=0.5, seed=1),
}


@pytest.mark.parametrize("kind", list(CORES))
@pytest.mark.parametrize("causal", [False, True])
def test_padded_and_packed_batches_equal_per_sequence_attention(kind, causal, device):
    torch.manual_seed(0)
    lengths, seqlen, h, d = [40, 17, 1, 33], 40, 2, 16
    q, k, v = (torch.randn(len(lengths), seqlen, h, d, device=device) for _ in range(3))
    mask = ragged_mask(lengths, seqlen, device)
    core = CORES[kind]().eval()
    layout = core.layout(seqlen, seqlen, device) if kind == "blocksparse" else None
    ref = _per_sequence(q, k, v, lengths, causal, layout)
    padded = core(q, k, v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(padded[mask].double(), ref[mask], atol=2e-5, rtol=1e-4)
    p = PackedBatch.from_mask(mask)
    packed = core(unpad(q, p), unpad(k, p), unpad(v, p), causal=causal, packed=p)
    assert packed.shape == (sum(lengths), h, d)
    torch.testing.assert_close(packed.double(), ref[mask], atol=2e-5, rtol=1e-4)


def test_packed_call_checks_its_arguments():
    core = StandardAttention()
    p = PackedBatch.from_mask(ragged_mask([3, 2], 3))
    q = torch.randn(5, 2, 8)
    with pytest.raises(ValueError, match="total_tokens=5"):
        core(q[:4], q[:4], q[:4], packed=p)
    with pytest.raises(ValueError, match="not both"):
        core(q, q, q, packed=p, key_padding_mask=p.mask)


def test_blocksparse_layout_shared_by_instances():
    a = BlockSparseAttention(pattern="local", block_size=16, window=1)
    b = BlockSparseAttention(pattern="local", block_size=16, window=1)
    c = BlockSparseAttention(pattern="local", block_size=16, window=2)
    assert a.layout(64, 64, "cpu") is b.layout(64, 64, "cpu")
    assert c.layout(64, 64, "cpu") is not a.layout(64, 64, "cpu")


def test_one_unpad_and_no_per_layer_sync_per_forward(monkeypatch, device):
    """A padded batch through a 3-layer classifier (two inputs) builds one PackedBatch and never checks
    cu_seqlens on the host inside the layers."""
    import kernels.flash as F
    from models.encoder import SequenceClassifier

    built, host_checks = [], []
    from_mask = PackedBatch.from_mask.__func__
    monkeypatch.setattr(PackedBatch, "from_mask", classmethod(lambda cls, m, n=None: built.append(1) or from_mask(cls, m, n)))
    check = F.check_inputs
    monkeypatch.setattr(F, "check_inputs", lambda *a, **kw: host_checks.append(kw.get("cu_seqlens_q") is not None)
                        or check(*a, **kw))
    model = SequenceClassifier(vocab_size=50, num_classes=3, max_positions=32, d_model=32, n_layer=3, n_head=2,
                               two_inputs=True, attention_factory=FlashAttention).to(device).eval()
    ids = torch.randint(0, 50, (2, 32), device=device)
    mask = ragged_mask([32, 9], 32, device)
    model(ids, mask, ids.flip(0), mask.flip(0))
    assert built == [1]
    assert host_checks == [False] * 3  # three layers, none syncing on cu_seqlens


def test_host_lengths_pack_alike_without_reading_the_device(monkeypatch):
    """Lengths given from the host build the same PackedBatch and read nothing back from the device; lengths
    that disagree with the mask fail (an async device assert: on a CPU at once), never pack quietly."""
    mask = ragged_mask([5, 8, 3], 8, "cpu")
    want = PackedBatch.from_mask(mask)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("read lengths back from the device"))
    got = PackedBatch.from_mask(mask, [5, 8, 3])
    monkeypatch.undo()
    assert (got.max_seqlen, got.total) == (want.max_seqlen, want.total) == (8, 16)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.cu_seqlens, want.cu_seqlens)
    with pytest.raises(RuntimeError, match="lengths differ"):
        PackedBatch.from_mask(mask, [5, 7, 3])  # total 15 of 16
    with pytest.raises(RuntimeError, match="lengths differ"):
        PackedBatch.from_mask(mask, [6, 7, 3])  # same total, longest 7 of 8
    with pytest.raises(RuntimeError, match="lengths differ"):
        PackedBatch.from_mask(torch.where(mask, 2, 0), [5, 8, 3])  # not a 0/1 mask
    with pytest.raises(ValueError, match="do not fit"):
        PackedBatch.from_mask(mask, [5, 8])


def test_task_hands_packing_models_host_lengths(device):
    """train.task.Task reads each mask's lengths while the batch is on the host; the model's output with
    them equals its output without."""
    from models.encoder import SequenceClassifier
    from train.task import ClassificationTask

    torch.manual_seed(0)
    model = SequenceClassifier(vocab_size=50, num_classes=3, max_positions=16, d_model=32, n_layer=2, n_head=2,
                               two_inputs=True, dropout=0.0, attn_dropout=0.0).eval()
    task = ClassificationTask(model)
    ids = torch.randint(0, 50, (2, 16))
    batch = {"input_ids": ids, "attention_mask": ragged_mask([16, 9], 16, "cpu"), "input_ids_2": ids.flip(0),
             "attention_mask_2": ragged_mask([4, 12], 16, "cpu"), "labels": torch.tensor([0, 2])}
    plain = task(dict(batch))
    batch = task.on_before_batch_transfer(batch, 0)
    assert batch["seq_lengths"] == [16, 9] and batch["seq_lengths_2"] == [4, 12]
    torch.testing.assert_close(task(batch), plain)


def _gpu_forward_syncs(**kw) -> list[str]:
    """The host syncs of one warm forward of a 4-layer flash classifier on a padded batch (kw: the
    model's extra arguments)."""
    from models.encoder import SequenceClassifier

    model = SequenceClassifier(vocab_size=50, num_classes=3, max_positions=64, d_model=64, n_layer=4, n_head=2,
                               attention_factory=FlashAttention).cuda().eval()
    ids = torch.randint(0, 50, (3, 64), device="cuda")
    mask = ragged_mask([64, 20, 33], 64, "cuda")
    model(ids, mask, **kw)  # compile and warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(ids, mask, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


@pytest.mark.gpu
def test_gpu_forward_syncs_once():
    syncs = _gpu_forward_syncs()
    assert len(syncs) == 1, syncs


@pytest.mark.gpu
def test_gpu_forward_with_host_lengths_never_syncs():
    assert _gpu_forward_syncs(seq_lengths=[64, 20, 33]) == []
