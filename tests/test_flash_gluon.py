"""The Gluon forward and backward (kernels/flash_gluon.py) and kernels/flash.py's choice of them.

On the CPU: which calls they take (`_gluon_unsupported`, `_gluon_bwd_unsupported`; the sm_90 platform simulated),
that `_flash_fwd` / `_flash_bwd` hand them to it with the launcher's scale and buffers and return what they wrote,
that forced kernel choices bypass them, and that they compile for sm_90 (the interpreter cannot run Gluon). On an
sm_90 GPU: outputs, LSE and gradients against float64, bounded as in test_flash.py; against the `@triton.jit`
kernels on the same inputs; reruns (bit-identical, but for the backward's dQ, which is summed in a varying order);
packed-qkv views; deterministic mode; the automatic choice; CUDA graphs and torch.compile.
"""

import pytest
import torch

import kernels.flash as F
from tests.test_flash_ws import WS_GPU, _qkv, check_ws
from tests.test_kernel_resources import compile_sm90, needs_cuobjdump
from train.cuda_graph import collector_paused

gluon_gpu = pytest.mark.skipif(not (WS_GPU and F._GLUON_TRITON), reason="needs an sm_90 GPU and Triton 3.6")


@pytest.fixture
def as_if_sm90(monkeypatch):
    """The launcher's view of an sm_90 GPU with Triton 3.6, for the selection logic on any machine."""
    monkeypatch.setattr(F, "_ws_platform_unsupported", lambda q: None)
    monkeypatch.setattr(F, "_GLUON_TRITON", True)
    monkeypatch.setattr(F, "GLUON_KERNELS", True)


def _why(q, k, v, causal=False, dropout_p=0.0, varlen=False, out_dtype=None):
    return F._gluon_unsupported(q, k, v, causal, dropout_p, varlen, out_dtype)


# ------------------------------------------------------------------------------------ CPU: the choice


@pytest.fixture
def any_length(monkeypatch):
    """Gluon at every multiple of 128, not only where it is the faster forward: the short cases test its first
    and last key tiles, its one-tile programs and its causal edges."""
    from kernels import flash_gluon

    monkeypatch.setattr(flash_gluon, "MIN_SEQLEN", dict.fromkeys(flash_gluon.MIN_SEQLEN, 0))
    monkeypatch.setattr(flash_gluon, "FWD_DROPOUT_MIN_SEQLEN", dict.fromkeys(flash_gluon.FWD_DROPOUT_MIN_SEQLEN, 0))
    monkeypatch.setattr(flash_gluon, "BWD_MIN_SEQLEN", dict.fromkeys(flash_gluon.BWD_MIN_SEQLEN, 0))


def test_gluon_scope(as_if_sm90, monkeypatch):
    q, k, v = _qkv(1, 2048, 2048, 4, 2, 128)
    assert _why(q, k, v) is None and _why(q, k, v, causal=True) is None
    assert _why(*torch.randn(1, 2048, 3, 4, 128, dtype=torch.bfloat16).unbind(2)) is None  # packed qkv views
    assert _why(q[:, :1024], k[:, :1024], v[:, :1024]) is None
    assert _why(q[:, :1024], k[:, :1024], v[:, :1024], causal=True) is None
    assert "below 1024" in _why(q[:, :512], k[:, :512], v[:, :512])
    assert "below 1024 causal" in _why(q[:, :512], k[:, :512], v[:, :512], causal=True)
    q, k, v = _qkv(1, 1024, 1024, 4, 2, 128)
    assert _why(*_qkv(1, 512, 512, 4, 2, 256)) is None and _why(*_qkv(1, 512, 512, 4, 2, 256), causal=True) is None
    assert "below 512" in _why(*_qkv(1, 256, 256, 4, 2, 256))
    assert _why(*_qkv(1, 1024, 1024, 4, 2, 64)) is None and _why(*_qkv(1, 1024, 1024, 2, 2, 64), causal=True) is None
    assert "below 1024 causal" in _why(*_qkv(1, 512, 512, 4, 2, 64), causal=True)
    assert "below 1024" in _why(*_qkv(1, 512, 512, 4, 2, 64))
    cases = {
        "head dim 96": _qkv(1, 1024, 1024, 4, 4, 96),
        "not a multiple of 128": _qkv(1, 1000, 1000, 4, 4, 128),
        "seqlen_q != seqlen_k": _qkv(1, 1024, 2048, 4, 4, 128),
        "float32": _qkv(1, 1024, 1024, 4, 4, 128, torch.float32),
        "heads not side by side": (q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
    }
    for words, args in cases.items():
        assert words in _why(*args), words
    assert "dropout at head dim 128" in _why(q, k, v, dropout_p=0.1)  # FWD_DROPOUT_MIN_SEQLEN: 64 only
    gpt2 = _qkv(1, 1024, 1024, 12, 12, 64)
    assert _why(*gpt2, dropout_p=0.1) is None
    assert "below 4096 causal" in _why(*gpt2, causal=True, dropout_p=0.1)  # where the @triton.jit forward is faster
    assert _why(*_qkv(1, 4096, 4096, 2, 2, 64), causal=True, dropout_p=0.1) is None
    assert "varlen" in _why(q[0], k[0], v[0], varlen=True)
    assert "output dtype" in _why(q, k, v, out_dtype=torch.float32)
    assert _why(q, k, v, out_dtype=torch.bfloat16) is None
    monkeypatch.setattr(F, "GLUON_KERNELS", False)
    assert "FLASH_GLUON=0" in _why(q, k, v)
    monkeypatch.setattr(F, "GLUON_KERNELS", True)
    monkeypatch.setattr(F, "_GLUON_TRITON", False)
    assert "Triton" in _why(q, k, v)


def test_gluon_never_on_this_platform_without_sm90():
    q, k, v = _qkv(2, 256, 256, 4, 4, 128)
    if not WS_GPU:
        assert _why(q, k, v) is not None  # the interpreter, or no sm_90 GPU: the @triton.jit forward runs


def test_flash_fwd_hands_supported_calls_to_gluon(as_if_sm90, any_length, monkeypatch):
    """`_flash_fwd` gives the Gluon forward q, k, v, fresh O and LSE and scale * log2(e), with dropout the rate and
    the seed it returns (the backward's mask), and returns what it wrote; its launch is worked out once per call
    geometry (`_gluon_fwd_plan`); forced kernel choices (warp_spec True / False, as tests and A/Bs ask) never reach
    it."""
    from kernels import flash_gluon

    prepared, calls = [], []

    def fake_prepare(q, k, v, o, lse, seed, qk_scale, causal, dropout_p):
        prepared.append((qk_scale, causal, o.shape, o.dtype, lse.shape, dropout_p))

        def run(q, k, v, o, lse, seed):
            calls.append(seed)
            o.fill_(1.0)
            lse.fill_(2.0)
        return run

    monkeypatch.setattr(flash_gluon, "forward_launch", fake_prepare)
    q, k, v = _qkv(2, 256, 256, 4, 2, 128, torch.float16)
    o, lse, seed = F._flash_fwd(q, k, v, 0.125, True, 0.0, False, None, None, 256, 256)
    assert prepared == [(0.125 * F.LOG2E, True, q.shape, q.dtype, (2, 4, 256), 0.0)] and calls == [lse]
    assert (o == 1).all() and (lse == 2).all()
    o2, lse2, _ = F._flash_fwd(*(torch.randn_like(t) for t in (q, k, v)), 0.125, True, 0.0, False, None, None, 256, 256)
    assert len(prepared) == 1 and calls[-1] is lse2 and o2.data_ptr() != o.data_ptr()  # the plan, fresh buffers
    F._flash_fwd(q, k, v, 0.125, False, 0.0, False, None, None, 256, 256)
    assert len(prepared) == 2 and not prepared[-1][1]  # another call geometry: another plan
    q64, k64, v64 = _qkv(1, 256, 256, 2, 2, 64, torch.float16)
    _, _, seed = F._flash_fwd(q64, k64, v64, 0.125, True, 0.1, False, None, None, 256, 256)
    assert prepared[-1][5] == 0.1 and calls[-1] is seed and seed.dtype == torch.int64 and seed.shape == (1,)
    n = len(calls)
    if F._interpreting():  # the forced paths launch the @triton.jit kernels, which only the interpreter runs here
        for forced in (False, True):
            F._flash_fwd(q[:1, :32].float(), k[:1, :32].float(), v[:1, :32].float(), 0.125, False, 0.0, False,
                         None, None, 32, 32, warp_spec=forced)
        assert len(calls) == n


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_gluon_forward_launches_on_the_direct_path(dropout_p, monkeypatch):
    """kernels/launch.py takes its direct path (no JITFunction.run from the second call) only for tensors and
    descriptors followed by numbers: the dropout seed must sit among the tensors, with or without dropout."""
    from kernels import flash_gluon, launch as L

    seen = []
    monkeypatch.setattr(L, "launch", lambda kernel, grid, args, consts: seen.append((kernel, args, consts)))
    q, k, v = _qkv(1, 256, 256, 2, 2, 64)
    o, lse = torch.empty_like(q), torch.empty(1, 2, 256)
    seed = torch.tensor([7], dtype=torch.int64)
    flash_gluon.gluon_forward(q, k, v, o, lse, 0.2, True, programs=2, dropout_p=dropout_p, seed=seed)
    (kernel, args, consts), = seen
    assert L._layout(kernel, args) is not None and consts["HAS_DROPOUT"] == (dropout_p > 0)
    assert any(a is seed for a in args) == (dropout_p > 0)
    with pytest.raises(ValueError, match="needs its seed"):
        flash_gluon.gluon_forward(q, k, v, o, lse, 0.2, True, programs=2, dropout_p=0.1, seed=None)


def test_head_tiles_equals_a_checked_descriptor():
    """head_tiles skips TensorDescriptor's own checks (host time); what it builds must equal the checked one."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from kernels import flash_gluon

    packed = torch.randn(2, 256, 3, 4, 128, dtype=torch.bfloat16)
    lay = flash_gluon._shared_layout(64, 128, flash_gluon.gl.bfloat16)
    for t in (packed[:, :, 1], torch.randn(2, 256, 4, 128, dtype=torch.float16)):
        checked = TensorDescriptor(t, [512, 512], [t.stride(1), 1], [64, 128], lay)
        assert flash_gluon.head_tiles(t, 64, lay) == checked


def _compile_gluon_sm90(dtype: str, causal: bool, head_dim: int = 128) -> dict:
    """resources(kernels.flash_gluon._fwd_kernel) for sm_90, with the launcher's constexprs and descriptor types
    (causal: the pairs of the persistent grid where it runs at short lengths; the forms of fwd_forms)."""
    import kernels.flash_gluon as G

    block_m, block_n, stages, q_buffers = G.FWD_TILES[head_dim]
    paired = causal and G.fwd_persistent(head_dim, 1024, causal)
    setup = ("import kernels.flash_gluon as G; from triton.experimental.gluon import language as gl; "
             f"lay = lambda r: gl.NVMMASharedLayout.get_default_for([r, {head_dim}], gl.{dtype}); "
             f"desc = lambda r: R.tensordesc('{_SHORT[dtype]}', [r, {head_dim}], lay(r))")
    consts = (f"dict(HEAD_DIM={head_dim}, BLOCK_M={block_m}, BLOCK_N={block_n}, STAGES={stages}, "
              f"Q_BUFFERS={q_buffers}, IS_CAUSAL={causal}, PAIRED={paired}, CONSUMER_REGS=G.CONSUMER_REGS, "
              f"**G.fwd_forms({head_dim}, {causal}))")
    types = (f"dict(q_desc=desc({block_m // 2}), o_desc=desc({block_m // 2}), k_desc=desc({block_n}), "
             f"v_desc=desc({block_n}))")
    return compile_sm90("G._fwd_kernel", consts, 4, stages, setup, types)


_SHORT = {"bfloat16": "bf16", "float16": "fp16"}


@needs_cuobjdump
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gluon_forward_compiles_for_sm90_without_spills(causal, head_dim):
    import kernels.flash_gluon as G

    r = _compile_gluon_sm90("bfloat16", causal, head_dim)
    assert r["stack"] == 0, r  # a spill in the consumers' 240 registers would cost the ping-pong its point
    # Q_BUFFERS of Q's two halves and a STAGES-deep K/V ring of bf16 tiles fit, within an H100's 227 KB per block
    block_m, block_n, stages, q_buffers = G.FWD_TILES[head_dim]
    assert (q_buffers * block_m + 2 * stages * block_n) * head_dim * 2 <= r["smem"] <= 232448
    assert r["ops"].get("HGMMA", 0) > 0 and r["ops"].get("SYNCS", 0) + r["ops"].get("UTMALDG", 0) > 0, r["ops"]


# ------------------------------------------------------------------------------------ CPU: the backward's choice


def _bwd_why(q, k, v, causal=False, dropout_p=0.0, varlen=False, do=None, grads=None, lse=None):
    do = torch.empty_like(q) if do is None else do
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1]) if lse is None else lse
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)) if grads is None else grads
    return F._gluon_bwd_unsupported(q, k, v, do, lse, lse, grads, causal, dropout_p, varlen)


def test_gluon_backward_scope(as_if_sm90, monkeypatch):
    q, k, v = _qkv(2, 2048, 2048, 4, 4, 128)
    assert _bwd_why(q, k, v) is None and _bwd_why(q, k, v, causal=True) is None
    packed = torch.randn(1, 2048, 3, 4, 128, dtype=torch.bfloat16)
    assert _bwd_why(*packed.unbind(2), grads=torch.empty_like(packed).unbind(2)) is None  # packed qkv and dqkv
    assert _bwd_why(*_qkv(2, 1024, 1024, 4, 4, 128), causal=True) is None
    q64, k64, v64 = _qkv(1, 2048, 2048, 4, 4, 64)
    assert _bwd_why(q64, k64, v64) is None and _bwd_why(q64, k64, v64, causal=True) is None
    assert _bwd_why(q64[:, :1024], k64[:, :1024], v64[:, :1024], causal=True) is None  # GPT-2's length
    assert "below 1024" in _bwd_why(q[:, :512], k[:, :512], v[:, :512])
    assert "below 1024 causal" in _bwd_why(q[:, :512], k[:, :512], v[:, :512], causal=True)
    cases = {
        "head dim 96, not one of (64, 128, 256)": _qkv(1, 1024, 1024, 4, 4, 96),
        "below 1024 causal": (*_qkv(1, 512, 512, 4, 4, 64), True),  # head dim 64: from 512, 1K under a mask
        "grouped-query": _qkv(1, 1024, 1024, 4, 2, 128),
        "not a multiple of 128": _qkv(1, 1000, 1000, 4, 4, 128),
        "seqlen_q != seqlen_k": _qkv(1, 1024, 2048, 4, 4, 128),
        "float32": _qkv(1, 1024, 1024, 4, 4, 128, torch.float32),
    }
    assert _bwd_why(*_qkv(1, 512, 512, 4, 4, 64)) is None
    for words, args in cases.items():
        assert words in _bwd_why(*args[:3], causal=len(args) > 3), words
    q, k, v = _qkv(1, 1024, 1024, 4, 4, 128)
    assert "dropout at head dim 128" in _bwd_why(q, k, v, dropout_p=0.1)
    # BWD_DROPOUT_MIN_SEQLEN: head dim 64 from 1K, causal or not (GPT-2's shape: 1.09x the @triton.jit backward)
    assert _bwd_why(q64, k64, v64, causal=True, dropout_p=0.1) is None
    assert _bwd_why(q64[:, :1024], k64[:, :1024], v64[:, :1024], dropout_p=0.1) is None
    assert _bwd_why(q64[:, :1024], k64[:, :1024], v64[:, :1024], causal=True, dropout_p=0.1) is None
    assert "below 1024 causal" in _bwd_why(*_qkv(1, 512, 512, 4, 4, 64), causal=True, dropout_p=0.1)
    assert "below 1024" in _bwd_why(*_qkv(1, 512, 512, 4, 4, 64), dropout_p=0.1)
    assert "varlen" in _bwd_why(q[0], k[0], v[0], varlen=True, lse=torch.empty(4, 1024))
    assert "do: heads not side by side" in _bwd_why(q, k, v, do=q.transpose(1, 2).contiguous().transpose(1, 2))
    assert "dk: " in _bwd_why(q, k, v, grads=(q, k.transpose(1, 2).contiguous().transpose(1, 2), v))
    assert "gradient dtype" in _bwd_why(q, k, v, grads=(q.float(), k.float(), v.float()))
    assert "dO in torch.float32" in _bwd_why(q, k, v, do=torch.empty(q.shape))
    assert "LSE" in _bwd_why(q, k, v, lse=torch.empty(1, 1024, 4).transpose(1, 2))
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert "deterministic" in _bwd_why(q, k, v)
    monkeypatch.undo()
    monkeypatch.setattr(F, "GLUON_KERNELS", False)
    assert "FLASH_GLUON=0" in _bwd_why(q, k, v)


def test_gluon_backward_takes_head_dim_256_from_its_lengths(as_if_sm90):
    assert _bwd_why(*_qkv(1, 512, 512, 4, 4, 256)) is None
    assert _bwd_why(*_qkv(1, 512, 512, 4, 4, 256), causal=True) is None
    assert "below 512" in _bwd_why(*_qkv(1, 256, 256, 4, 4, 256), causal=True)


def test_flash_bwd_hands_supported_calls_to_gluon(as_if_sm90, any_length, monkeypatch):
    """`_flash_bwd` gives the Gluon backward dO, q, k, v, the LSE, delta and its gradient buffers (views of one
    dqkv for packed calls) with the softmax scale, the float32 dQ buffer zeroed by the delta launch, dQ scaled and cast
    from it, and returns what it wrote; its launches are worked out once per call geometry (`_gluon_bwd_plan`);
    gluon=False never reaches it."""
    from kernels import flash_gluon, launch as L

    prepared, calls, launched = [], [], []

    def fake_prepare(q, k, v, do, dk, dv, dq_accum, lse, delta, seed, softmax_scale, causal, dropout_p):
        prepared.append((softmax_scale, causal, delta.shape, dk.stride(1)))

        def run(q_, do_, k_, v_, dk, dv, dq_accum, lse_, delta, seed_):
            calls.append((q_, do_, k_, v_, lse_, seed_))
            dq_accum.fill_(2.0)  # dQ before the scale (the cast launch applies it)
            dk.fill_(2)
            dv.fill_(3)
        return run

    def fake_launch(kernel, grid, args, consts):  # the delta and cast launches, by the kernels' arithmetic
        launched.append(kernel)
        if kernel is F._bwd_preprocess_kernel:
            o, do, delta, zero = args[:4]
            assert consts["ZERO_FILL"] and zero.dtype == torch.float32 and zero.shape == o.shape
            zero.zero_()
            delta.copy_((o.float() * do.float()).sum(-1).transpose(1, 2))
        else:
            src, dst, _, _, scale = args
            dst.copy_(src * scale)

    monkeypatch.setattr(flash_gluon, "backward_launch", fake_prepare)
    monkeypatch.setattr(L, "launch", fake_launch)
    q, k, v = _qkv(2, 256, 256, 4, 4, 128, torch.float16)
    lse = torch.zeros(2, 4, 256)
    do = torch.randn_like(q)
    grads = F._flash_bwd(do, q, k, v, q, lse, lse, 0.125, True, 0.0, False, None, None, 256, 256)
    assert prepared == [(0.125, True, (2, 4, 256), 4 * 128)]
    assert launched == [F._bwd_preprocess_kernel, F._scale_cast_kernel]
    assert calls[0][0] is q and calls[0][1] is do and calls[0][4] is lse and calls[0][5] is lse  # no dropout: lse
    assert all((g == i + 1).all() for i, g in enumerate((grads[0] * 4, *grads[1:])))  # dQ = 2 * 0.125 * 4
    grads2 = F._flash_bwd(do, q, k, v, q, lse, lse, 0.125, True, 0.0, False, None, None, 256, 256)
    assert len(prepared) == 1 and grads2[0].data_ptr() != grads[0].data_ptr()  # the plan, fresh buffers
    qkv = torch.stack((q, k, v), dim=2)
    dqkv = F._bwd_packed(torch.randn_like(q), qkv, q, lse, lse, None, 256, 0.125, False, 0.0)
    assert prepared[1] == (0.125, False, (2, 4, 256), 3 * 4 * 128)  # written into the packed gradient's views
    assert (dqkv[:, :, 0] == 0.25).all() and (dqkv[:, :, 1] == 2).all() and (dqkv[:, :, 2] == 3).all()
    n = len(calls)
    if F._interpreting():  # the forced path launches the @triton.jit kernels, which only the interpreter runs here
        monkeypatch.undo()
        q32, k32, v32 = (x[:1, :32].float() for x in (q, k, v))
        F._flash_bwd(torch.randn_like(q32), q32, k32, v32, q32, lse[:1, :, :32].contiguous(), lse, 0.125, False, 0.0,
                     False, None, None, 32, 32, gluon=False)
        assert len(calls) == n


def test_tensor_geometry_answers_as_the_tensor():
    """The plans' checks run on TensorGeometry stand-ins: each must answer what the tensor answers (the address only
    modulo 16), on the layouts the launchers meet and the ones they refuse."""
    base = torch.randn(2, 64, 3, 4, 32, dtype=torch.bfloat16)
    flat = torch.randn(4 * 64 * 4 * 32 + 8, dtype=torch.float16)
    tensors = [base, *base.unbind(2), base[:, :, 0].transpose(1, 2), base[:1], base[:, :0], base[:, 5:9, 1],
               flat[1:1 + 2 * 64 * 4 * 32].view(2, 64, 4, 32), torch.randn(1, 1, 4, 1), torch.randn(4, 1, 1, 8)[:, :, :, ::2],
               torch.randn(3, 5).t(), torch.zeros(1, dtype=torch.int64), torch.randn(2, 4, 64)]
    for t in tensors:
        g = F.TensorGeometry(t)
        assert (g.shape, g.stride(), g.dtype, g.device, g.is_cuda) == (t.shape, t.stride(), t.dtype, t.device, t.is_cuda)
        assert all(g.stride(i) == t.stride(i) for i in range(-t.dim(), t.dim()))
        assert (g.data_ptr(), g.element_size(), g.numel(), g.dim()) == (t.data_ptr() % 16, t.element_size(), t.numel(),
                                                                        t.dim())
        assert g.is_contiguous() == t.is_contiguous(), tuple(t.shape)
        if t.dim() == 4:
            assert F._ws_layout_problem(g, False) == F._ws_layout_problem(t, False)
        assert g == F.TensorGeometry(t.clone()) or not t.is_contiguous() or t.data_ptr() % 16
    for shape, dtype in (((2, 64, 4, 32), torch.float32), ((1,), torch.int64), ((0, 3), torch.bfloat16)):
        assert F.TensorGeometry.fresh(shape, dtype, torch.device("cpu")) == F.TensorGeometry(torch.empty(shape, dtype=dtype))


def test_plans_follow_the_call_geometry(as_if_sm90, any_length, monkeypatch):
    """A plan is made per call geometry and per switch its checks read: an input 16-byte aligned or not, deterministic
    mode, FLASH_GLUON. A call that differs in any of them from one that took the Gluon kernels is checked again."""
    from kernels import flash_gluon, launch as L

    taken = []
    monkeypatch.setattr(L, "launch", lambda kernel, grid, args, consts: taken.append(kernel.fn.__module__))
    monkeypatch.setattr(F, "_launch", lambda kind, *a: taken.append(kind))
    monkeypatch.setattr(flash_gluon, "_sm_count", lambda device: 132)  # the persistent grids' programs, as on an H100

    def backward(q, k, v):
        taken.clear()
        F._flash_bwd(torch.randn_like(q), q, k, v, torch.randn_like(q), torch.zeros(1, 2, 256), None, 0.125, True,
                     0.0, False, None, None, 256, 256)
        return "gluon" if "kernels.flash_gluon" in taken else "jit"

    def forward(q, k, v):
        taken.clear()
        F._flash_fwd(q, k, v, 0.125, True, 0.0, False, None, None, 256, 256)
        return "gluon" if "kernels.flash_gluon" in taken else "jit"

    q, k, v = _qkv(1, 256, 256, 2, 2, 64)
    buf = torch.empty(q.numel() + 8, dtype=q.dtype)
    q_off = buf[1:1 + q.numel()].view(q.shape)  # the same shape and strides, 2 bytes past an aligned address
    q_off.copy_(q)
    assert backward(q, k, v) == "gluon" and forward(q, k, v) == "gluon"
    assert backward(q_off, k, v) == "jit" and forward(q_off, k, v) == "jit"
    assert backward(q.clone(), k, v) == "gluon" and forward(q.clone(), k, v) == "gluon"
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert backward(q, k, v) == "jit" and forward(q, k, v) == "gluon"  # the forward adds in a fixed order
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: False)
    monkeypatch.setattr(F, "GLUON_KERNELS", False)
    assert backward(q, k, v) == "jit" and forward(q, k, v) == "jit"
    monkeypatch.setattr(F, "GLUON_KERNELS", True)
    monkeypatch.setattr(flash_gluon, "BWD_MIN_SEQLEN", dict.fromkeys(flash_gluon.BWD_MIN_SEQLEN, 4096))
    assert backward(q, k, v) == "gluon"  # a module setting is read when the plan is made ...
    F.clear_plans()
    assert backward(q, k, v) == "jit"  # ... so a change after a first call needs clear_plans()


def bwd_compile_sm90(head_dim: int, causal: bool, tiles: tuple | None = None, patch: str = "",
                     dropout: bool = False) -> dict:
    """compile_sm90 of the Gluon backward kernel that gluon_backward launches at this head dim, with its tiles and
    schedule (flash_gluon.BWD_TILES; `_bwd_split_kernel`, persistent with BWD_SPLIT_KV_BUFFERS, at
    BWD_SPLIT_HEAD_DIMS, else `_bwd_kernel`), or with `tiles` (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES) instead;
    `patch`: Python run first in the compiling process with flash_gluon as G (an experiment's other layout, say);
    dropout: the split kernel's HAS_DROPOUT."""
    import kernels.flash_gluon as G

    block_m, block_n, stages, dq_stages = tiles or G.BWD_TILES[head_dim]
    setup = "; ".join(line for line in (
        "import kernels.flash_gluon as G", "from triton.experimental.gluon import language as gl", patch,
        f"G.BWD_TILES[{head_dim}] = ({block_m}, {block_n}, {stages}, {dq_stages})", "G.bwd_layouts.cache_clear()",
        f"lay = G.bwd_layouts({head_dim}, gl.bfloat16, {head_dim} in G.BWD_SPLIT_HEAD_DIMS)",
        f"desc = lambda r, l, t='bf16': R.tensordesc(t, [r, {head_dim}], lay[l])") if line)
    consts = (f"dict(HEAD_DIM={head_dim}, BLOCK_M={block_m}, BLOCK_N={block_n}, STAGES={stages}, "
              f"DQ_STAGES={dq_stages}, IS_CAUSAL={causal}, ds_layout=lay['ds_layout'], ")
    split = head_dim in G.BWD_SPLIT_HEAD_DIMS
    if split:  # as gluon_backward launches it
        consts += (f"KV_BUFFERS=G.BWD_SPLIT_KV_BUFFERS, PAIRED={causal}, CONSUMER_REGS=G.CONSUMER_REGS, "
                   f"HAS_DROPOUT={dropout})")
    else:
        consts += "WARPS=G.BWD_WARPS)"
    dkv_rows = block_n // 2 if split else block_n
    types = (f"dict(q_desc=desc({block_m}, 'q_layout'), do_desc=desc({block_m}, 'q_layout'), "
             f"k_desc=desc({block_n}, 'kv_layout'), v_desc=desc({block_n}, 'kv_layout'), "
             f"dk_desc=desc({dkv_rows}, 'dkv_layout'), dv_desc=desc({dkv_rows}, 'dkv_layout'), "
             f"dqa_desc=desc({block_m}, 'dqa_layout', 'fp32'))")
    kernel, warps = ("G._bwd_split_kernel", 4) if split else ("G._bwd_kernel", G.BWD_WARPS)
    return compile_sm90(kernel, consts, warps, stages, setup, types)


@needs_cuobjdump
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_backward_compiles_for_sm90(causal):
    import kernels.flash_gluon as G

    _, _, stages, dq_stages = G.BWD_TILES[128]
    r = bwd_compile_sm90(128, causal)
    # 56 bytes of spill stack since the kernel loops over key blocks, one key block a program as launched here (24-32
    # before: results/attention/gluon_bwd/compile_sm90.txt), measured at 0.98-1.05x the kernel before it
    # (results/attention/gluon_bwd_persistent/bench_h100_hd128.txt, one_unit): more would be a change to re-measure
    assert r["stack"] <= 56, r
    # K, V, a 2-deep Q / dO ring, dS^T (bf16) and a 2-deep float32 dQ ring fit within an H100's 227 KB per block
    tiles = (2 * 128 * 128 + 2 * stages * 64 * 128 + 128 * 64) * 2 + dq_stages * 64 * 128 * 4
    assert tiles <= r["smem"] <= 232448, r
    assert r["ops"].get("HGMMA", 0) > 0 and r["ops"].get("UTMALDG", 0) > 0, r["ops"]


@needs_cuobjdump
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_backward_at_head_dim_64_is_split_and_persistent_without_spills(causal, dropout):
    """Head dim 64 as launched: `_bwd_split_kernel` on the persistent grid (pairs of key blocks under a mask) with two
    K/V buffers and two dS^T buffers; with dropout, the mask's Philox rounds beside them."""
    import kernels.flash_gluon as G

    assert 64 in G.BWD_SPLIT_HEAD_DIMS and G.BWD_SPLIT_KV_BUFFERS == 2
    _, _, stages, dq_stages = G.BWD_TILES[64]
    r = bwd_compile_sm90(64, causal, dropout=dropout)
    # with dropout 64 bytes since its flags reach S^T's layout as words (session 42; 24 / 48 as bytes), measured at
    # 1.07-1.14x the bytes' form (results/attention/gluon_bwd_maskbits/): more would be a change to re-measure
    assert r["stack"] <= (64 if dropout else 0), r
    # two K/V buffers (128 x 64 each), a Q / dO ring, two dS^T tiles and a float32 dQ ring within an H100's 227 KB
    tiles = (2 * 2 * 128 * 64 + 2 * stages * 64 * 64 + 2 * 128 * 64) * 2 + dq_stages * 64 * 64 * 4
    assert tiles <= r["smem"] <= 232448, r
    assert r["ops"].get("HGMMA", 0) > 0 and r["ops"].get("UTMALDG", 0) > 0, r["ops"]


@needs_cuobjdump
def test_gluon_backward_at_head_dim_256_splits_its_tiles():
    """64-key tiles at head dim 256: each tile split across the two warpgroups along its columns (`_tile_layout`),
    P^T and dS^T through shared memory. Laid out one warp per 16 rows instead, it spilled 1.5 KB a thread
    (results/attention/gluon_bwd256/compile_sm90.txt); split, none, and 16 bytes since the kernel loops over key
    blocks."""
    r = bwd_compile_sm90(256, causal=True)
    assert r["stack"] <= 16, r
    # K, V, one stage of Q and dO, P^T and dS^T (bf16), one float32 dQ tile
    tiles = (2 * 64 * 256 + 2 * 64 * 256 + 2 * 64 * 64) * 2 + 64 * 256 * 4
    assert tiles <= r["smem"] <= 232448, r


# ------------------------------------------------------------------------------------ GPU (sm_90) only

GPU_CASES = [  # (batch, seqlen, nheads, nheads_k, causal)
    (2, 1024, 4, 4, False), (2, 1024, 4, 4, True), (2, 512, 8, 2, False), (1, 384, 8, 2, True),
    (3, 128, 2, 1, True), (1, 2048, 2, 2, True),
]


def _check_automatic(qkv, causal, monkeypatch):
    """check_ws on inputs the Gluon forward takes, with the launcher's automatic choice: check_ws forces
    warp_spec=True, which bypasses Gluon, so the forced flag is dropped here."""
    q, k, v = qkv
    assert _why(q, k, v, causal) is None
    flash_fwd = F._flash_fwd
    monkeypatch.setattr(F, "_flash_fwd", lambda *a, warp_spec=None, **kw: flash_fwd(*a, **kw))
    check_ws(q, k, v, causal)


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gpu_gluon_matches_reference(case, dtype, any_length, monkeypatch):
    """check_ws's bounds (outputs and LSE 2x plain PyTorch's error, gradients 3x, plus a floor), with the Gluon
    forward: check_ws forces warp_spec=True, so it is pointed at the automatic choice here."""
    b, n, h, hk, causal = case
    _check_automatic(_qkv(b, n, n, h, hk, 128, dtype, "cuda"), causal, monkeypatch)


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_gpu_gluon_head_dims_64_256_match_reference(head_dim, causal, any_length, monkeypatch):
    """The forward at head dims 64 and 256 (64-key tiles there), with the @triton.jit backward from its O and LSE."""
    _check_automatic(_qkv(2, 512, 512, 4, 2, head_dim, torch.bfloat16, "cuda"), causal, monkeypatch)


def _launcher_spy(monkeypatch, name: str, programs) -> list:
    """flash_gluon.<name> (forward_launch / backward_launch: what kernels.flash's plans prepare once per call geometry)
    made with at most `programs` programs; returns the list of the dropout_p of each plan made."""
    from kernels import flash_gluon

    calls = []
    real = getattr(flash_gluon, name)
    monkeypatch.setattr(flash_gluon, name,
                        lambda *a, **kw: calls.append(kw["dropout_p"]) or real(*a, **{**kw, "programs": programs}))
    return calls


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("programs", [None, 7])
def test_gpu_gluon_dropout_forward_matches_reference(causal, programs, any_length, monkeypatch):
    """The Gluon forward with dropout (kernels/gluon_dropout.py draws the mask in the scores' registers), the
    @triton.jit backward from its O and LSE, against float64 with kernels.flash.dropout_keep_mask's mask: the two
    kernels must drop the same scores, or the gradients would not match. Grouped-query heads (the mask follows the
    query head); 7 programs, each running many work units."""
    from tests.test_flash import check_against_reference

    b, n, h, hk, p = 2, 512, 4, 2, 0.2
    q, k, v = (x.requires_grad_() for x in _qkv(b, n, n, h, hk, 64, torch.bfloat16, "cuda"))
    assert _why(q, k, v, causal, dropout_p=p) is None
    calls = _launcher_spy(monkeypatch, "forward_launch", programs)
    torch.manual_seed(5)
    mask = F.dropout_keep_mask(F.draw_dropout_seed("cuda"), b, h, n, n, p)
    check_against_reference(q, k, v, causal=causal, dropout_mask=mask, dropout_p=p, seed=5)
    assert calls == [p]


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("programs", [None, 5])
def test_gpu_gluon_dropout_backward_matches_reference(causal, programs, any_length, monkeypatch):
    """The split Gluon backward with dropout (BWD_DROPOUT_MIN_SEQLEN; every length here), after the Gluon forward with
    dropout, against float64 with kernels.flash.dropout_keep_mask's mask: the backward must drop the scores the
    forward dropped. 5 programs: each runs many key blocks (and, causal, pairs of them)."""
    from kernels import flash_gluon
    from tests.test_flash import check_against_reference

    monkeypatch.setattr(flash_gluon, "BWD_DROPOUT_MIN_SEQLEN", {(64, False): 0, (64, True): 0})
    b, n, h, p = 2, 512, 4, 0.2
    q, k, v = (x.requires_grad_() for x in _qkv(b, n, n, h, h, 64, torch.bfloat16, "cuda"))
    lse = torch.empty(b, h, n, device="cuda")
    assert F._gluon_bwd_unsupported(q, k, v, q, lse, lse, (q, k, v), causal, p, False) is None
    calls = _launcher_spy(monkeypatch, "backward_launch", programs)
    torch.manual_seed(5)
    mask = F.dropout_keep_mask(F.draw_dropout_seed("cuda"), b, h, n, n, p)
    check_against_reference(q, k, v, causal=causal, dropout_mask=mask, dropout_p=p, seed=5)
    assert calls == [p]


@pytest.fixture
def bwd_head_dim_256(monkeypatch):
    """The Gluon backward at head dim 256 at every length (BWD_MIN_SEQLEN keeps 512 causal on the @triton.jit one)."""
    from kernels import flash_gluon

    monkeypatch.setattr(flash_gluon, "BWD_MIN_SEQLEN", {**flash_gluon.BWD_MIN_SEQLEN, (256, False): 0, (256, True): 0})


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_gpu_gluon_backward_head_dims_64_256_match_reference(head_dim, causal, any_length, bwd_head_dim_256,
                                                             monkeypatch):
    """Both Gluon kernels at head dims 64 (the backward from 2K there, every length here) and 256."""
    q, k, v = _qkv(2, 512, 512, 4, 4, head_dim, torch.bfloat16, "cuda")
    lse = torch.empty(2, 4, 512, device="cuda")
    assert F._gluon_bwd_unsupported(q, k, v, q, lse, lse, (q, k, v), causal, 0.0, False) is None
    _check_automatic((q, k, v), causal, monkeypatch)


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_head_groups_change_the_order_not_the_results(causal, any_length, monkeypatch):
    """`_work_item`'s launch groups of 1, 3 (10 heads: a short last group), all 10 and more than there are: each
    program computes the same tile whatever order the programs run in, so the results are bit-identical (dQ up to
    its varying summation order)."""
    from kernels import flash_gluon

    b, n, h = 2, 512, 5
    q, k, v = _qkv(b, n, n, h, h, 128, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    scale = 128 ** -0.5

    def run(group):
        monkeypatch.setattr(flash_gluon, "launch_head_group", lambda seqlen, causal: group)
        F.clear_plans()  # the group is read when a plan is made
        assert F._gluon_fwd_plan(q, k, v, scale, causal, 0.0, None).kernel.numbers[5] == group
        o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
        return (o, lse, *F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n))

    first = run(1)
    assert not torch.isnan(first[0]).any()
    for group in (3, 10, 16):
        again = run(group)
        for a, b_ in zip(again[:2] + again[3:], first[:2] + first[3:]):
            assert torch.equal(a, b_), group
        _close(again[2], first[2], DQ_RERUN)


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "one_unit_a_program"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_gluon_forward_work_split_any_way_same_result(head_dim, causal, persistent, monkeypatch):
    """The forward's work units over 1, 7 or the default number of programs, with the persistent schedule (pairs of
    causal tiles) and without: each item's rows get the same operations in the same order, so O and the LSE are
    bit-identical, and they match the @triton.jit forward's. Outputs start as NaN, so an item no program wrote
    fails. 5 query tiles (an odd count: the middle causal tile is a unit alone), 3 batches, grouped-query heads."""
    from kernels import flash_gluon as G

    monkeypatch.setattr(G, "fwd_persistent", lambda *a: persistent)
    b, n, h, hk = 3, 640, 4, 2
    q, k, v = _qkv(b, n, n, h, hk, head_dim, torch.bfloat16, "cuda")

    def run(programs):
        o, lse = torch.full_like(q, float("nan")), torch.full((b, h, n), float("nan"), device="cuda")
        G.gluon_forward(q, k, v, o, lse, head_dim ** -0.5 * F.LOG2E, causal, programs=programs)
        return o, lse

    o, lse = run(None)
    assert not (o.isnan().any() or lse.isnan().any())
    for programs in (1, 7):
        again, again_lse = run(programs)
        assert torch.equal(again, o) and torch.equal(again_lse, lse), programs
    tr_o, tr_lse, _ = F._flash_fwd(q, k, v, head_dim ** -0.5, causal, 0.0, False, None, None, n, n, warp_spec=False)
    _close(o, tr_o, 2 ** -7)  # other tiles, so other float32 sums: an element may round one bf16 unit apart
    assert (lse - tr_lse).abs().max().item() <= 1e-4


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim, split", [(64, True), (64, False), (128, False)],
                         ids=["64-split-persistent", "64-one-key-block-a-program", "128-one-key-block-a-program"])
def test_gpu_gluon_backward_work_split_any_way_same_result(head_dim, split, causal, monkeypatch):
    """The backward's key blocks over 1, 7 or the default number of programs, in `_bwd_split_kernel`'s persistent
    schedule (pairs of causal key blocks, K/V and dS^T buffers handed on across blocks, dQ in turns) and in
    `_bwd_kernel`'s: dK and dV are bit-identical (each key row gets the same operations in the same order), dQ equal
    up to its varying summation order, and all three match the @triton.jit backward's. Gradients start as NaN, so a
    key block no program wrote fails. 5 key blocks (an odd count: the middle causal block is a unit alone), 3
    batches: over 7 programs a program's query-tile count, and so whose turn dQ is, runs on across key blocks."""
    from kernels import flash_gluon as G

    monkeypatch.setattr(G, "BWD_SPLIT_HEAD_DIMS", (head_dim,) if split else ())
    b, n, h = 3, 640, 4
    q, k, v = _qkv(b, n, n, h, h, head_dim, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    scale = head_dim ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()

    def run(programs):
        grads = [torch.full_like(q, float("nan")) for _ in range(3)]
        G.gluon_backward(do, q, k, v, lse, delta, *grads, scale, causal, programs=programs)
        return grads

    dq, dk, dv = run(None)
    assert not any(g.isnan().any() for g in (dq, dk, dv))
    for programs in (1, 7):
        again = run(programs)
        assert torch.equal(again[1], dk) and torch.equal(again[2], dv), programs
        _close(again[0], dq, DQ_RERUN)
    tr = F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n, gluon=False)
    for ours, theirs in zip((dq, dk, dv), tr):
        _close(ours, theirs)


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
def test_gpu_gluon_repeated_launches_skip_triton_run(any_length, monkeypatch):
    """kernels/launch.py keys the Gluon kernels' host descriptors: from the second call on, neither kernel goes
    through JITFunction.run (~0.1 ms of host time a launch), and the results are those of Triton's path."""
    from kernels import flash_gluon

    b, n, h = 2, 1024, 8
    q, k, v = _qkv(b, n, n, h, h, 128, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    scale = 128 ** -0.5
    runs = []
    for kernel in (flash_gluon._fwd_kernel, flash_gluon._bwd_kernel):
        monkeypatch.setattr(kernel, "run", lambda *a, _run=kernel.run, **kw: runs.append(1) or _run(*a, **kw))

    def step():
        o, lse, seed = F._flash_fwd(q, k, v, scale, True, 0.0, False, None, None, n, n)
        return (o, lse, *F._flash_bwd(do, q, k, v, o, lse, seed, scale, True, 0.0, False, None, None, n, n))

    first = step()
    runs.clear()
    for _ in range(2):
        again = step()
        for a, b_ in zip(again[:2] + again[3:], first[:2] + first[3:]):  # all but dQ, summed in a varying order
            assert torch.equal(a, b_)
        _close(again[2], first[2], DQ_RERUN)
    assert runs == []


@pytest.mark.gpu
@gluon_gpu
def test_gpu_gluon_chosen_automatically():
    from kernels.flash_gluon import gluon_forward

    q, k, v = _qkv(1, 2048, 2048, 4, 2, 128, torch.bfloat16, "cuda")
    o = torch.empty_like(q)
    lse = torch.empty(1, 4, 2048, device="cuda")
    gluon_forward(q, k, v, o, lse, 128 ** -0.5 * F.LOG2E, True)
    assert torch.equal(F.flash_attn_func(q, k, v, causal=True), o)


def _close(a, b, rel=2e-2):
    """a within rel of b's largest magnitude: two exact computations in 16-bit, different in summation order."""
    assert (a.float() - b.float()).abs().max().item() <= rel * b.float().abs().max().item()


# Two runs of the Gluon backward sum dQ's float32 partials in different orders; rounded to 16 bits, an element may
# land one unit in the last place apart: at most 2^-7 of the largest element in bf16 (measured on the H100: 1e-3 to
# 2.1e-3 of it; a bound of 1e-3 failed two runs in four).
DQ_RERUN = 2 ** -7


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_gluon_backward_vs_triton_reruns_packed_and_deterministic(head_dim, causal, dtype, any_length,
                                                                     bwd_head_dim_256):
    """Against the @triton.jit backward on the same O and LSE; reruns: dK, dV bit-identical (one program owns each
    key tile), dQ equal up to its varying summation order; written into a packed dqkv's views (at head dim 64 the
    split kernel writes dK and dV by 64-key halves); deterministic mode runs the @triton.jit kernels."""
    b, n, h = 2, 1024, 8
    q, k, v = _qkv(b, n, n, h, h, head_dim, dtype, "cuda")
    do = torch.randn_like(q)
    scale = head_dim ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)

    def bwd(q, k, v, gluon=True, out=None):
        return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n, gluon=gluon,
                            out=out)

    assert F._gluon_bwd_unsupported(q, k, v, do, lse, lse, (q, k, v), causal, 0.0, False) is None
    gl_grads, tr_grads = bwd(q, k, v), bwd(q, k, v, False)
    for g, t in zip(gl_grads, tr_grads):
        assert not torch.isnan(g).any()
        _close(g, t)
    for _ in range(3):  # a race between the loader, the compute warps and the dQ writer would show here
        dq, dk, dv = bwd(q, k, v)
        assert torch.equal(dk, gl_grads[1]) and torch.equal(dv, gl_grads[2])
        _close(dq, gl_grads[0], DQ_RERUN)
    qkv = torch.stack((q, k, v), dim=2)
    dqkv = torch.empty_like(qkv)
    bwd(*qkv.unbind(2), out=dqkv.unbind(2))
    assert torch.equal(dqkv[:, :, 1], gl_grads[1]) and torch.equal(dqkv[:, :, 2], gl_grads[2])
    _close(dqkv[:, :, 0], gl_grads[0], DQ_RERUN)
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic" in F._gluon_bwd_unsupported(q, k, v, do, lse, lse, (q, k, v), causal, 0.0, False)
        assert all(torch.equal(a, b) for a, b in zip(bwd(q, k, v), tr_grads))
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.gpu
@gluon_gpu
def test_gpu_gluon_backward_chosen_automatically(monkeypatch):
    from kernels import flash_gluon

    calls = []
    real = flash_gluon.backward_launch  # what kernels.flash's plan for this call geometry prepares
    monkeypatch.setattr(flash_gluon, "backward_launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2048, 2048, 4, 4, 128, torch.bfloat16, "cuda"))
    F.flash_attn_func(q, k, v, causal=True).sum().backward()
    assert calls == [1] and not torch.isnan(q.grad).any()


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("nheads_k", [2, 4], ids=["gqa-triton-backward", "mha-gluon-backward"])
def test_gpu_gluon_under_cuda_graph_and_compile(nheads_k):
    """The Gluon kernels take TMA descriptors built on the host, by value: a captured CUDA graph replays them with the
    static buffers' addresses on new inputs, and torch.compile(fullgraph=True) traces the operators around them; both
    give the eager result (dQ of the Gluon backward up to its varying summation order)."""
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2048, 2048, 4, nheads_k, 128, torch.bfloat16, "cuda"))
    assert _why(q, k, v, causal=True) is None
    do = torch.randn_like(q)

    def step(q, k, v):
        out = F.flash_attn_func(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    eager = step(q, k, v)

    def same(got, want):
        for i, (a, b) in enumerate(zip(got, want)):
            if i == 1 and nheads_k == 4:
                _close(a, b, DQ_RERUN)
            else:
                assert torch.equal(a, b), i

    out = torch.compile(lambda q, k, v: F.flash_attn_func(q, k, v, causal=True), fullgraph=True)(q, k, v)
    compiled = (out, *torch.autograd.grad(out, (q, k, v), do))
    same(compiled, eager)

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
    with collector_paused(), torch.cuda.graph(graph):  # no earlier graph freed mid-capture (train/cuda_graph.py)
        captured = step(*static)
    with torch.no_grad():
        for x, src in zip(static, (q, k, v)):
            x.copy_(src)
    graph.replay()
    same(captured, eager)


def test_forward_barrier_protocol_with_k_ahead_holds_and_catches_its_mutations():
    """The Gluon forward's barrier protocol (results/attention/gluon_persistent/protocol_sim.py: the loader and both
    consumers as generators mirroring the kernel's waits and arrives, mbarriers with hardware parity, TMA copies
    landing at random times), with K released after S (K_AHEAD, shipped at head dim 256) and without: no deadlock, no
    slot refilled before both consumers released it, and each K_AHEAD mutation caught."""
    import importlib.util
    import random
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "results" / "attention" / "gluon_persistent" / "protocol_sim.py"
    spec = importlib.util.spec_from_file_location("persistent_protocol_sim", path)
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    rng = random.Random(0)
    for seed in range(40):
        items = [(t, rng.randint(1, 9)) for t in range(rng.randint(1, 5))]
        for stages, q_buffers, k_ahead in ((2, 1, True), (3, 2, True), (2, 2, False)):
            sim.simulate(items, stages, q_buffers, rng, exp_turns=seed % 2 == 1, k_ahead=k_ahead)
    for bug in sim.K_AHEAD_BUGS:
        with pytest.raises(AssertionError):
            for seed in range(50):
                sim.simulate([(t, 1 + (seed + t) % 4) for t in range(5)], 2, 2, random.Random(seed), bug,
                             seed % 2 == 1, k_ahead=True)
