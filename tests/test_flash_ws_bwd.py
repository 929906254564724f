"""The warp-specialised backward of kernels/flash.py (WARP_SPEC in the dK/dV and dQ kernels: `_dkdv_ws`, `_dq_ws`).

On the CPU: which backward launches may take it (`_bwd_kinds`, the forward's conditions plus a TMA-readable dO;
the sm_90 platform simulated where the logic needs it) and its loops' arithmetic, forced on under the interpreter
(the same code without warp specialisation) against the two-stage loops. On an sm_90 GPU (`gpu` tests): the
gradients of the forced WS backward against a float64 reference, bounded by 3x plain PyTorch's error in the same
dtype plus a floor (tests/test_flash.py), dense, GQA, causal with seqlen_q != seqlen_k and varlen; on vs off;
reruns bit-identical.
"""
import pytest
import torch

import kernels.flash as F
from tests.test_flash import FLOOR, _maxerr as _err
from tests.test_flash_ws import _qkv, _reference, interpreter_only, ws_gpu


@pytest.fixture(autouse=True)
def fixed_configs(monkeypatch):
    monkeypatch.setenv("FLASH_AUTOTUNE", "0")


def _grads(q, k, v, do, causal, warp_spec, cu=None, max_len=None):
    """(dq, dk, dv) of the plain forward's O and LSE through the backward with warp_spec."""
    varlen = cu is not None
    mq, mk = (max_len, max_len) if varlen else (q.shape[1], k.shape[1])
    scale = q.shape[-1] ** -0.5
    o, lse2, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, varlen, cu, cu, mq, mk, warp_spec=False)
    return F._flash_bwd(do, q, k, v, o, lse2, seed, scale, causal, 0.0, varlen, cu, cu, mq, mk, warp_spec=warp_spec)


def _kinds(q, k, v, do, dropout_p=0.0, warp_spec=None):
    return tuple(kind for kind, _ in F._bwd_kinds(q, k, v, do, dropout_p, False, warp_spec))


# ------------------------------------------------------------------------------------ CPU: the choice


def test_ws_bwd_configs():
    for tuner, plain, ws in ((F._dkdv_ws_tuned, F._dkdv_tuned, F._DKDV_WS_SHAPES),
                             (F._dq_ws_tuned, F._dq_tuned, F._DQ_WS_SHAPES)):
        found = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in tuner.configs
                 if c.kwargs.get("WARP_SPEC")]
        assert found == ws and all(w == 4 and s == 2 for _, _, w, s in ws)  # 3 stages gave NaN in the forward
        assert len(tuner.configs) == len(plain.configs) + len(ws)
    assert F.fallback_configs(128)["dkdv_ws"] == F._DKDV_WS_SHAPES[0]
    assert F.fallback_configs(128)["dq_ws"] == F._DQ_WS_SHAPES[0]


@pytest.mark.parametrize("autotune", ["0", "1"])
def test_ws_bwd_choice(autotune, monkeypatch):
    monkeypatch.setenv("FLASH_AUTOTUNE", autotune)
    q, k, v = _qkv(2, 64, 64, 4, 2, 128)
    do = torch.randn(q.shape, dtype=q.dtype)
    if F._interpreting():
        assert _kinds(q, k, v, do) == ("dkdv", "dq")
    monkeypatch.setattr(F, "_ws_platform_unsupported", lambda q: None)  # as if on an sm_90 GPU
    assert _kinds(q, k, v, do) == (("dkdv_ws", "dq_ws") if autotune == "1" else ("dkdv", "dq"))
    if autotune == "1":
        assert [t for _, t in F._bwd_kinds(q, k, v, do, 0.0, False, None)] == [F._dkdv_ws_tuned, F._dq_ws_tuned]
    assert _kinds(q, k, v, do, warp_spec=True) == ("dkdv_ws", "dq_ws")
    assert _kinds(q, k, v, do, warp_spec=False) == ("dkdv", "dq")
    assert _kinds(q, k, v, do, dropout_p=0.1) == ("dkdv", "dq")
    with pytest.raises(ValueError, match="dropout"):
        _kinds(q, k, v, do, dropout_p=0.1, warp_spec=True)
    strided_do = torch.randn(2, 4, 64, 128, dtype=q.dtype).transpose(1, 2)  # heads not side by side
    assert _kinds(q, k, v, strided_do) == ("dkdv", "dq")
    with pytest.raises(ValueError, match="do: heads not side by side"):
        _kinds(q, k, v, strided_do, warp_spec=True)
    q64, k64, v64 = _qkv(2, 64, 64, 4, 2, 64)
    assert _kinds(q64, k64, v64, torch.randn(q64.shape, dtype=q.dtype)) == ("dkdv", "dq")


# ------------------------------------------------------------------------------------ the WS loops' values


@interpreter_only
@pytest.mark.parametrize("case", [
    (2, 37, 37, 2, 1, False), (1, 40, 71, 2, 2, False), (2, 37, 50, 4, 2, True), (1, 50, 21, 2, 1, True),
], ids=lambda c: "x".join(map(str, c)))
def test_ws_bwd_arithmetic_under_interpreter(case):
    """`_dkdv_ws` / `_dq_ws` indexing and masks (ragged ends, GQA's flat head x tile loop, causal with
    seqlen_q != seqlen_k, rows that see no key) equal the two-stage loops', run by the interpreter."""
    b, nq, nk, h, hk, causal = case
    q, k, v = _qkv(b, nq, nk, h, hk, 128, torch.float32)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    for ws, plain in zip(_grads(q, k, v, do, causal, True), _grads(q, k, v, do, causal, False)):
        torch.testing.assert_close(ws, plain, atol=1e-5, rtol=0)


@interpreter_only
@pytest.mark.parametrize("causal", [False, True])
def test_ws_bwd_varlen_under_interpreter(causal):
    lengths = [5, 40, 0, 17, 33]  # an empty sequence, one longer than a 16-row tile pair
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (x[0] for x in _qkv(1, sum(lengths), sum(lengths), 2, 1, 128, torch.float32))
    do = torch.randn(q.shape)
    ws = _grads(q, k, v, do, causal, True, cu, max(lengths))
    plain = _grads(q, k, v, do, causal, False, cu, max(lengths))
    for a, p in zip(ws, plain):
        torch.testing.assert_close(a, p, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------ GPU (sm_90) only

GPU_CASES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k, causal)
    (2, 1024, 1024, 4, 4, False), (2, 1000, 1000, 4, 2, False), (3, 129, 257, 2, 2, False),
    (2, 1024, 1024, 4, 4, True), (2, 1000, 1000, 4, 2, True), (1, 300, 1000, 2, 1, True),
    (1, 1000, 300, 2, 2, True),  # seqlen_q > seqlen_k: the first 700 rows see no key
]


def check_ws_bwd(q, k, v, causal, seed=0):
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.device, q.dtype)
    grads = _grads(q, k, v, do, causal, True)
    (_, _, b_grads), (_, _, r_grads) = _reference(q, k, v, do, causal)
    floor = FLOOR[q.dtype]
    for name, g, bg, rg in zip("qkv", grads, b_grads, r_grads):
        assert not torch.isnan(g).any(), name
        assert _err(g, rg) <= 3 * _err(bg, rg) + floor, (name, _err(g, rg), _err(bg, rg))
    return do, grads


@pytest.mark.gpu
@ws_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gpu_ws_bwd_matches_reference(case, dtype):
    b, nq, nk, h, hk, causal = case
    check_ws_bwd(*_qkv(b, nq, nk, h, hk, 128, dtype, "cuda"), causal)


@pytest.mark.gpu
@ws_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ws_bwd_varlen_matches_reference(causal):
    lengths = [1, 513, 0, 77, 1024, 300]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = (x[0] for x in _qkv(1, sum(lengths), sum(lengths), 8, 2, 128, torch.bfloat16, "cuda"))
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    grads = _grads(q, k, v, do, causal, True, cu, max(lengths))
    floor = FLOOR[q.dtype]
    for i in range(len(lengths)):
        s = slice(int(cu[i]), int(cu[i + 1]))
        if s.start == s.stop:
            continue
        (_, _, b_grads), (_, _, r_grads) = _reference(q[s][None], k[s][None], v[s][None], do[s][None], causal)
        for g, bg, rg in zip(grads, b_grads, r_grads):
            assert _err(g[s], rg[0]) <= 3 * _err(bg[0], rg[0]) + floor, i


@pytest.mark.gpu
@ws_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ws_bwd_on_vs_off_and_reruns(causal):
    q, k, v = _qkv(2, 2048, 2048, 8, 2, 128, torch.bfloat16, "cuda")
    do, on = check_ws_bwd(q, k, v, causal)
    off = _grads(q, k, v, do, causal, False)
    for a, b in zip(on, off):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(_grads(q, k, v, do, causal, True), on))
