"""The Gluon forward (kernels/flash_gluon.py) and kernels/flash.py's choice of it.

On the CPU: which calls it takes (`_gluon_unsupported`; the sm_90 platform simulated), that `_flash_fwd` hands
them to it with the launcher's scale and returns what it wrote, that forced kernel choices (warp_spec) bypass it,
and that it compiles for sm_90 without spills (the interpreter cannot run Gluon). On an sm_90 GPU: outputs, LSE
and the gradients of the backward that reads them against float64, bounded as in test_flash.py; against the
`@triton.jit` forward on the same inputs; reruns bit-identical; packed-qkv views; the automatic choice.
"""

import pytest
import torch

import kernels.flash as F
from tests.test_flash_ws import WS_GPU, _qkv, check_ws
from tests.test_kernel_resources import compile_sm90, needs_cuobjdump

gluon_gpu = pytest.mark.skipif(not (WS_GPU and F._GLUON_TRITON), reason="needs an sm_90 GPU and Triton 3.6")


@pytest.fixture
def as_if_sm90(monkeypatch):
    """The launcher's view of an sm_90 GPU with Triton 3.6, for the selection logic on any machine."""
    monkeypatch.setattr(F, "_ws_platform_unsupported", lambda q: None)
    monkeypatch.setattr(F, "_GLUON_TRITON", True)
    monkeypatch.setattr(F, "GLUON_FORWARD", True)


def _why(q, k, v, causal=False, dropout_p=0.0, varlen=False, out_dtype=None):
    return F._gluon_unsupported(q, k, v, causal, dropout_p, varlen, out_dtype)


# ------------------------------------------------------------------------------------ CPU: the choice


@pytest.fixture
def any_length(monkeypatch):
    """Gluon at every multiple of 128, not only where it is the faster forward: the short cases test its first
    and last key tiles, its one-tile programs and its causal edges."""
    from kernels import flash_gluon

    monkeypatch.setattr(flash_gluon, "MIN_SEQLEN", {False: 0, True: 0})


def test_gluon_scope(as_if_sm90, monkeypatch):
    q, k, v = _qkv(1, 2048, 2048, 4, 2, 128)
    assert _why(q, k, v) is None and _why(q, k, v, causal=True) is None
    assert _why(*torch.randn(1, 2048, 3, 4, 128, dtype=torch.bfloat16).unbind(2)) is None  # packed qkv views
    assert _why(q[:, :1024], k[:, :1024], v[:, :1024]) is None
    assert "below 2048 causal" in _why(q[:, :1024], k[:, :1024], v[:, :1024], causal=True)
    assert "below 1024" in _why(q[:, :512], k[:, :512], v[:, :512])
    q, k, v = _qkv(1, 1024, 1024, 4, 2, 128)
    cases = {
        "head dim 64": _qkv(1, 1024, 1024, 4, 4, 64),
        "not a multiple of 128": _qkv(1, 1000, 1000, 4, 4, 128),
        "seqlen_q != seqlen_k": _qkv(1, 1024, 2048, 4, 4, 128),
        "float32": _qkv(1, 1024, 1024, 4, 4, 128, torch.float32),
        "heads not side by side": (q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
    }
    for words, args in cases.items():
        assert words in _why(*args), words
    assert "dropout" in _why(q, k, v, dropout_p=0.1)
    assert "varlen" in _why(q[0], k[0], v[0], varlen=True)
    assert "output dtype" in _why(q, k, v, out_dtype=torch.float32)
    assert _why(q, k, v, out_dtype=torch.bfloat16) is None
    monkeypatch.setattr(F, "GLUON_FORWARD", False)
    assert "FLASH_GLUON=0" in _why(q, k, v)
    monkeypatch.setattr(F, "GLUON_FORWARD", True)
    monkeypatch.setattr(F, "_GLUON_TRITON", False)
    assert "Triton" in _why(q, k, v)


def test_gluon_never_on_this_platform_without_sm90():
    q, k, v = _qkv(2, 256, 256, 4, 4, 128)
    if not WS_GPU:
        assert _why(q, k, v) is not None  # the interpreter, or no sm_90 GPU: the @triton.jit forward runs


def test_flash_fwd_hands_supported_calls_to_gluon(as_if_sm90, any_length, monkeypatch):
    """`_flash_fwd` gives the Gluon forward q, k, v, fresh O and LSE and scale * log2(e), and returns what it
    wrote; forced kernel choices (warp_spec True / False, as tests and A/Bs ask) never reach it."""
    from kernels import flash_gluon

    calls = []

    def fake(q, k, v, o, lse, qk_scale, causal):
        calls.append((qk_scale, causal, o.shape, o.dtype, lse.shape))
        o.fill_(1.0)
        lse.fill_(2.0)

    monkeypatch.setattr(flash_gluon, "gluon_forward", fake)
    monkeypatch.setattr(F, "_ensure_tma_allocator", lambda: None)
    q, k, v = _qkv(2, 256, 256, 4, 2, 128, torch.float16)
    o, lse, _ = F._flash_fwd(q, k, v, 0.125, True, 0.0, False, None, None, 256, 256)
    assert calls == [(0.125 * F.LOG2E, True, q.shape, q.dtype, (2, 4, 256))]
    assert (o == 1).all() and (lse == 2).all()
    if F._interpreting():  # the forced paths launch the @triton.jit kernels, which only the interpreter runs here
        for forced in (False, True):
            F._flash_fwd(q[:1, :32].float(), k[:1, :32].float(), v[:1, :32].float(), 0.125, False, 0.0, False,
                         None, None, 32, 32, warp_spec=forced)
        assert len(calls) == 1


def _compile_gluon_sm90(dtype: str, causal: bool) -> dict:
    """resources(kernels.flash_gluon._fwd_kernel) for sm_90, with the launcher's constexprs."""
    setup = ("import kernels.flash_gluon as G; from triton.experimental.gluon import language as gl; "
             f"lay = lambda r: gl.NVMMASharedLayout.get_default_for([r, G.HEAD_DIM], gl.{dtype})")
    consts = ("dict(HEAD_DIM=G.HEAD_DIM, BLOCK_M=G.BLOCK_M, BLOCK_N=G.BLOCK_N, STAGES=G.STAGES, "
              f"IS_CAUSAL={causal}, q_layout=lay(G.BLOCK_M // 2), kv_layout=lay(G.BLOCK_N), "
              "CONSUMER_REGS=G.CONSUMER_REGS)")
    return compile_sm90("G._fwd_kernel", consts, 4, 3, setup)


@needs_cuobjdump
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_forward_compiles_for_sm90_without_spills(causal):
    r = _compile_gluon_sm90("bfloat16", causal)
    assert r["stack"] == 0, r  # a spill in the consumers' 240 registers would cost the ping-pong its point
    # Q's two halves and a 3-deep K/V ring of 128 x 128 bf16 tiles fit, within an H100's 227 KB per block
    assert 2 * 64 * 128 * 2 + 3 * 2 * 128 * 128 * 2 <= r["smem"] <= 232448
    assert r["ops"].get("HGMMA", 0) > 0 and r["ops"].get("SYNCS", 0) + r["ops"].get("UTMALDG", 0) > 0, r["ops"]


# ------------------------------------------------------------------------------------ GPU (sm_90) only

GPU_CASES = [  # (batch, seqlen, nheads, nheads_k, causal)
    (2, 1024, 4, 4, False), (2, 1024, 4, 4, True), (2, 512, 8, 2, False), (1, 384, 8, 2, True),
    (3, 128, 2, 1, True), (1, 2048, 2, 2, True),
]


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gpu_gluon_matches_reference(case, dtype, any_length, monkeypatch):
    """check_ws's bounds (outputs and LSE 2x plain PyTorch's error, gradients 3x, plus a floor), with the Gluon
    forward: check_ws forces warp_spec=True, so it is pointed at the automatic choice here."""
    b, n, h, hk, causal = case
    q, k, v = _qkv(b, n, n, h, hk, 128, dtype, "cuda")
    assert _why(q, k, v, causal) is None
    flash_fwd = F._flash_fwd
    monkeypatch.setattr(F, "_flash_fwd", lambda *a, warp_spec=None, **kw: flash_fwd(*a, **kw))
    check_ws(q, k, v, causal)


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_vs_triton_reruns_and_packed_views(causal, any_length):
    b, n, h, hk = 2, 2048, 16, 4
    q, k, v = _qkv(b, n, n, h, hk, 128, torch.bfloat16, "cuda")

    def fwd(q, k, v, ws=None):
        return F._flash_fwd(q, k, v, 128 ** -0.5, causal, 0.0, False, None, None, n, n, warp_spec=ws)

    gl_o, gl_lse, _ = fwd(q, k, v)
    tr_o, tr_lse, _ = fwd(q, k, v, False)
    assert not torch.isnan(gl_o).any()
    # as test_gpu_ws_on_vs_off_and_reruns: different tiles, equal to bf16 rounding
    torch.testing.assert_close(gl_o.float(), tr_o.float(), rtol=2e-2, atol=4e-3 if causal else 2e-4)
    assert (gl_lse - tr_lse).abs().max().item() <= 1e-4
    for _ in range(3):  # a race between the loader and the consumers, or between the consumers, would show here
        again, again_lse, _ = fwd(q, k, v)
        assert torch.equal(again, gl_o) and torch.equal(again_lse, gl_lse)
    qm, km, vm = _qkv(b, n, n, h, h, 128, torch.bfloat16, "cuda", seed=1)
    packed = torch.stack((qm, km, vm), dim=2)  # (b, n, 3, h, d): rows 3 x h x d apart
    assert torch.equal(fwd(*packed.unbind(2))[0], fwd(qm, km, vm)[0])


@pytest.mark.gpu
@gluon_gpu
def test_gpu_gluon_chosen_automatically():
    from kernels.flash_gluon import gluon_forward

    q, k, v = _qkv(1, 2048, 2048, 4, 2, 128, torch.bfloat16, "cuda")
    o = torch.empty_like(q)
    lse = torch.empty(1, 4, 2048, device="cuda")
    gluon_forward(q, k, v, o, lse, 128 ** -0.5 * F.LOG2E, True)
    assert torch.equal(F.flash_attn_func(q, k, v, causal=True), o)


@pytest.mark.gpu
@gluon_gpu
def test_gpu_gluon_under_cuda_graph_and_compile():
    """The Gluon forward builds its TMA descriptors on the device in scratch from Triton's allocator: a captured
    CUDA graph replays it on new inputs, and torch.compile(fullgraph=True) traces the custom op around it; both
    give the eager result, with the gradients the backward computes from its LSE."""
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2048, 2048, 4, 2, 128, torch.bfloat16, "cuda"))
    assert _why(q, k, v, causal=True) is None
    do = torch.randn_like(q)

    def step(q, k, v):
        out = F.flash_attn_func(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    eager = step(q, k, v)
    out = torch.compile(lambda q, k, v: F.flash_attn_func(q, k, v, causal=True), fullgraph=True)(q, k, v)
    compiled = (out, *torch.autograd.grad(out, (q, k, v), do))
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)

    static = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with torch.no_grad():
        for x in static:
            x.zero_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*static)  # warm-up launches outside the capture (compiles, allocator installed)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*static)
    with torch.no_grad():
        for x, src in zip(static, (q, k, v)):
            x.copy_(src)
    graph.replay()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b)
