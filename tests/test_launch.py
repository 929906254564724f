"""kernels/launch.py: repeated launches go to the compiled kernel's launcher, every change of specialisation
goes back through Triton. On the CPU, a stand-in kernel records which path each launch took; on the GPU the
flash kernels are run through both paths and must agree bit for bit."""
import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

import kernels.launch as L


def _signature(X, Y, n, stride, per_batch, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    pass


# A JITFunction itself (triton.jit gives an interpreter object under TRITON_INTERPRET=1): launch() reads its params.
SIGNATURE = JITFunction(_signature, do_not_specialize=["per_batch"])


class FakeCompiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def _init_handles(self):
        pass

    def run(self, *a):
        self.log.append(("direct", a))


class FakeKernel:
    """What launch() uses of a JITFunction: params and kernel[grid](...) returning the compiled kernel."""
    params = SIGNATURE.params

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.log.append(("triton", grid, args, kw))
            return FakeCompiled(self.log)
        return run


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(L, "_interpreting", lambda: False)
    monkeypatch.setattr(L, "_launch_hooked", lambda: False)
    monkeypatch.setattr(L, "_current_device", lambda: 0)
    monkeypatch.setattr(L, "_current_stream", lambda device: "stream")
    return FakeKernel()


def paths(k):
    return [entry[0] for entry in k.log]


def test_second_launch_is_direct_with_constexprs_in_signature_order(fake):
    x, y = torch.zeros(64), torch.zeros(64)
    args = (x, y, 64, 16, 1000, 0.5)
    L.launch(fake, (3, 2), args, {"BLOCK": 32, "num_warps": 4})
    L.launch(fake, (3, 2), args, {"BLOCK": 32, "num_warps": 4})
    assert paths(fake) == ["triton", "direct"]
    # grid padded to three axes, stream, launcher metadata, no hooks, then every argument and the defaulted FLAG
    assert fake.log[1][1] == (3, 2, 1, "stream", "fn", "meta", None, None, None, *args, 32, False)


def test_every_specialisation_change_goes_through_triton(fake):
    x, y = torch.zeros(64), torch.zeros(64)
    base = (x, y, 64, 16, 1000, 0.5)
    L.launch(fake, (1,), base, {"BLOCK": 32})
    variants = [
        (x[1:], y, 64, 16, 1000, 0.5),        # address no longer 16-byte aligned
        (x.half(), y, 64, 16, 1000, 0.5),     # dtype
        (x, y, 65, 16, 1000, 0.5),            # an int's value (Triton keys % 16 and == 1)
        (x, y, 64, 1, 1000, 0.5),
        (x, y, 64, 16, 2**40, 0.5),           # a do_not_specialize int past 32 bits: Triton's i64 variant
    ]
    for args in variants:
        L.launch(fake, (1,), args, {"BLOCK": 32})
    L.launch(fake, (1,), base, {"BLOCK": 64})  # a constexpr
    L.launch(fake, (1,), base, {"BLOCK": 32, "num_warps": 8})  # a launch option
    assert paths(fake) == ["triton"] * 8
    L.launch(fake, (1,), (x, y, 64, 16, 2**40, 0.5), {"BLOCK": 32})  # never kept: always Triton's path
    assert paths(fake)[-1] == "triton"


def test_do_not_specialize_values_share_one_entry(fake):
    x, y = torch.zeros(64), torch.zeros(64)
    for per_batch in (1000, 889, 1024, 17):  # e.g. a varlen batch's LSE stride
        L.launch(fake, (1,), (x, y, 64, 16, per_batch, 0.5), {"BLOCK": 32})
    assert paths(fake) == ["triton", "direct", "direct", "direct"]
    assert fake.log[-1][1][9 + 4] == 17  # the launcher got this call's value


def test_unexpected_layouts_are_never_cached(fake):
    x, y = torch.zeros(64), torch.zeros(64)
    L.launch(fake, (1,), (x, y, 64, 16, 1000, 0.5), {"BLOCK": 32})
    L.launch(fake, (1,), (x, y, 64, 16, 1000, torch.tensor(0.5)), {"BLOCK": 32})  # a tensor among the numbers
    L.launch(fake, (1,), (x, 3, 64, 16, 1000, 0.5), {"BLOCK": 32})  # a number among the tensors
    L.launch(fake, (1,), (x, y, 64, 16, 1000), {"BLOCK": 32, "scale": 0.5})  # fewer positional arguments
    assert paths(fake) == ["triton"] * 4
    other = FakeKernel()
    L.launch(other, (1,), (x, 7, y, 64), {"BLOCK": 32})  # a kernel not laid out tensors-then-numbers
    L.launch(other, (1,), (x, 7, y, 64), {"BLOCK": 32})
    assert paths(other) == ["triton", "triton"]


def test_nan_is_never_kept_and_the_cache_is_bounded(fake, monkeypatch):
    x, y = torch.zeros(64), torch.zeros(64)
    for _ in range(2):
        L.launch(fake, (1,), (x, y, 64, 16, 1000, float("nan")), {"BLOCK": 32})
    assert paths(fake) == ["triton", "triton"]
    monkeypatch.setattr(L, "_MAX_ENTRIES", 3)
    for n in range(5):  # five shapes: the cache starts over instead of growing past 3
        L.launch(fake, (1,), (x, y, 64 + n, 16, 1000, 0.5), {"BLOCK": 32})
    assert L.compiled_entries(fake) <= 3
    L.launch(fake, (1,), (x, y, 68, 16, 1000, 0.5), {"BLOCK": 32})  # the last one is still there
    assert paths(fake)[-1] == "direct"


def test_prepared_launch_binds_to_the_kept_runner(fake, monkeypatch):
    """A reused Prepared calls the runner launch() keeps, with the same arguments, from its third call; a launch hook
    or another current device sends it through launch() again, and a one-off Prepared never looks its entry up."""
    x, y = torch.zeros(4), torch.zeros(4)
    prepared = L.Prepared(fake, (3, 2), (64, 16, 1000, 0.5), {"BLOCK": 32, "num_warps": 4})
    slots = []
    real_slot = L._slot
    monkeypatch.setattr(L, "_slot", lambda *a: slots.append(1) or real_slot(*a))
    for _ in range(4):
        prepared(x, y)
    assert paths(fake) == ["triton", "direct", "direct", "direct"]
    assert fake.log[1] == fake.log[2] == fake.log[3]  # the runner's arguments: grid, stream, args, constexprs
    assert len(slots) == 3  # launch() twice, the bind once; none for the bound calls
    monkeypatch.setattr(L, "_launch_hooked", lambda: True)
    prepared(x, y)
    assert paths(fake)[-1] == "triton"
    monkeypatch.setattr(L, "_launch_hooked", lambda: False)
    monkeypatch.setattr(L, "_current_device", lambda: 1)
    prepared(x, y)
    assert paths(fake)[-1] == "triton"  # device 1 has no kept entry yet: compiled there through Triton
    # descriptors: bound, their parts go straight to a runner that takes them (no descriptor objects)
    class Maker:
        parts = ([64, 64], [64, 1], "zero")

        def __call__(self, t):
            return ("descriptor of", t)
    handed = []

    def runner(*a):
        handed.append(("descriptor objects", a))
    runner.from_parts = lambda *a: handed.append(("parts", a))
    with_desc = L.Prepared(fake, (1,), (64, 16, 1000, 0.5), {"BLOCK": 32}, (Maker(),))
    with_desc._bound = (1, runner, ("tail",), (1, 1, 1), runner.from_parts)
    with_desc(x, y)
    assert handed == [("parts", (1, 1, 1, "stream", [(x, [64, 64], [64, 1], "zero")], (y, 64, 16, 1000, 0.5),
                                 ("tail",)))]
    with_desc._bound = (1, runner, ("tail",), (1, 1, 1), None)
    with_desc(x, y)
    assert handed[-1] == ("descriptor objects", (1, 1, 1, "stream", (("descriptor of", x), y, 64, 16, 1000, 0.5),
                                                 ("tail",)))
    one_off = L.Prepared(fake, (3, 2), (64, 16, 1000, 0.5), {"BLOCK": 32, "num_warps": 4})
    slots.clear()
    one_off(x, y)
    assert len(slots) == 1 and one_off._bound is None


def test_prepared_varying_numbers_reach_the_kernel_and_bind_only_where_unkeyed(fake):
    """`Prepared.run` gives each call its own values at the varying positions (a varlen batch's LSE stride): they
    reach the kernel through launch() and, bound, through the kept runner. A varying number the kernel keys never
    binds (each value may be its own specialisation), and a value past 32 bits goes through launch()."""
    x, y = torch.zeros(4), torch.zeros(4)
    prepared = L.Prepared(fake, (1,), (64, 16, 0, 0.5), {"BLOCK": 32}, varying=(2,))  # per_batch: do_not_specialize
    for value in (1000, 889, 17, 5):
        prepared.run((x, y), (value,))
    assert paths(fake) == ["triton", "direct", "direct", "direct"]
    assert prepared._bound is not None
    assert [entry[2][4] if entry[0] == "triton" else entry[1][9 + 4] for entry in fake.log] == [1000, 889, 17, 5]
    prepared.run((x, y), (2**40,))
    assert paths(fake)[-1] == "triton" and fake.log[-1][2][4] == 2**40
    prepared(x, y)  # a plain call: the prepared numbers
    assert fake.log[-1][1][9 + 4] == 0
    keyed = L.Prepared(fake, (1,), (64, 16, 1000, 0.5), {"BLOCK": 64}, varying=(0,))  # n: specialised on
    for n in (64, 64, 64, 48):
        keyed.run((x, y), (n,))
    assert keyed._bound is None
    assert [entry[1][9 + 2] for entry in fake.log[-4:] if entry[0] == "direct"] == [64, 64]  # launch()'s own entries


# Run without the interpreter (a fresh process: the kernels are then Triton's JITFunctions, whose parameters say which
# numbers are do_not_specialize), every compiled launcher a no-op: the launchers' plans on BERT's varlen path.
_BIND_PROBE = """
import os, sys
import torch
from triton.runtime.jit import JITFunction
import kernels.flash as F
import kernels.launch as L

class Compiled:
    def _init_handles(self):
        pass

JITFunction.run = lambda self, *args, **kwargs: Compiled()
L._runner = lambda compiled, leading: (lambda *args: None)
L._current_device = lambda: 0
L._current_stream = lambda device: 0
F._interpreting = L._interpreting = lambda: False
prepared = []
real_init = L.Prepared.__init__
def record(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    prepared.append(self)
L.Prepared.__init__ = record
head_dim, dropout_p = int(sys.argv[1]), float(sys.argv[2])
F._fused_bwd = lambda q, p, block_d: p > 0  # as on an H100 at head dims up to 32 (it wants CUDA tensors)
for lengths in ([5, 37, 20], [30, 3, 40], [9, 40, 14]):  # one plan: the same count, the longest rounds to 48
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, do = (torch.randn(sum(lengths), 2, head_dim, dtype=torch.bfloat16) for _ in range(4))
    o, lse, seed = F._flash_fwd(q, k, v, 0.125, False, dropout_p, True, cu, cu, 40, 40)
    F._flash_bwd(do, q, k, v, o, lse, seed, 0.125, False, dropout_p, True, cu, cu, 40, 40)
print(" ".join(f"{p.kernel.fn.__name__}:{p._bound is not None}" for p in prepared))
"""


@pytest.mark.parametrize("head_dim, dropout_p, expected", [
    (64, 0.0, "_fwd_kernel:True _bwd_dq_kernel:True _bwd_dkdv_kernel:True"),
    # the fused backward: delta's launch binds; the dK/dV kernel is specialised on its dQ rows (a packed length)
    (32, 0.1, "_fwd_kernel:True _bwd_preprocess_kernel:True _bwd_dkdv_kernel:False")])
def test_varlen_plans_bind_across_packed_lengths(head_dim, dropout_p, expected):
    """Three varlen batches of other packed lengths share one plan, and from the third call its launches call the kept
    runner directly (the LSE strides passed each call are do_not_specialize): checked on Triton's own kernel objects,
    in a process without the interpreter."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FLASH_AUTOTUNE"] = "0"
    out = subprocess.run([sys.executable, "-c", _BIND_PROBE, str(head_dim), str(dropout_p)], env=env, cwd=os.getcwd(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == expected


def test_hooks_and_interpreter_take_triton_path(fake, monkeypatch):
    x, y = torch.zeros(64), torch.zeros(64)
    args = (x, y, 64, 16, 1000, 0.5)
    L.launch(fake, (1,), args, {"BLOCK": 32})
    monkeypatch.setattr(L, "_launch_hooked", lambda: True)
    L.launch(fake, (1,), args, {"BLOCK": 32})
    monkeypatch.setattr(L, "_launch_hooked", lambda: False)
    monkeypatch.setattr(L, "_interpreting", lambda: True)
    L.launch(fake, (1,), args, {"BLOCK": 32})
    assert paths(fake) == ["triton"] * 3


def test_no_hook_means_not_hooked_on_this_triton(monkeypatch):
    """Triton 3.6 keeps the launch hooks as (empty) HookChains, not None: an empty chain must not count as a hook,
    or no launch ever takes the direct path (as happened until session 26); a function added to it must."""
    from triton import knobs

    assert not L._launch_hooked()
    hook = lambda metadata: None  # noqa: E731
    if isinstance(knobs.runtime.launch_enter_hook, getattr(knobs, "HookChain", ())):
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            assert L._launch_hooked()
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
        assert L._launch_hooked()
    assert not L._launch_hooked()


def test_descriptors_are_keyed_by_what_triton_specialises_on(fake):
    """Host TMA descriptors (Triton's and Gluon's) may lead the arguments: a new shape or base of the same block
    shape and layout is direct (the launcher encodes them each call); a new block shape, dtype or layout is not."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    x, y = torch.zeros(64, 64), torch.zeros(64)
    half = x.half()
    lay = gl.NVMMASharedLayout.get_default_for([16, 64], gl.float32)
    other_lay = gl.NVMMASharedLayout.get_default_for([16, 64], gl.float32, transposed=True)

    def tools(t, block, shape=(64, 64)):
        return TensorDescriptor(t, list(shape), [64, 1], block)

    def gluon(t, block, layout, shape=(64, 64)):
        return GluonDescriptor(t, list(shape), [64, 1], block, layout)

    rest = (64, 16, 1000, 0.5)
    L.launch(fake, (1,), (tools(x, [16, 64]), y, *rest), {"BLOCK": 32})
    L.launch(fake, (1,), (tools(torch.zeros(64, 64), [16, 64], (48, 64)), y, *rest), {"BLOCK": 32})
    L.launch(fake, (1,), (tools(x, [32, 64]), y, *rest), {"BLOCK": 32})
    L.launch(fake, (1,), (tools(half, [16, 64]), y, *rest), {"BLOCK": 32})
    assert paths(fake) == ["triton", "direct", "triton", "triton"]
    assert fake.log[1][1][9].shape == [48, 64]  # the launcher got this call's descriptor
    fake.log.clear()
    L.launch(fake, (1,), (gluon(x, [16, 64], lay), y, *rest), {"BLOCK": 32})
    L.launch(fake, (1,), (gluon(x, [16, 64], lay, (32, 64)), y, *rest), {"BLOCK": 32})
    L.launch(fake, (1,), (gluon(x, [16, 64], other_lay), y, *rest), {"BLOCK": 32})
    L.launch(fake, (1,), (tools(x, [16, 64]), y, *rest), {"BLOCK": 32})  # Triton's, kept since the first launch
    assert paths(fake) == ["triton", "direct", "triton", "direct"]


@pytest.mark.gpu
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_direct_launches_match_triton_launches(varlen, monkeypatch):
    """The same inputs through Triton's path (launch hook set) and the direct path: bit-identical outputs and
    gradients, causal with dropout, on aligned and misaligned views."""
    from kernels.flash import flash_attn_func, flash_attn_varlen_func

    def run(q, k, v):
        torch.manual_seed(0)
        if varlen:
            cu = torch.tensor([0, 100, 301], dtype=torch.int32, device="cuda")
            out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 201, 201, causal=True, dropout_p=0.1)
        else:
            out = flash_attn_func(q, k, v, causal=True, dropout_p=0.1)
        return (out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))

    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 301 * 3 * 4 * 64 + 8, generator=g).to("cuda", torch.bfloat16)
    for offset in (0, 8, 3):  # 3 elements: 6 bytes, a pointer Triton does not take as 16-byte aligned
        qkv = base[:, offset:offset + 301 * 3 * 4 * 64].view(1, 301, 3, 4, 64)
        q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(2))
        monkeypatch.setattr(L, "_launch_hooked", lambda: True)
        slow = run(q, k, v)
        monkeypatch.setattr(L, "_launch_hooked", lambda: False)
        run(q, k, v)  # keeps the compiled kernels
        before = L.cached_specialisations()
        fast = run(q, k, v)
        assert L.cached_specialisations() == before  # all four launches hit
        for a, b in zip(slow, fast):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_gpu_gluon_direct_launches_match_triton_launches(dropout_p, monkeypatch):
    """The Gluon kernels take host TMA descriptors, which the direct path encodes itself (launch's `_runner`): the
    same inputs through Triton's path and the direct one give the same output, dK and dV bit for bit, and dQ to
    float32 rounding (its reduce adds in a varying order)."""
    from kernels import flash_gluon
    from kernels.flash import flash_attn_func

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels need an sm_90 GPU")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 1024, 4, 64, generator=g).to("cuda", torch.bfloat16).requires_grad_() for _ in range(3))

    def run():
        torch.manual_seed(0)
        out = flash_attn_func(q, k, v, causal=True, dropout_p=dropout_p)
        return (out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))

    monkeypatch.setattr(L, "_launch_hooked", lambda: True)
    slow = run()
    monkeypatch.setattr(L, "_launch_hooked", lambda: False)
    run()  # keeps the compiled kernels
    assert L.compiled_entries(flash_gluon._bwd_split_kernel) > 0  # the Gluon backward ran, through launch()
    before = L.cached_specialisations()
    fast = run()  # the plans' prepared launches bound (Prepared._bind): the kept runners, no key
    assert L.cached_specialisations() == before
    from kernels import flash as F

    backward, = (p for p in F._PLANS.values() if isinstance(p, F._GluonBackward))
    assert backward.kernel._bound is not None and backward.preprocess._bound is not None
    for name, a, b in zip(("out", "dq", "dk", "dv"), slow, fast):
        if name == "dq":
            torch.testing.assert_close(b, a, atol=2e-3, rtol=1e-2)
        else:
            assert torch.equal(a, b), name


def test_runner_passes_what_tritons_own_launcher_path_passes(monkeypatch):
    """launch()'s runner calls Triton 3.6's compiled launch function past its Python wrapper and encodes the leading
    TMA descriptors itself: on the CPU, with Triton's real wrapper (`wrap_handle_tensordesc`) and `CudaLauncher.__call__`
    around a recording stand-in for the compiled function and for the CUDA encoder, both paths must hand it the same
    arguments. A Triton that changes this layout fails here (or makes `_runner` fall back to compiled.run)."""
    from types import SimpleNamespace

    from triton.backends.nvidia.driver import CudaLauncher, wrap_handle_tensordesc
    from triton.runtime import driver
    from triton.tools.tensor_descriptor import TensorDescriptor

    def fill(*args):  # the encoder: its arguments stand for the CUtensorMap
        return ("tensormap", *[tuple(a) if isinstance(a, list) else a for a in args])

    monkeypatch.setattr(driver, "_active", SimpleNamespace(utils=SimpleNamespace(fill_tma_descriptor=fill)))
    monkeypatch.setattr(L, "_tma_filler", lambda: fill)
    calls = []
    raw = lambda *args: calls.append(args)  # noqa: E731  (the compiled launch function)
    signature = {0: "tensordesc<bf16[64, 64]>", 1: "tensordesc<fp32[16, 64]>", 2: "*fp32", 3: "i32", 4: "fp32",
                 5: "constexpr"}
    metas = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=[64, 64], fp4_padded=False),
             dict(swizzle=2, elem_size=4, elem_type=7, block_size=[16, 64], fp4_padded=False)]
    run = SimpleNamespace(launch=wrap_handle_tensordesc(raw, signature, metas), global_scratch_size=0,
                          global_scratch_align=1, profile_scratch_size=0, profile_scratch_align=1,
                          launch_cooperative_grid=False, launch_pdl=False, num_ctas=1)
    compiled = SimpleNamespace(run=run, function="fn", packed_metadata="meta")
    x, y = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(32, 64)
    args = (TensorDescriptor(x, [128, 64], [64, 1], [64, 64]),
            TensorDescriptor(y, [32, 64], [64, 1], [16, 64], padding="nan"), torch.zeros(4), 7, 0.5)
    tail = (32,)
    CudaLauncher.__call__(run, 3, 2, 1, "stream", "fn", "meta", None, None, None, *args, *tail)
    runner = L._runner(compiled, tuple(map(L._leading_key, args[:3])))
    runner(3, 2, 1, "stream", args, tail)
    assert len(calls) == 2 and calls[0][:13] == (3, 2, 1, "stream", "fn", False, False, None, None, "meta", None,
                                                 None, None)
    assert calls[1][:13] == calls[0][:13] and calls[1][13:-4] == calls[0][13:-4]
    assert calls[1][-4] is calls[0][-4]  # the same tensor, then the numbers and the constexpr
    assert calls[1][-3:] == calls[0][-3:] == (7, 0.5, 32)
    # a bound Prepared hands the descriptors' parts instead: the same call
    runner.from_parts(3, 2, 1, "stream", [(d.base, d.shape, d.strides, d.padding) for d in args[:2]], args[2:], tail)
    assert calls[2][:-3] == calls[1][:-3] and calls[2][-4] is calls[1][-4] and calls[2][-3:] == calls[1][-3:]
    # a launcher with scratch memory keeps compiled.run
    run.global_scratch_size = 128
    assert L._runner(compiled, tuple(map(L._leading_key, args[:3]))).__name__ == "generic"


def test_environment_reads_follow_a_rebound_os_environ(monkeypatch):
    """`_env_is` reads the dict behind os.environ, looked up on every call: HF datasets' multiprocess map rebinds
    os.environ to a copy, after which a kept reference would miss every change (as it did in session 47's CI)."""
    import copy
    import os

    monkeypatch.setenv("FLASH_TEST_FLAG", "1")
    assert L._env_is("FLASH_TEST_FLAG", "1")
    monkeypatch.setattr(os, "environ", copy.deepcopy(os.environ))  # what datasets does
    os.environ["FLASH_TEST_FLAG"] = "0"
    assert L._env_is("FLASH_TEST_FLAG", "0") and not L._env_is("FLASH_TEST_FLAG", "1")
    monkeypatch.setattr(os, "environ", {"FLASH_TEST_FLAG": "2"})  # a plain mapping: os.environ.get's answer
    assert L._env_is("FLASH_TEST_FLAG", "2")
    del os.environ["FLASH_TEST_FLAG"]
    assert not L._env_is("FLASH_TEST_FLAG", "2")
