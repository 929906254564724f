"""Block-sparsity patterns against their definitions, written here token by token (CPU, fast)."""
import pytest
import torch

from kernels import sparsity as S


def token_mask(seqlen_q, seqlen_k, bs, rule, causal=False):
    """Reference: allowed[i, j] = rule(i // bs, j // bs) (and bottom-right causal), element by element."""
    out = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool)
    for i in range(seqlen_q):
        for j in range(seqlen_k):
            ok = rule(i // bs, j // bs)
            if causal:
                ok = ok and j <= i + seqlen_k - seqlen_q
            out[i, j] = ok
    return out


def popcount(x):
    return bin(x).count("1")


RULES = {
    "full": ({}, lambda i, j: True),
    "local": ({"window": 2}, lambda i, j: abs(i - j) <= 2),
    "global_local": ({"window": 1, "n_global": 2}, lambda i, j: abs(i - j) <= 1 or i < 2 or j < 2),
    "strided": ({"stride": 3}, lambda i, j: (i - j) % 3 == 0 or abs(i - j) < 3),
    "butterfly": ({}, lambda i, j: popcount(i ^ j) <= 1),
}


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("seqlen_q,seqlen_k,bs", [(64, 64, 8), (37, 53, 4), (50, 21, 8)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_pattern_matches_definition(name, seqlen_q, seqlen_k, bs, is_causal):
    kwargs, rule = RULES[name]
    layout = S.PATTERNS[name](seqlen_q, seqlen_k, bs, **kwargs)
    if is_causal:
        layout = layout & S.causal(seqlen_q, seqlen_k, bs)
    assert layout.shape == (1, -(-seqlen_q // bs), -(-seqlen_k // bs))
    assert layout.causal == is_causal
    expected = token_mask(seqlen_q, seqlen_k, bs, rule, causal=is_causal)
    assert torch.equal(layout.to_dense()[0], expected)


def test_butterfly_n_factors_and_density():
    lay = S.butterfly(16 * 32, 16 * 32, 32, n_factors=2)  # 16 x 16 blocks, offsets {0, 1, 2}
    b = lay.blocks[0]
    for i in range(16):
        assert sorted(b[i].nonzero().flatten().tolist()) == sorted({i, i ^ 1, i ^ 2})
    full_bfly = S.butterfly(128 * 128, 128 * 128, 128)  # 128 blocks: 1 + log2(128) = 8 per row
    assert full_bfly.density() == pytest.approx(8 / 128)
    assert full_bfly.sparsity() == pytest.approx(1 - 8 / 128)


def test_causal_pattern_blocks_and_union_rules():
    c = S.causal(10, 30, 4)  # bottom-right: query i sees keys j <= i + 20
    expected_blocks = torch.tensor([[j * 4 <= min(i * 4 + 3, 9) + 20 for j in range(8)] for i in range(3)])
    assert torch.equal(c.blocks[0], expected_blocks)
    assert torch.equal(c.to_dense()[0], token_mask(10, 30, 4, lambda i, j: True, causal=True))
    loc = S.local(10, 30, 4, window=0)
    with pytest.raises(ValueError, match="causal"):
        _ = c | loc
    both = loc.with_causal() | S.strided(10, 30, 4, stride=2).with_causal()
    assert both.causal
    with pytest.raises(ValueError, match="block_size"):
        _ = loc | S.local(10, 30, 2)


def test_random_per_head_density_and_seed():
    a = S.random(256, 256, 8, density=0.3, nheads=4, seed=3)
    assert a.shape == (4, 32, 32)
    assert 0.25 < a.density() < 0.35
    assert torch.equal(a.blocks, S.random(256, 256, 8, density=0.3, nheads=4, seed=3).blocks)
    assert not torch.equal(a.blocks[0], a.blocks[1])
    # Union with a one-head pattern broadcasts over heads; the token mask follows per head.
    u = a | S.local(256, 256, 8, window=0)
    assert u.shape == (4, 32, 32)
    dense = u.to_dense()
    for h in range(4):
        ref = token_mask(256, 256, 8, lambda i, j, h=h: bool(a.blocks[h, i, j]) or i == j)
        assert torch.equal(dense[h], ref)


def test_intersection_and_make_layout():
    x = S.make_layout(["local", "global_local", "causal"], 40, 40, 4, window=1, n_global=1)
    ref = token_mask(40, 40, 4, lambda i, j: abs(i - j) <= 1 or i < 1 or j < 1, causal=True)
    assert x.causal and torch.equal(x.to_dense()[0], ref)
    inter = S.local(40, 40, 4, window=3) & S.strided(40, 40, 4, stride=2, local=False)
    ref = token_mask(40, 40, 4, lambda i, j: abs(i - j) <= 3 and (i - j) % 2 == 0)
    assert torch.equal(inter.to_dense()[0], ref)
    with pytest.raises(ValueError, match="unknown block-sparse pattern"):
        S.make_layout("diagonal", 40, 40, 4)
    with pytest.raises(ValueError, match="unknown options"):
        S.make_layout("local", 40, 40, 4, windw=2)


def test_picture_and_bad_layout():
    lay = S.local(24, 24, 8, window=0).with_causal()
    text = str(lay)
    assert text.splitlines()[1:] == ["\\..", ".\\.", "..\\"]
    assert "density=0.3333" in text
    assert "#" in str(S.full(16, 16, 8))
    with pytest.raises(ValueError, match=r"\(1, 2, 2\)"):
        S.BlockSparseLayout(torch.ones(1, 3, 2, dtype=torch.bool), 8, 16, 16)
    with pytest.raises(TypeError, match="bool"):
        S.BlockSparseLayout(torch.ones(1, 2, 2), 8, 16, 16)
