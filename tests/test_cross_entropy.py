"""The fused LM-head loss (kernels/cross_entropy.py) against the plain loss in float64, its padding, ignore and
bad-target handling, its operator under torch.compile, and GPT-2's training loss through it."""
import pytest
import torch
import torch.nn.functional as F

import kernels.cross_entropy as CE
from kernels.cross_entropy import linear_cross_entropy, linear_cross_entropy_reference
from models.gpt2 import GPT2

TINY = dict(vocab_size=101, n_positions=32, n_embd=64, n_layer=2, n_head=4)


def _inputs(device, n=37, d=16, padded=48, vocab=33, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g).to(device, dtype).requires_grad_()
    weight = (torch.randn(padded, d, generator=g) * 0.5).to(device, dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=g).to(device)
    targets[::5] = -100  # ignored
    return hidden, weight, targets, vocab


def _loss_and_grads(fn, hidden, weight, targets, vocab, **kw):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = fn(h, w, targets, vocab_size=vocab, **kw)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.fixture(params=["kernel", "torch"])
def row_step(request, monkeypatch, device):
    """The row step as the Triton kernel (GPU, or the interpreter) or as PyTorch operations (CPU)."""
    if request.param == "torch":
        if device != "cpu":
            pytest.skip("the PyTorch row step runs on the CPU")
    elif device == "cpu":
        if not CE._interpreting():
            pytest.skip("the kernel needs a GPU or TRITON_INTERPRET=1")
        monkeypatch.setattr(CE, "KERNEL_ON_CPU", True)
    return request.param


@pytest.mark.parametrize("chunk_elements", [48 * 8, CE.CHUNK_ELEMENTS])  # five chunks; one
def test_matches_float64_reference(row_step, device, chunk_elements):
    hidden, weight, targets, vocab = _inputs(device)
    want = _loss_and_grads(linear_cross_entropy_reference, hidden.double(), weight.double(), targets, vocab)
    got = _loss_and_grads(linear_cross_entropy, hidden, weight, targets, vocab, chunk_elements=chunk_elements)
    fp32 = _loss_and_grads(linear_cross_entropy_reference, hidden, weight, targets, vocab)
    for g, w, f in zip(got, want, fp32):
        assert g.dtype == f.dtype
        # within a few times the plain float32 loss's own error (a wrong gradient is off by ~1/n = 3e-2)
        bound = 4 * (f.double() - w).abs().max().item() + 1e-6
        assert (g.double() - w).abs().max().item() <= bound
    # padding rows take no part: zero gradient, and the loss equals the unpadded weight's
    assert got[2][vocab:].abs().sum() == 0
    unpadded = _loss_and_grads(linear_cross_entropy, hidden, weight[:vocab], targets, vocab)
    torch.testing.assert_close(unpadded[0], got[0])


def test_bad_targets_and_inputs(row_step, device):
    hidden, weight, targets, vocab = _inputs(device)
    bad = targets.clone()
    bad[1] = vocab  # a padding row's id: not a real token
    assert torch.isnan(linear_cross_entropy(hidden, weight, bad, vocab_size=vocab))
    every_ignored = torch.full_like(targets, -100)
    assert torch.isnan(linear_cross_entropy(hidden, weight, every_ignored, vocab_size=vocab))  # as F.cross_entropy
    with pytest.raises(ValueError, match="leading shape"):
        linear_cross_entropy(hidden, weight, targets[:-1], vocab_size=vocab)
    with pytest.raises(ValueError, match="vocab_size"):
        linear_cross_entropy(hidden, weight, targets, vocab_size=weight.shape[0] + 1)
    with pytest.raises(ValueError, match="token ids"):
        linear_cross_entropy(hidden, weight, targets.float(), vocab_size=vocab)


def test_without_gradients(row_step, device):
    hidden, weight, targets, vocab = _inputs(device)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, vocab_size=vocab)
        want = linear_cross_entropy_reference(hidden, weight, targets, vocab_size=vocab)
    torch.testing.assert_close(loss, want)


def test_op_passes_opcheck(device):
    # the operator carries no autograd formula (kernels/ops.py: the Function around it does), so it is checked on
    # inputs that do not require grad
    hidden, weight, targets, vocab = (t.detach() if isinstance(t, torch.Tensor) else t for t in _inputs(device))
    args = (hidden, weight, targets, vocab, -100, torch.float32, True, 48 * 8)
    torch.library.opcheck(torch.ops.flashattn.linear_cross_entropy.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_gpt2_loss_equals_plain_loss_and_compiles(device):
    torch.manual_seed(0)
    model = GPT2(**TINY, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0).to(device)
    ids = torch.randint(0, TINY["vocab_size"], (2, 17), device=device)
    x, y = ids[:, :-1], ids[:, 1:]

    def loss_and_grads(fn):
        model.zero_grad()
        loss = fn()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    plain = loss_and_grads(lambda: F.cross_entropy(model(x).reshape(-1, TINY["vocab_size"]).float(), y.reshape(-1)))
    fused = loss_and_grads(lambda: model(x, y))
    compiled_model = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    compiled = loss_and_grads(lambda: compiled_model(x, y))
    for got in (fused, compiled):
        torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-6)
        for a, b in zip(got[1], plain[1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_autocast_within_the_plain_loss_error(dtype):
    """Under autocast both losses make the logits in 16 bits; ours stays within the plain one's error of float64."""
    hidden, weight, targets, _ = _inputs("cuda", n=300, d=64, padded=1024, vocab=1000)
    want = _loss_and_grads(linear_cross_entropy_reference, hidden.double(), weight.double(), targets, 1000)
    with torch.autocast("cuda", dtype=dtype):
        got = _loss_and_grads(linear_cross_entropy, hidden, weight, targets, 1000, chunk_elements=1024 * 128)
        plain = _loss_and_grads(linear_cross_entropy_reference, hidden, weight, targets, 1000)
    for g, w, p in zip(got, want, plain):
        assert g.dtype == p.dtype
        assert (g.double() - w).abs().max().item() <= 2 * (p.double() - w).abs().max().item() + 1e-6
