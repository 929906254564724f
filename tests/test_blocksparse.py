"""Block-sparse FlashAttention against a float64 dense reference with the token-level mask.

Under TRITON_INTERPRET=1 (no GPU) the kernels run with 16 x 16 tiles, so block_size 16 and 32 exercise
both one tile per block and several tiles per block; shapes are tiny. GPU tests (bf16, block sizes 64
and 128, longer sequences) are marked `gpu`.
"""
import pytest
import torch

from kernels import sparsity as S
from kernels.blocksparse import (
    blocksparse_attn_func,
    blocksparse_reference,
    compress_layout,
    tile_categories,
)
from kernels.flash import _PLANS, clear_plans, draw_dropout_seed, dropout_keep_mask, flash_attn_func
from kernels.launch import _interpreting
from tests.test_flash import skip_tf32


def rand_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda n, h: torch.randn(batch, n, h, d, generator=g).to(device=device, dtype=dtype).requires_grad_()
    return mk(seqlen_q, nheads), mk(seqlen_k, nheads_k), mk(seqlen_k, nheads_k)


def run(fn, q, k, v, do):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), do)
    return out, grads


def check_against_reference(q, k, v, layout, block_size, causal, dropout_mask=None, dropout_p=0.0, floor=None):
    """Kernel error vs float64 <= 2x (output) / 3x (grads) the same-dtype PyTorch error + a floor."""
    skip_tf32(q)
    do = torch.randn_like(q)
    ours = run(lambda a, b, c: _seeded(blocksparse_attn_func, a, b, c, layout, block_size, causal, dropout_p),
               q, k, v, do)
    up = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = run(lambda a, b, c: blocksparse_reference(a, b, c, layout, block_size, causal=causal,
                                                    dropout_p=dropout_p, dropout_mask=dropout_mask),
              *up, do.double())
    same = run(lambda a, b, c: blocksparse_reference(a, b, c, layout, block_size, causal=causal,
                                                     dropout_p=dropout_p, dropout_mask=dropout_mask),
               *[t.detach().clone().requires_grad_() for t in (q, k, v)], do)
    floor = floor if floor is not None else (1e-5 if q.dtype == torch.float32 else 2e-3)
    names = ["out", "dq", "dk", "dv"]
    for name, o, r, s, mult in zip(names, [ours[0], *ours[1]], [ref[0], *ref[1]], [same[0], *same[1]],
                                   [2, 3, 3, 3]):
        assert not torch.isnan(o).any(), name
        err = (o.double() - r).abs().max().item()
        base = (s.double() - r).abs().max().item()
        assert err <= mult * base + floor, f"{name}: error {err:.3g} > {mult} x {base:.3g} + {floor}"
    return ours, ref


def _seeded(fn, q, k, v, layout, block_size, causal, dropout_p):
    if dropout_p > 0:
        torch.manual_seed(1234)  # the kernel draws its seed from torch's generator
    return fn(q, k, v, layout, block_size=block_size, dropout_p=dropout_p, causal=causal)


CASES = [
    # batch, seqlen_q, seqlen_k, nheads, nheads_k, d, block_size, causal, per_head
    (2, 64, 64, 2, 2, 16, 16, False, False),
    (1, 97, 97, 2, 2, 24, 32, True, True),     # odd length, two tiles per block, per-head layout
    (1, 45, 83, 3, 3, 16, 16, True, False),    # seqlen_q < seqlen_k, causal bottom-right
    (2, 70, 33, 2, 1, 16, 32, True, True),     # seqlen_q > seqlen_k: leading rows see nothing; GQA
    (1, 50, 61, 4, 2, 40, 16, False, True),    # head dim not a power of two, GQA, per-head
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_random_layouts_match_reference(case, dtype, device):
    batch, nq, nk, h, hk, d, bs, causal, per_head = case
    q, k, v = rand_inputs(batch, nq, nk, h, hk, d, dtype, device)
    g = torch.Generator().manual_seed(7)
    layout = torch.rand(h if per_head else 1, -(-nq // bs), -(-nk // bs), generator=g) < 0.5
    layout[0, 1] = False  # an empty block row: those queries must return 0 and pass no gradient
    layout = layout.to(device)
    (out, (dq, _, _)), _ = check_against_reference(q, k, v, layout, bs, causal)
    rows = slice(bs, min(2 * bs, nq))
    assert (out[:, rows, 0] == 0).all() and (dq[:, rows, 0] == 0).all()


def test_empty_layout_and_empty_columns(device):
    q, k, v = rand_inputs(1, 40, 40, 2, 2, 16, torch.float32, device)
    layout = torch.zeros(1, 3, 3, dtype=torch.bool, device=device)
    layout[:, :, 0] = True  # only key block 0 is ever visited: keys 16.. get zero dK, dV
    do = torch.randn_like(q)
    out, (dq, dk, dv) = run(lambda a, b, c: blocksparse_attn_func(a, b, c, layout, block_size=16), q, k, v, do)
    assert (dk[:, 16:] == 0).all() and (dv[:, 16:] == 0).all() and dk[:, :16].abs().sum() > 0
    nothing = torch.zeros_like(layout)
    out, (dq, dk, dv) = run(lambda a, b, c: blocksparse_attn_func(a, b, c, nothing, block_size=16), q, k, v, do)
    assert all((t == 0).all() for t in (out, dq, dk, dv))


def test_full_layout_equals_flash(device):
    q, k, v = rand_inputs(2, 77, 77, 2, 2, 32, torch.float16, device, seed=3)
    do = torch.randn_like(q)
    for causal in (False, True):
        full = torch.ones(1, 5, 5, dtype=torch.bool, device=device)
        ours = run(lambda a, b, c: blocksparse_attn_func(a, b, c, full, block_size=16, causal=causal), q, k, v, do)
        dense = run(lambda a, b, c: flash_attn_func(a, b, c, causal=causal), q, k, v, do)
        # Under the interpreter, the same 16 x 16 tiles and the same shared step in the same order: the forward is
        # bit-identical. On the GPU flash's fixed tiles are larger (another summation order).
        if device == "cpu":
            assert torch.equal(ours[0], dense[0])
        else:
            torch.testing.assert_close(ours[0], dense[0], atol=2e-3, rtol=1e-3)
        for a, b in zip(ours[1], dense[1]):
            torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)


def _accuracy_dtype(device):
    """float32 under the interpreter; float16 on the GPU, whose float32 dots run in tf32 (an error PyTorch's
    float32 cannot bound; a wrong mask at p = 0.3 is off by ~0.1, far above either dtype's tolerance)."""
    return torch.float16 if str(device).startswith("cuda") else torch.float32


def test_dropout_matches_reference_and_flash(device):
    p = 0.3
    q, k, v = rand_inputs(1, 48, 48, 2, 2, 16, _accuracy_dtype(device), device, seed=5)
    layout = S.butterfly(48, 48, 16, device=device)
    torch.manual_seed(1234)
    seed = draw_dropout_seed(q.device)
    mask = dropout_keep_mask(seed, 1, 2, 48, 48, p)
    assert 0.5 < mask.float().mean() < 0.9
    check_against_reference(q, k, v, layout, 16, True, dropout_mask=mask, dropout_p=p)
    # Full layout + dropout: the same mask as the dense kernel for the same seed.
    full = S.full(48, 48, 16, device=device)
    torch.manual_seed(99)
    a = blocksparse_attn_func(q, k, v, full, dropout_p=p)
    torch.manual_seed(99)
    b = flash_attn_func(q, k, v, dropout_p=p)
    # Under the interpreter both kernels run the same 16 x 16 tiles: equal. On the GPU their tiles differ, so the
    # float16 P is rounded at other running maxima (~1 ulp of O); a different mask would be off by ~0.1.
    tol = dict(atol=1e-6, rtol=1e-5) if _interpreting() else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(a, b, **tol)


def test_patterns_and_layout_object(device):
    q, k, v = rand_inputs(1, 64, 64, 2, 2, 16, _accuracy_dtype(device), device, seed=9)
    for lay in (S.local(64, 64, 16, window=1), S.strided(64, 64, 16, stride=2).with_causal(),
                S.global_local(64, 64, 16, window=0, n_global=1) | S.random(64, 64, 16, 0.3, nheads=2)):
        check_against_reference(q, k, v, lay.to(device), None, False)
    # A causal layout object turns on causal masking by itself.
    lay = S.butterfly(64, 64, 16).with_causal()
    torch.testing.assert_close(blocksparse_attn_func(q, k, v, lay), blocksparse_attn_func(q, k, v, lay, causal=True))


def test_rerun_is_bit_identical(device):
    q, k, v = rand_inputs(1, 80, 80, 2, 1, 16, torch.float16, device, seed=11)
    lay = S.random(80, 80, 16, 0.5, nheads=2, seed=4)
    do = torch.randn_like(q)
    a = run(lambda x, y, z: blocksparse_attn_func(x, y, z, lay, causal=True), q, k, v, do)
    b = run(lambda x, y, z: blocksparse_attn_func(x, y, z, lay, causal=True), q, k, v, do)
    assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_backward_launch_modes_agree(device, monkeypatch, dropout_p):
    # One fused launch or two launches: the same programs, so bit-identical gradients (GQA, causal,
    # ragged length, per-head layout; with dropout the seed is fixed for both).
    import kernels.blocksparse as B

    q, k, v = rand_inputs(1, 77, 77, 4, 2, 24, torch.float16, device, seed=12)
    lay = S.random(77, 77, 32, 0.5, nheads=4, seed=5)
    do = torch.randn_like(q)
    results, launches = [], []
    for mode in ("split", "fused"):
        monkeypatch.setattr(B, "_bwd_mode", lambda head_dim: mode)
        clear_plans()  # the mode is read when a plan is made
        torch.manual_seed(3)
        if device == "cuda":
            torch.cuda.manual_seed(3)
        results.append(run(lambda x, y, z: blocksparse_attn_func(x, y, z, lay, causal=True, dropout_p=dropout_p),
                           q, k, v, do))
        launches += [len(p.launches) for p in _PLANS.values() if isinstance(p, B._BlockSparseBackward)]
    assert launches == [2, 1]
    for other in results[1:]:
        assert torch.equal(results[0][0], other[0])
        assert all(torch.equal(x, y) for x, y in zip(results[0][1], other[1]))


# ---- varlen: packed sequences of different lengths, the layout applied from each one's start ------
def varlen_case(lengths, nheads, nheads_k, d, dtype, device, seed=0):
    """Packed q/k/v (total, heads, d) leaves, cu_seqlens, and the per-sequence slices."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    mk = lambda h: torch.randn(total, h, d, generator=g).to(device=device, dtype=dtype).requires_grad_()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return mk(nheads), mk(nheads_k), mk(nheads_k), cu


def varlen_reference(q, k, v, cu, layout, causal, dropout_masks=None, dropout_p=0.0):
    """Each sequence alone through the dense reference with the layout's top-left corner."""
    outs = []
    bounds = cu.tolist()
    for b in range(len(bounds) - 1):
        s, e = bounds[b], bounds[b + 1]
        n = e - s
        mask = layout.to_dense()[:, :n, :n].to(q.device).unsqueeze(0)
        dm = None if dropout_masks is None else dropout_masks[b:b + 1, :, :n, :n]
        outs.append(_dense_reference(q[s:e][None], k[s:e][None], v[s:e][None], mask, causal or layout.causal, dm,
                                dropout_p)[0])
    return torch.cat(outs)


def _dense_reference(q, k, v, mask, causal, dropout_mask, dropout_p):
    from kernels.standard import standard_attention

    return standard_attention(q, k, v, causal=causal, mask=mask, dropout_mask=dropout_mask, dropout_p=dropout_p)


VARLEN_CASES = [
    # lengths, nheads, nheads_k, d, block_size, causal, per_head
    ([64, 37, 50], 2, 2, 16, 32, False, False),   # shorter sequences end inside a full tile
    ([97, 16, 1, 64], 2, 1, 16, 16, True, True),  # one-token sequence, GQA, per-head layout
    ([33, 80], 4, 2, 24, 32, True, True),          # head dim not a power of two
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=[str(c) for c in VARLEN_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_varlen_matches_per_sequence_reference(case, dtype, device):
    from kernels.blocksparse import blocksparse_attn_varlen_func

    lengths, h, hk, d, bs, causal, per_head = case
    padded = max(lengths) + 19  # the layout is built for the padded length, longer than any sequence
    layout = S.random(padded, padded, bs, 0.5, nheads=h if per_head else 1, seed=9)
    layout.blocks[0, 1] = False  # an empty row for the sequences that reach it
    q, k, v, cu = varlen_case(lengths, h, hk, d, dtype, device)
    skip_tf32(q)
    do = torch.randn_like(q)
    n = max(lengths)
    ours = run(lambda a, b, c: blocksparse_attn_varlen_func(a, b, c, layout, cu, cu, n, n, causal=causal),
               q, k, v, do)
    up = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = run(lambda a, b, c: varlen_reference(a, b, c, cu, layout, causal), *up, do.double())
    same = run(lambda a, b, c: varlen_reference(a, b, c, cu, layout, causal),
               *[t.detach().clone().requires_grad_() for t in (q, k, v)], do)
    floor = 1e-5 if dtype == torch.float32 else 2e-3
    for name, o, r, s_, mult in zip(["out", "dq", "dk", "dv"], [ours[0], *ours[1]], [ref[0], *ref[1]],
                                    [same[0], *same[1]], [2, 3, 3, 3]):
        err = (o.double() - r).abs().max().item()
        base = (s_.double() - r).abs().max().item()
        assert err <= mult * base + floor, f"{name}: error {err:.3g} > {mult} x {base:.3g} + {floor}"


def test_varlen_plans_serve_every_packed_length(device, monkeypatch):
    """As kernels.flash's: the varlen plans are keyed without the packed length, so a second batch with the same count
    of sequences and longest length (rounded) takes the first one's plans, with its own LSE and delta strides, and gets
    what plans made from its own packed length get."""
    import kernels.flash as fl
    from kernels.blocksparse import _bs_bwd_setup, _bs_fwd_setup, blocksparse_attn_varlen_func

    layout = S.random(64, 64, 16, 0.5, seed=9)

    def run(lengths):
        q, k, v, cu = varlen_case(lengths, 2, 2, 16, _accuracy_dtype(device), device, seed=4)
        torch.manual_seed(3)
        out = blocksparse_attn_varlen_func(q, k, v, layout, cu, cu, max(lengths), max(lengths), dropout_p=0.2,
                                           causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))

    def plans():
        return sum(setup in (_bs_fwd_setup, _bs_bwd_setup) for setup, _ in _PLANS)

    clear_plans()
    run([40, 23, 7])
    assert plans() == 2
    reused = run([10, 44, 30])  # 84 tokens against 70; the longest rounds to 48 both times
    assert plans() == 2
    clear_plans()
    monkeypatch.setattr(fl, "_rows_class", lambda n: n)  # plans made from this batch's own packed length
    fresh = run([10, 44, 30])
    for a, b in zip(reused, fresh):
        torch.testing.assert_close(a, b, atol=0 if device == "cpu" else 1e-5, rtol=0 if device == "cpu" else 1e-5)


def test_varlen_dropout_matches_dense_kernel_mask(device):
    # Sequence b of the pack draws the dense kernel's mask of batch index b (same seed).
    from kernels.blocksparse import blocksparse_attn_varlen_func

    lengths, h, p = [40, 23], 2, 0.3
    layout = S.random(48, 48, 16, 0.6, seed=2)
    dtype = _accuracy_dtype(device)
    q, k, v, cu = varlen_case(lengths, h, h, 16, dtype, device, seed=3)
    torch.manual_seed(5)
    out = blocksparse_attn_varlen_func(q, k, v, layout, cu, cu, 40, 40, dropout_p=p, causal=True)
    torch.manual_seed(5)
    seed = draw_dropout_seed(q.device)
    masks = dropout_keep_mask(seed, len(lengths), h, 40, 40, p)
    ref = varlen_reference(*(t.detach().double() for t in (q, k, v)), cu, layout, True, masks, p)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("varlen", [False, True])
def test_packed_qkv_equals_unpacked_with_one_gradient(varlen, device):
    """The packed-qkv entry points (what the models call) give the unpacked functions' output and the same
    gradients, written into one tensor shaped like qkv; dropout draws the same mask for the same seed."""
    from kernels.blocksparse import (blocksparse_attn_qkvpacked_func, blocksparse_attn_varlen_func,
                                     blocksparse_attn_varlen_qkvpacked_func)

    g = torch.Generator().manual_seed(4)
    p, h, d = 0.25, 2, 16
    if varlen:
        lengths = [40, 23]
        qkv = torch.randn(sum(lengths), 3, h, d, generator=g).to(device).requires_grad_()
        cu = torch.tensor([0, 40, 63], dtype=torch.int32, device=device)
        layout = S.make_layout("butterfly", 48, 48, 16, device=device)

        def packed(x):
            return blocksparse_attn_varlen_qkvpacked_func(x, layout, cu, 40, dropout_p=p, causal=True)

        def unpacked(q, k, v):
            return blocksparse_attn_varlen_func(q, k, v, layout, cu, cu, 40, 40, dropout_p=p, causal=True)
    else:
        qkv = torch.randn(2, 48, 3, h, d, generator=g).to(device).requires_grad_()
        layout = S.random(48, 48, 16, 0.6, seed=2)

        def packed(x):
            return blocksparse_attn_qkvpacked_func(x, layout, block_size=16, dropout_p=p)

        def unpacked(q, k, v):
            return blocksparse_attn_func(q, k, v, layout, block_size=16, dropout_p=p)
    dim = qkv.dim() - 3
    do = torch.randn(qkv.select(dim, 0).shape, generator=g).to(device)
    torch.manual_seed(7)
    out = packed(qkv)
    (grad,) = torch.autograd.grad(out, qkv, do)
    torch.manual_seed(7)
    ref = unpacked(*qkv.unbind(dim))
    (ref_grad,) = torch.autograd.grad(ref, qkv, do)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    torch.testing.assert_close(grad, ref_grad, atol=0, rtol=0)


def test_varlen_bad_inputs_raise(device):
    from kernels.blocksparse import blocksparse_attn_varlen_func

    q, k, v, cu = varlen_case([30, 20], 2, 2, 16, torch.float32, device)
    small = S.local(16, 16, 16)
    with pytest.raises(ValueError, match="build it for the padded length"):
        blocksparse_attn_varlen_func(q, k, v, small, cu, cu, 30, 30)
    with pytest.raises(TypeError, match="BlockSparseLayout"):
        blocksparse_attn_varlen_func(q, k, v, torch.ones(1, 2, 2, dtype=torch.bool), cu, cu, 30, 30)
    cu_k = torch.tensor([0, 20, 50], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        blocksparse_attn_varlen_func(q, k, v, S.local(32, 32, 16), cu, cu_k, 30, 30, causal=True)


def test_bad_layouts_raise(device):
    q, k, v = rand_inputs(1, 100, 60, 4, 4, 16, torch.float32, device)
    with pytest.raises(ValueError, match=r"\(4 or 1, 4, 2\)"):
        blocksparse_attn_func(q, k, v, torch.ones(1, 4, 3, dtype=torch.bool), block_size=32)
    with pytest.raises(ValueError, match=r"\(4 or 1, 4, 2\)"):
        blocksparse_attn_func(q, k, v, torch.ones(2, 4, 2, dtype=torch.bool), block_size=32)
    with pytest.raises(ValueError, match=r"\(4 or 1, 4, 2\)"):
        blocksparse_attn_func(q, k, v, torch.ones(4, 2, dtype=torch.bool), block_size=32)
    with pytest.raises(TypeError, match=r"bool tensor of shape \(4 or 1, 4, 2\)"):
        blocksparse_attn_func(q, k, v, torch.ones(1, 4, 2, dtype=torch.int32), block_size=32)
    with pytest.raises(ValueError, match="multiple of 16"):
        blocksparse_attn_func(q, k, v, torch.ones(1, 13, 8, dtype=torch.bool), block_size=8)
    with pytest.raises(ValueError, match="differs"):
        blocksparse_attn_func(q, k, v, S.full(100, 60, 32), block_size=64)


def brute_categories(blocks, bs, nq, nk, causal, bm, bn):
    """Tile (m, n) category from its token pairs: 2 none allowed, 0 all in range and allowed, else 1."""
    dense = S.BlockSparseLayout(blocks, bs, nq, nk, causal).to_dense()
    mt, nt = -(-nq // bm), -(-nk // bn)
    out = torch.full((blocks.shape[0], mt, nt), 2, dtype=torch.int8)
    for h in range(blocks.shape[0]):
        for m in range(mt):
            for n in range(nt):
                tile = dense[h, m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
                if tile.any():
                    whole = tile.shape == (bm, bn) and bool(tile.all())
                    out[h, m, n] = 0 if whole else 1
    return out


@pytest.mark.parametrize("nq,nk,bs,bm,bn,causal", [(100, 100, 32, 16, 16, True), (70, 130, 64, 32, 16, True),
                                                   (130, 61, 32, 32, 32, False), (64, 64, 64, 64, 32, True)])
def test_compression_against_brute_force(nq, nk, bs, bm, bn, causal):
    blocks = torch.rand(2, -(-nq // bs), -(-nk // bs), generator=torch.Generator().manual_seed(1)) < 0.6
    cat = tile_categories(blocks, bs, nq, nk, causal, bm, bn)
    assert torch.equal(cat, brute_categories(blocks, bs, nq, nk, causal, bm, bn))
    lay = S.BlockSparseLayout(blocks, bs, nq, nk)
    tab = compress_layout(lay, nq, nk, causal, bm, bn, "cpu")
    assert compress_layout(lay, nq, nk, causal, bm, bn, "cpu") is tab  # cached on the layout
    for h in range(2):
        for m in range(cat.shape[1]):
            nf, npart = int(tab.row_full[h, m]), int(tab.row_part[h, m])
            idx = tab.row_idx[h, m, :nf + npart].tolist()
            assert idx[:nf] == (cat[h, m] == 0).nonzero().flatten().tolist()
            assert idx[nf:] == (cat[h, m] == 1).nonzero().flatten().tolist()
        for n in range(cat.shape[2]):
            nf, npart = int(tab.col_full[h, n]), int(tab.col_part[h, n])
            idx = tab.col_idx[h, n, :nf + npart].tolist()
            assert idx[:nf] == (cat[h, :, n] == 0).nonzero().flatten().tolist()
            assert idx[nf:] == (cat[h, :, n] == 1).nonzero().flatten().tolist()
    assert tab.nnz_tiles == int((cat < 2).sum())


def test_work_scales_with_density():
    # Tiles visited = blocks kept x tiles per block (minus causal cuts): the kernel's work follows density.
    n, bs = 16384, 128
    bfly = S.butterfly(n, n, bs)
    tab = compress_layout(bfly, n, n, False, 128, 64, "cpu")
    assert tab.nnz_tiles == int(bfly.blocks.sum()) * 2
    assert tab.nnz_tiles / ((n // 128) * (n // 64)) == pytest.approx(bfly.density()) == 1 / 16
    causal_tab = compress_layout(S.full(n, n, bs), n, n, True, 128, 64, "cpu")
    mt = n // 128
    assert causal_tab.nnz_tiles == sum(2 * m + 2 for m in range(mt))  # upper-triangle tiles dropped
    assert int(causal_tab.row_part.max()) == 2 and int(causal_tab.row_part.min()) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_bf16(block_size, d, causal):
    q, k, v = rand_inputs(2, 1000, 1100, 4, 2, d, torch.bfloat16, "cuda", seed=21)
    lay = S.random(1000, 1100, block_size, 0.3, nheads=4, seed=2) | S.local(1000, 1100, block_size, window=0)
    check_against_reference(q, k, v, lay.to("cuda"), None, causal, floor=1e-2)
    do = torch.randn_like(q)
    a = run(lambda x, y, z: blocksparse_attn_func(x, y, z, lay, causal=causal), q, k, v, do)
    b = run(lambda x, y, z: blocksparse_attn_func(x, y, z, lay, causal=causal), q, k, v, do)
    assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@pytest.mark.gpu
def test_gpu_full_layout_equals_flash():
    q, k, v = rand_inputs(2, 2048, 2048, 4, 4, 64, torch.bfloat16, "cuda", seed=22)
    for causal in (False, True):
        a = blocksparse_attn_func(q, k, v, S.full(2048, 2048, 128, device="cuda"), causal=causal)
        b = flash_attn_func(q, k, v, causal=causal)
        assert (a.float() - b.float()).abs().max().item() < 2e-2


@pytest.mark.gpu
def test_gpu_new_varlen_batches_compile_nothing():
    # As tests/test_flash.py's: a new token count or longest sequence compiles no new kernel variant.
    import kernels.blocksparse as B
    from kernels.blocksparse import blocksparse_attn_varlen_func

    layout = S.random(512, 512, 64, 0.5, seed=3)
    counts = []
    for lengths in ([512, 300, 77], [512, 288, 80], [505, 64, 3, 1]):  # totals 889, 880 (= 55 x 16), 573
        q, k, v, cu = varlen_case(lengths, 4, 4, 64, torch.bfloat16, "cuda")
        out = blocksparse_attn_varlen_func(q, k, v, layout, cu, cu, max(lengths), max(lengths))
        out.sum().backward()
        torch.cuda.synchronize()
        counts.append(sum(len(c[0]) for kern in (B._bs_fwd_kernel, B._bs_bwd_kernel) for c in kern.device_caches.values()))
    assert counts[1:] == counts[:1] * 2, f"compiled variants after each batch: {counts}"
