"""The warp-specialised forward of kernels/flash.py (WARP_SPEC, `_fwd_ws`) and the launcher's choice of it.

On the CPU: which launches may take it (`_fwd_kind`: never under the interpreter, never at head dims other than
128, never with dropout or with inputs its TMA views cannot read; the sm_90 platform is simulated where the
logic needs it), its configs, and its loop's arithmetic, forced on under the interpreter (which runs the same
code without warp specialisation). On an sm_90 GPU (`gpu` tests): outputs, LSE and gradients of the forced WS
path against a float64 reference, bounded as in test_flash.py by 2x (outputs, LSE) / 3x (gradients) the error
of plain PyTorch in the same dtype plus a floor; WS on vs off on the same inputs; reruns bit-identical; and
the automatic choice with FLASH_AUTOTUNE=0.
"""

import math

import pytest
import torch

import kernels.flash as F
from kernels.standard import standard_attention
from tests.test_flash import FLOOR, _maxerr as _err
WS_GPU = (torch.cuda.is_available() and not F._interpreting() and F._WS_TRITON
          and torch.cuda.get_device_capability() == (9, 0))
ws_gpu = pytest.mark.skipif(not WS_GPU, reason="needs an sm_90 GPU and Triton >= 3.6")
interpreter_only = pytest.mark.skipif(not F._interpreting(), reason="checks the Triton interpreter's path")


@pytest.fixture(autouse=True)
def fixed_configs(monkeypatch):
    # Fixed configs unless a test says otherwise: the WS config is then the one under test, and the GPU tests
    # do not tune every shape they touch.
    monkeypatch.setenv("FLASH_AUTOTUNE", "0")


@pytest.fixture
def as_if_sm90(monkeypatch):
    """The launcher's view of an sm_90 GPU with Triton >= 3.6, for the selection logic on any machine."""
    monkeypatch.setattr(F, "_ws_platform_unsupported", lambda q: None)


def _qkv(b, nq, nk, h, hk, d, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return mk(b, nq, h, d), mk(b, nk, hk, d), mk(b, nk, hk, d)


def _kind(q, k, v, causal=False, dropout_p=0.0, varlen=False, warp_spec=None):
    return F._fwd_kind(q, k, v, causal, dropout_p, varlen, warp_spec)[0]


# ------------------------------------------------------------------------------------ CPU: the choice


def test_ws_configs():
    ws = [c for c in F._fwd_ws_tuned.configs if c.kwargs.get("WARP_SPEC")]
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in ws] == [(128, 128, 4, 2)]
    # the plain candidates are the same as the plain tuner's; no other tuner has a WS config
    assert len(F._fwd_ws_tuned.configs) == len(F._fwd_tuned.configs) + 1
    for tuner in (F._fwd_tuned, F._dkdv_tuned, F._dq_tuned):
        assert not any("WARP_SPEC" in c.kwargs for c in tuner.configs)
    assert F.fallback_configs(128)["fwd_ws"] == (128, 128, 4, 2)
    assert "fwd_ws" not in F.fallback_configs(64) and "fwd_ws" not in F.fallback_configs(256)
    assert all(len(s) == 4 for s in F._FWD_SHAPES)  # scripts/kernel_resources.py and tune_flash.py unpack them


def test_wide_only_configs_are_tuned_above_head_dim_128_only():
    import kernels.flash as F

    tuned = F._fwd_tuned.configs
    shape = lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
    wide = set(F._FWD_WIDE_SHAPES) - set(F._FWD_SHAPES)
    at = {d: {shape(c) for c in F._prune(tuned, {}, BLOCK_D=d)} for d in (64, 128, 256)}
    assert wide and wide <= at[256] and not wide & (at[64] | at[128])
    assert (128, 128, 8, 2) in at[128] and (128, 128, 8, 2) not in at[256]  # too large a tile at 256
    assert F.tuning_shapes("fwd", 256) == [*F._FWD_SHAPES, *F._FWD_WIDE_SHAPES]
    assert F.tuning_shapes("fwd", 128) == F._FWD_SHAPES and F.tuning_shapes("dkdv", 256) == F._DKDV_SHAPES


def test_every_tuner_config_survives_the_tuning_cache_round_trip():
    """Triton's tuning cache (cache_results=True) stores each config's __dict__ and rebuilds it as
    `Config(**d)` in the next process: an extra attribute on a config made every second run crash."""
    import json

    import triton

    import kernels.flash as F

    for tuner in (F._fwd_tuned, F._fwd_ws_tuned, F._dkdv_tuned, F._fused_tuned, F._dq_tuned):
        for c in tuner.configs:
            again = triton.Config(**json.loads(json.dumps(c.__dict__)))
            assert again == c and str(again) == str(c)


@pytest.mark.gpu
def test_autotuned_launch_reads_its_tuning_cache_in_a_new_process(tmp_path):
    """The round trip above, for real: a second process reads the first one's tuning results from Triton's cache
    (the path that raised TypeError with the extra config attribute, and that GPU tests with FLASH_AUTOTUNE=0
    never take)."""
    import os
    import subprocess
    import sys

    # every tuner: head dim 64 (forward, dK/dV, dQ), 128 (the warp-specialised forward's), 32 with dropout (the
    # fused backward's, which resets its dQ buffer between tuning runs)
    code = ("import torch; from kernels.flash import flash_attn_func\n"
            "for d, p in ((64, 0.0), (128, 0.0), (32, 0.1)):\n"
            "    q, k, v = (torch.randn(1, 256, 2, d, device='cuda', dtype=torch.float16, requires_grad=True)"
            " for _ in range(3))\n"
            "    flash_attn_func(q, k, v, dropout_p=p, causal=True).sum().backward()\n"
            "torch.cuda.synchronize(); print('ok')")
    env = {**os.environ, "FLASH_AUTOTUNE": "1", "TRITON_CACHE_DIR": str(tmp_path)}
    for run in ("tunes and writes the cache", "reads it"):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"{run}: {r.stderr[-2000:]}"
        assert list(tmp_path.rglob("*.autotune.json")), run


@pytest.mark.parametrize("autotune", ["0", "1"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [32, 64, 96, 128, 256])
def test_ws_never_under_interpreter_or_other_head_dims(headdim, causal, autotune, monkeypatch):
    monkeypatch.setenv("FLASH_AUTOTUNE", autotune)
    q, k, v = _qkv(2, 40, 40, 2, 1, headdim, torch.float16)
    if F._interpreting():
        assert "interpreter" in F._ws_platform_unsupported(q)
        assert _kind(q, k, v, causal) == "fwd"
    monkeypatch.setattr(F, "_ws_platform_unsupported", lambda q: None)  # as if on an sm_90 GPU
    if headdim != 128:
        assert "head dim" in F._ws_unsupported(q, k, v, 0.0, False)
        assert _kind(q, k, v, causal) == "fwd"
        with pytest.raises(ValueError, match="head dim"):
            _kind(q, k, v, causal, warp_spec=True)
    else:
        # tuning: the tuner with the WS candidate; fixed configs: WS for non-causal only
        want = "fwd_ws" if autotune == "1" or not causal else "fwd"
        assert _kind(q, k, v, causal) == want
        assert _kind(q, k, v, causal, dropout_p=0.1) == "fwd"
        assert _kind(q, k, v, causal, warp_spec=False) == "fwd"
        assert _kind(q, k, v, causal, warp_spec=True) == "fwd_ws"
        if autotune == "1":
            assert F._fwd_kind(q, k, v, causal, 0.0, False, None)[1] is F._fwd_ws_tuned


def test_ws_needs_readable_2d_views(as_if_sm90):
    b, n, h, d = 2, 64, 4, 128
    q, k, v = _qkv(b, n, n, h, h, d)
    assert F._ws_unsupported(q, k, v, 0.0, False) is None
    # views of a fused projection (batch, seq, 3, heads, headdim): rows 3 x heads x headdim apart
    qkv = torch.randn(b, n, 3, h, d, dtype=torch.bfloat16)
    assert F._ws_unsupported(*qkv.unbind(2), 0.0, False) is None
    # packed (varlen) tokens
    assert F._ws_unsupported(q[0], k[0], v[0], 0.0, True) is None
    bad = {
        "heads not side by side": torch.randn(b, h, n, d, dtype=torch.bfloat16).transpose(1, 2),
        "batches not side by side": torch.randn(b, 2 * n, h, d, dtype=torch.bfloat16)[:, :n],
        "16-byte": torch.randn(b * n * h * d + 1, dtype=torch.bfloat16)[1:].view(b, n, h, d),
    }
    for words, t in bad.items():
        for args in ((t, k, v), (q, t, v), (q, k, t)):
            assert words in F._ws_unsupported(*args, 0.0, False)
            assert _kind(*args) == "fwd"
            with pytest.raises(ValueError, match=words):
                _kind(*args, warp_spec=True)
    broadcast_k = k[:1, :1].expand(1, n, h, d)  # a row stride of 0
    assert "16-byte" in F._ws_unsupported(q[:1], broadcast_k, v[:1], 0.0, False)
    with pytest.raises(ValueError, match="dropout"):
        _kind(q, k, v, dropout_p=0.1, warp_spec=True)


@interpreter_only
@pytest.mark.parametrize("causal", [False, True])
def test_interpreter_launches_never_warp_specialise(causal, monkeypatch):
    from triton.runtime import _allocation

    kinds = []
    launch_config = F._launch_config  # asked once per launch of a plan: four plans here
    monkeypatch.setattr(F, "_launch_config", lambda kind, *a: (kinds.append(kind), launch_config(kind, *a))[1])
    monkeypatch.setenv("FLASH_AUTOTUNE", "1")
    for dtype in (torch.float32, torch.float16):
        q, k, v = _qkv(1, 20, 20, 2, 1, 128, dtype)
        F.flash_attn_func(q, k, v, causal=causal)
        cu = torch.tensor([0, 7, 20], dtype=torch.int32)
        F.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 13, 13, causal=causal)
    assert kinds == ["fwd"] * 4
    assert isinstance(_allocation._allocator.get(), _allocation.NullAllocator)  # no allocator set either


# ------------------------------------------------------------------------------------ the WS loop's values


def _fwd_bwd(q, k, v, do, causal, warp_spec, cu=None, max_len=None):
    """(out, natural-log LSE, (dq, dk, dv)): the forward with warp_spec, the (unchanged) backward from its O and
    LSE, so the gradients also check what the backward reads from the WS forward."""
    varlen = cu is not None
    mq, mk = (max_len, max_len) if varlen else (q.shape[1], k.shape[1])
    scale = q.shape[-1] ** -0.5
    o, lse2, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, varlen, cu, cu, mq, mk, warp_spec=warp_spec)
    grads = F._flash_bwd(do, q, k, v, o, lse2, seed, scale, causal, 0.0, varlen, cu, cu, mq, mk)
    return o, lse2 * F.LN2, grads


def _reference(q, k, v, do, causal):
    """(out, lse, grads) of plain PyTorch attention on q's dtype and (the same) in float64."""
    res = []
    for dt in (q.dtype, torch.float64):
        qr, kr, vr = (x.detach().to(dt).requires_grad_() for x in (q, k, v))
        out, lse = standard_attention(qr, kr, vr, causal=causal, return_lse=True)
        res.append((out, lse, torch.autograd.grad(out, (qr, kr, vr), do.to(dt))))
    return res


def check_ws(q, k, v, causal, seed=0):
    """The forced WS forward (and the backward from it) against float64, bounded by plain PyTorch's error."""
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.device, q.dtype)
    out, lse, grads = _fwd_bwd(q, k, v, do, causal, True)
    (b_out, b_lse, b_grads), (r_out, r_lse, r_grads) = _reference(q, k, v, do, causal)
    floor = FLOOR[q.dtype]
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert _err(out, r_out) <= 2 * _err(b_out, r_out) + floor, (_err(out, r_out), _err(b_out, r_out))
    empty = torch.isinf(r_lse)
    assert torch.equal(torch.isinf(lse), empty) and (lse[empty] < 0).all()
    if (~empty).any():
        e, be = _err(lse[~empty], r_lse[~empty]), _err(b_lse[~empty], r_lse[~empty])
        assert e <= 2 * be + floor, (e, be)
    for name, g, bg, rg in zip("qkv", grads, b_grads, r_grads):
        assert not torch.isnan(g).any(), name
        assert _err(g, rg) <= 3 * _err(bg, rg) + floor, (name, _err(g, rg), _err(bg, rg))
    return out, lse


@interpreter_only
@pytest.mark.parametrize("case", [
    (2, 37, 37, 2, 1, False), (1, 40, 71, 2, 2, False), (2, 37, 50, 2, 1, True), (1, 50, 21, 2, 1, True),
], ids=lambda c: "x".join(map(str, c)))
def test_ws_loop_arithmetic_under_interpreter(case):
    """`_fwd_ws`'s indexing and masks (ragged ends, GQA, causal with seqlen_q != seqlen_k, rows that see no
    key), run by the interpreter: the values the GPU's specialised loop must reproduce."""
    b, nq, nk, h, hk, causal = case
    q, k, v = _qkv(b, nq, nk, h, hk, 128, torch.float32)
    out, lse = check_ws(q, k, v, causal)
    plain, plain_lse, _ = F._flash_fwd(q, k, v, 128 ** -0.5, causal, 0.0, False, None, None, nq, nk, warp_spec=False)
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(lse, plain_lse * F.LN2, atol=1e-6, rtol=0)


@interpreter_only
@pytest.mark.parametrize("causal", [False, True])
def test_ws_loop_varlen_under_interpreter(causal):
    lengths = [5, 40, 0, 17, 33]  # an empty sequence, one longer than a 16-row tile pair
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (x[0] for x in _qkv(1, sum(lengths), sum(lengths), 2, 1, 128, torch.float32))
    do = torch.randn(q.shape)
    ws = _fwd_bwd(q, k, v, do, causal, True, cu, max(lengths))
    plain = _fwd_bwd(q, k, v, do, causal, False, cu, max(lengths))
    for a, p in zip((ws[0], ws[1], *ws[2]), (plain[0], plain[1], *plain[2])):
        torch.testing.assert_close(a, p, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------ GPU (sm_90) only

GPU_CASES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k, causal)
    (2, 1024, 1024, 4, 4, False), (2, 1000, 1000, 4, 2, False), (3, 129, 257, 2, 2, False),
    (2, 1024, 1024, 4, 4, True), (2, 1000, 1000, 4, 2, True), (1, 300, 1000, 2, 1, True),
    (1, 1000, 300, 2, 2, True),  # seqlen_q > seqlen_k: the first 700 rows see no key
]


@pytest.mark.gpu
@ws_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gpu_ws_matches_reference(case, dtype):
    b, nq, nk, h, hk, causal = case
    check_ws(*_qkv(b, nq, nk, h, hk, 128, dtype, "cuda"), causal)


@pytest.mark.gpu
@ws_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ws_varlen_matches_reference(causal):
    lengths = [1, 513, 0, 77, 1024, 300]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = (x[0] for x in _qkv(1, sum(lengths), sum(lengths), 8, 2, 128, torch.bfloat16, "cuda"))
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    out, lse, grads = _fwd_bwd(q, k, v, do, causal, True, cu, max(lengths))
    floor = FLOOR[q.dtype]
    for i in range(len(lengths)):
        s = slice(int(cu[i]), int(cu[i + 1]))
        if s.start == s.stop:
            continue
        (b_out, b_lse, b_grads), (r_out, r_lse, r_grads) = _reference(q[s][None], k[s][None], v[s][None],
                                                                      do[s][None], causal)
        assert _err(out[s], r_out[0]) <= 2 * _err(b_out[0], r_out[0]) + floor, i
        assert _err(lse[:, s], r_lse[0]) <= 2 * _err(b_lse[0], r_lse[0]) + floor, i
        for g, bg, rg in zip(grads, b_grads, r_grads):
            assert _err(g[s], rg[0]) <= 3 * _err(bg[0], rg[0]) + floor, i


@pytest.mark.gpu
@ws_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 8, 2), (4, 4096, 16, 16)], ids=["1000", "4096"])
def test_gpu_ws_on_vs_off_and_reruns(shape, causal):
    """Same inputs through both paths: equal to bf16 rounding (different tiles, so not bit-equal); WS reruns
    bit-identical (a race between its producer and consumer warps would show here); a fused projection's
    strided views give exactly what their contiguous copies give."""
    b, n, h, hk = shape
    q, k, v = _qkv(b, n, n, h, hk, 128, torch.bfloat16, "cuda")
    scale = 128 ** -0.5

    def fwd(q, k, v, ws):
        return F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n, warp_spec=ws)

    on, on_lse, _ = fwd(q, k, v, True)
    off, off_lse, _ = fwd(q, k, v, False)
    assert not torch.isnan(on).any()
    # Non-causal outputs are ~0.03 (a bf16 step ~1e-4; a wrong tile or head would be off by ~1e-2). Causal ones
    # reach ~1 in the first rows, which see few keys, where a bf16 step is ~4e-3 (measured on the H100: up to
    # 1.2e-3 apart); the value tests against float64 (test_gpu_ws_matches_reference) hold both to the reference.
    torch.testing.assert_close(on.float(), off.float(), rtol=2e-2, atol=4e-3 if causal else 2e-4)
    fin = ~torch.isinf(off_lse)
    assert torch.equal(torch.isinf(on_lse), ~fin)
    assert (on_lse[fin] - off_lse[fin]).abs().max().item() <= 1e-4
    for _ in range(3):
        again, again_lse, _ = fwd(q, k, v, True)
        assert torch.equal(again, on) and torch.equal(again_lse, on_lse)
    if h == hk:
        qkv = torch.stack((q, k, v), dim=2)  # (b, n, 3, h, d)
        strided, strided_lse, _ = fwd(*qkv.unbind(2), True)
        assert torch.equal(strided, on) and torch.equal(strided_lse, on_lse)


@pytest.mark.gpu
@ws_gpu
def test_gpu_ws_chosen_automatically():
    """FLASH_AUTOTUNE=0 on sm_90: the public function takes the WS path non-causal, the two-stage one causal,
    with dropout and for inputs whose TMA views cannot be made; the descriptors' allocator is installed."""
    from triton.runtime import _allocation

    q, k, v = _qkv(2, 1000, 1000, 4, 2, 128, torch.bfloat16, "cuda")
    scale = 1.0 / math.sqrt(128)  # flash_attn_func's default, to the bit

    def forced(q, k, v, causal, ws, p=0.0):
        torch.manual_seed(3)
        return F._flash_fwd(q, k, v, scale, causal, p, False, None, None, q.shape[1], k.shape[1], warp_spec=ws)[0]

    assert torch.equal(F.flash_attn_func(q, k, v), forced(q, k, v, False, True))
    assert not isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    assert torch.equal(F.flash_attn_func(q, k, v, causal=True), forced(q, k, v, True, False))
    torch.manual_seed(3)
    assert torch.equal(F.flash_attn_func(q, k, v, dropout_p=0.1), forced(q, k, v, False, False, 0.1))
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # heads not side by side: no 2-D view
    assert torch.equal(F.flash_attn_func(qt, k, v), forced(qt, k, v, False, False))
