"""torch.compile over our kernels: the flash and block-sparse kernels are operators (kernels/ops.py: flashattn::fwd /
::bwd, flashattn::blocksparse_fwd / _bwd, and each one's packed-qkv pair, *_qkvpacked, whose backward writes one
gradient shaped like qkv) with fake implementations, called from autograd Functions that Dynamo traces, so a model
that calls them compiles to one graph that never enters the launchers or the autotuner. On the CPU the graphs run
with the aot_eager backend (inductor compiles C++ for minutes); the GPU tests use inductor."""
import pytest
import torch

import kernels.flash  # noqa: F401  (importing it registers the flashattn:: operators)
from kernels.attention import FlashAttention
from models.gpt2 import GPT2

TINY = dict(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2)


def _inputs(device, varlen=False):
    g = torch.Generator().manual_seed(0)
    if varlen:
        q, k, v = (torch.randn(37, 2, 16, generator=g).to(device).requires_grad_() for _ in range(3))
        cu = torch.tensor([0, 20, 37], dtype=torch.int32, device=device)
        return q, k, v, cu, cu, 20, 20
    q, k, v = (torch.randn(2, 24, 2, 16, generator=g).to(device).requires_grad_() for _ in range(3))
    return q, k, v, None, None, 24, 24


# The operators carry no autograd formula (kernels/ops.py: the autograd Functions that call them do), so they are
# checked on inputs that do not require grad. The dense case runs every other check; varlen skips the slowest (AOT
# dispatch with dynamic shapes).
_OPCHECKS = {False: ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
             True: ("test_schema", "test_faketensor")}


@pytest.mark.parametrize("varlen", [False, True])
def test_ops_pass_opcheck(varlen, device):
    q, k, v, cu_q, cu_k, mq, mk = (t.detach() if isinstance(t, torch.Tensor) else t for t in _inputs(device, varlen))
    checks = _OPCHECKS[varlen]
    fwd_args = (q, k, v, cu_q, cu_k, mq, mk, 0.25, True, 0.0)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, fwd_args, test_utils=checks)
    o, lse, seed = torch.ops.flashattn.fwd(*fwd_args)
    bwd_args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse, seed, cu_q, cu_k, mq, mk,
                0.25, True, 0.0)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, bwd_args, test_utils=checks)


@pytest.mark.parametrize("varlen", [False, True])
def test_packed_qkv_ops_pass_opcheck(varlen, device):
    g = torch.Generator().manual_seed(0)
    if varlen:
        qkv, cu, ms = torch.randn(37, 3, 2, 16, generator=g).to(device), torch.tensor([0, 20, 37], dtype=torch.int32,
                                                                                     device=device), 20
    else:
        qkv, cu, ms = torch.randn(2, 24, 3, 2, 16, generator=g).to(device), None, 24
    checks = _OPCHECKS[varlen]
    fwd_args = (qkv, cu, ms, 0.25, True, 0.0)
    torch.library.opcheck(torch.ops.flashattn.fwd_qkvpacked.default, fwd_args, test_utils=checks)
    o, lse, seed = torch.ops.flashattn.fwd_qkvpacked(*fwd_args)
    bwd_args = (torch.randn_like(o), qkv.detach(), o.detach(), lse, seed, cu, ms, 0.25, True, 0.0)
    torch.library.opcheck(torch.ops.flashattn.bwd_qkvpacked.default, bwd_args, test_utils=checks)


@pytest.mark.parametrize("varlen", [False, True])
def test_compiled_attention_runs_the_operators_with_eager_gradients(varlen, device):
    """flash_attn_func / flash_attn_varlen_func compiled: the forward graph calls flashattn::fwd, the backward graph
    flashattn::bwd (the autograd Function's two halves), and values and gradients equal eager ones."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from kernels.flash import flash_attn_func, flash_attn_varlen_func

    graphs = []

    def record(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return make_boxed_func(gm)

    q, k, v, cu_q, cu_k, mq, mk = _inputs(device, varlen)
    do = torch.randn_like(q)

    def attn(q, k, v):
        if varlen:  # cu_q is cu_k: one tensor given twice, which the Function must take (kernels.ops.distinct)
            return flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, check_seqlens=False)
        return flash_attn_func(q, k, v, causal=True) + flash_attn_func(q, q, q)  # q is k is v in the second call

    torch._dynamo.reset()
    out = torch.compile(attn, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref = attn(q, k, v)
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, torch.autograd.grad(ref, (q, k, v), do)):
        torch.testing.assert_close(got, want)
    forward, backward = graphs
    assert "flashattn.fwd.default" in forward and "flashattn.bwd.default" not in forward, forward
    assert "flashattn.bwd.default" in backward and "flashattn.fwd.default" not in backward, backward


@pytest.mark.parametrize("kind", ["flash", "blocksparse"])
def test_compiled_packed_attention_takes_the_packed_gradient_op(kind, device):
    """Compiled self-attention on a fused projection's qkv (what the models call) runs the packed-qkv ops, whose
    backward writes one gradient shaped like qkv, so no stack of three gradients is left for the compiler to copy;
    values and gradients equal eager ones."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from kernels import sparsity
    from kernels.blocksparse import blocksparse_attn_qkvpacked_func
    from kernels.flash import flash_attn_qkvpacked_func

    seen = []

    def record(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm)

    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 32, 3, 2, 16, generator=g).to(device).requires_grad_()
    do = torch.randn(2, 32, 2, 16, generator=g).to(device)
    if kind == "flash":
        def attn(x):
            return flash_attn_qkvpacked_func(x, causal=True)
    else:
        layout = sparsity.make_layout("butterfly", 32, 32, 16, device=device)

        def attn(x):
            return blocksparse_attn_qkvpacked_func(x, layout, causal=True)
    out = torch.compile(attn, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))(qkv)
    (grad,) = torch.autograd.grad(out, qkv, do)
    ref = attn(qkv)
    (ref_grad,) = torch.autograd.grad(ref, qkv, do)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, ref_grad)
    prefix = "flashattn." if kind == "flash" else "flashattn.blocksparse_"
    assert f"{prefix}fwd_qkvpacked.default" in seen and f"{prefix}bwd_qkvpacked.default" in seen, seen
    assert not any("stack" in t or "cat" in t for t in seen), seen


def test_gpt2_with_flash_compiles_to_one_graph(device):
    torch.manual_seed(0)
    model = GPT2(**TINY, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, attention_factory=FlashAttention).to(device)
    ids = torch.randint(0, 50, (2, 32), device=device)
    ref = model(ids)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: any graph break raises
    out = compiled(ids)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    for got, want in zip((p.grad for p in model.parameters()), ref_grads):
        torch.testing.assert_close(got, want)


def test_compiled_dropout_draws_a_new_mask_per_call(device):
    torch.manual_seed(0)
    model = GPT2(**TINY, attn_pdrop=0.3, attention_factory=FlashAttention).to(device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ids = torch.randint(0, 50, (2, 32), device=device)
    torch.manual_seed(1)
    a = compiled(ids)
    b = compiled(ids)
    assert not torch.equal(a, b)
    torch.manual_seed(1)  # the seed comes from torch's generator, so it replays
    torch.testing.assert_close(compiled(ids), a)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["flash", "blocksparse"])
def test_gpu_gpt2_inductor_matches_eager(kind):
    """Inductor around the operators: forward and gradients as in eager, in one graph."""
    import functools

    from kernels.attention import BlockSparseAttention

    factory = FlashAttention if kind == "flash" else functools.partial(BlockSparseAttention, pattern="butterfly",
                                                                         block_size=16)
    torch.manual_seed(0)
    model = GPT2(**TINY, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, attention_factory=factory).cuda()
    ids = torch.randint(0, 50, (4, 32), device="cuda")

    def loss_and_grads(m):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(ids).float()
        out.square().mean().backward()
        return out.detach(), [p.grad.detach().clone() for p in model.parameters()]

    ref, ref_grads = loss_and_grads(model)
    out, grads = loss_and_grads(torch.compile(model, fullgraph=True))
    torch.testing.assert_close(out, ref, atol=3e-2, rtol=3e-2)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=3e-2, rtol=5e-2)


@pytest.mark.gpu
def test_gpu_gpt2_reduce_overhead_trains_as_eager():
    """compile_mode=reduce-overhead (inductor's CUDA graphs) around the flash operators: without dropout, five SGD
    steps take the eager run's losses; with attention dropout, each replay draws a new mask."""
    def losses(compile_mode, attn_pdrop=0.0, steps=5, lr=0.1):
        torch.manual_seed(0)
        model = GPT2(**TINY, attn_pdrop=attn_pdrop, embd_pdrop=0.0, resid_pdrop=0.0,
                     attention_factory=FlashAttention).cuda()
        step = torch.compile(model, mode=compile_mode) if compile_mode else model
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ids = torch.randint(0, 50, (4, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        out = []
        for _ in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step(ids).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
        return out

    torch._dynamo.reset()
    torch.testing.assert_close(losses("reduce-overhead"), losses(None), atol=3e-2, rtol=3e-2)
    # lr 0: the weights stay put, so equal losses would mean a mask frozen into the graph
    with_dropout = losses("reduce-overhead", attn_pdrop=0.3, steps=4, lr=0.0)
    assert len(set(with_dropout)) == 4, with_dropout
    assert with_dropout[0] != losses("reduce-overhead", steps=1, lr=0.0)[0]


@pytest.mark.gpu
def test_gpu_gpt2_run_with_reduce_overhead_logs_what_plain_compile_logs(tmp_path):
    """The real runner with compile=true compile_mode=reduce-overhead: Lightning logs every step's loss and the
    validation loss while each replay overwrites the CUDA graphs' outputs. Without dropout, every logged loss equals
    plain compile's to bf16 rounding; a stale output read late would log a repeated or wrong value."""
    from tests.test_train_run import metrics, run_inprocess, series

    common = ["model=gpt2", "debug=smoke", "attn=flash", "compile=true", "model.embd_pdrop=0", "model.attn_pdrop=0",
              "model.resid_pdrop=0", "trainer.max_steps=8", "trainer.log_every_n_steps=1", "eval_every_steps=4"]
    logged = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        run_inprocess(common + [f"compile_mode={mode}"], tmp_path / mode)
        rows = metrics(tmp_path / mode)
        logged[mode] = (series(rows, "train/loss"), series(rows, "val/loss"))
    (train_plain, val_plain), (train_graphs, val_graphs) = logged["default"], logged["reduce-overhead"]
    assert len(train_plain) == 8 and len(set(train_graphs.values())) == 8, train_graphs
    assert sorted(val_graphs) == sorted(val_plain) and len(val_plain) == 2
    for got, want in ((train_graphs, train_plain), (val_graphs, val_plain)):
        for step, value in want.items():
            assert got[step] == pytest.approx(value, rel=2e-2, abs=2e-2), step


def test_gpt2_with_blocksparse_compiles_to_one_graph(device):
    import functools

    from kernels.attention import BlockSparseAttention

    torch.manual_seed(0)
    factory = functools.partial(BlockSparseAttention, pattern="butterfly", block_size=16)
    model = GPT2(**TINY, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, attention_factory=factory).to(device)
    ids = torch.randint(0, 50, (2, 32), device=device)
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(ids)  # compiled before any eager call
    torch.testing.assert_close(out, model(ids))


@pytest.mark.parametrize("kind", ["flash", "blocksparse"])
def test_padded_classifier_compiles(kind, device):
    """Padded batches compile too; building the PackedBatch (its one host sync) is a graph break, so this
    model is compiled without fullgraph."""
    import functools

    from kernels.attention import BlockSparseAttention
    from models.encoder import SequenceClassifier

    factory = FlashAttention if kind == "flash" else functools.partial(BlockSparseAttention, pattern="local",
                                                                       block_size=16, window=1)
    torch.manual_seed(0)
    model = SequenceClassifier(vocab_size=50, num_classes=3, max_positions=32, d_model=32, n_layer=2, n_head=2,
                               attention_factory=factory).to(device).eval()
    ids = torch.randint(0, 50, (2, 32), device=device)
    mask = torch.arange(32, device=device)[None] < torch.tensor([32, 11], device=device)[:, None]
    torch.testing.assert_close(torch.compile(model, backend="aot_eager")(ids, mask), model(ids, mask))


def test_packed_encoder_compiles_per_block_once_for_every_batch(device):
    """compile=true on a packing encoder (train.task.compile_model): each Block compiled on its own, dynamic in
    the token count, so batches of other lengths and token counts reuse the first graph (no recompilation)
    and the gradients equal eager ones."""
    import copy

    from models.encoder import EncoderForMaskedLM
    from train.task import compile_model

    torch.manual_seed(0)
    model = EncoderForMaskedLM(vocab_size=50, max_positions=32, d_model=32, n_layer=2, n_head=2, dropout=0.0,
                               attn_dropout=0.0, attention_factory=FlashAttention).to(device)
    compiled = copy.deepcopy(model)
    compile_model(compiled, backend="aot_eager")
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in compiled.transformer.blocks)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lengths in ([32, 11], [7, 25], [30, 30]):  # 43, 32 and 60 real tokens
            ids = torch.randint(0, 50, (2, 32), device=device)
            mask = torch.arange(32, device=device)[None] < torch.tensor(lengths, device=device)[:, None]
            want, got = model(ids, mask)[0], compiled(ids, mask)[0]
            torch.testing.assert_close(got, want)
            got.float().square().sum().backward()
            want.float().square().sum().backward()
            for (name, a), b in zip(compiled.named_parameters(), model.parameters()):
                torch.testing.assert_close(a.grad, b.grad, msg=name)
            model.zero_grad(), compiled.zero_grad()


def test_packed_encoder_compiles_whole_with_host_lengths(device):
    """compile=model on a packing encoder: with the lengths given from the host (as the task does) packing
    needs no sync, so the whole model is one graph (a graph break would count a second), reused by batches
    of other lengths and token counts after the first (dynamic); outputs and gradients equal eager ones."""
    import copy

    from models.encoder import EncoderForMaskedLM
    from train.task import compile_model

    torch.manual_seed(0)
    model = EncoderForMaskedLM(vocab_size=50, max_positions=32, d_model=32, n_layer=2, n_head=2, dropout=0.0,
                               attn_dropout=0.0, attention_factory=FlashAttention).to(device)
    compiled = copy.deepcopy(model)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward),
                            bw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)

    compile_model(compiled, scope="model", backend=counting_backend)
    torch._dynamo.reset()
    for step, lengths in enumerate(([32, 11], [7, 25], [30, 30])):  # 43, 32 and 60 real tokens
        ids = torch.randint(0, 50, (2, 32), device=device)
        mask = torch.arange(32, device=device)[None] < torch.tensor(lengths, device=device)[:, None]
        positions = torch.tensor([[0, 5], [1, 6]], device=device)
        want = model(ids, mask, masked_positions=positions, seq_lengths=lengths)
        got = compiled(ids, mask, masked_positions=positions, seq_lengths=lengths)
        torch.testing.assert_close(got, want)
        sum(x.float().square().sum() for x in got).backward()  # both heads, so every parameter has a gradient
        sum(x.float().square().sum() for x in want).backward()
        for (name, a), b in zip(compiled.named_parameters(), model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, msg=name)
        model.zero_grad(), compiled.zero_grad()
        if step == 0:
            first = len(graphs)
    assert first <= 2 and len(graphs) == first  # no graph break (one graph); no recompile for new lengths
    with pytest.raises(ValueError, match="compile scope"):
        compile_model(copy.deepcopy(model), scope="layers")


def test_task_compile_option_picks_the_scope():
    """compile=true compiles a packing encoder's blocks, compile=model the whole model, anything else fails."""
    from models.encoder import EncoderForMaskedLM
    from train.task import MLMTask

    def fresh():
        return EncoderForMaskedLM(vocab_size=50, max_positions=32, d_model=32, n_layer=2, n_head=2)

    blocks = MLMTask(fresh(), compile=True).model
    assert blocks._compiled_call_impl is None and all(b._compiled_call_impl is not None for b in blocks.transformer.blocks)
    whole = MLMTask(fresh(), compile="model").model
    assert whole._compiled_call_impl is not None and all(b._compiled_call_impl is None for b in whole.transformer.blocks)
    with pytest.raises(ValueError, match="compile scope"):
        MLMTask(fresh(), compile="layers")


def test_task_compile_mode_reaches_torch_compile(monkeypatch):
    """compile_mode=reduce-overhead is handed to torch.compile as its mode; an unknown mode, or a mode without
    compile=true, fails at once instead of training uncompiled."""
    from train import task as task_module
    from train.task import LMTask

    seen = []
    monkeypatch.setattr(task_module, "compile_model", lambda model, scope, **kw: seen.append((scope, kw)))
    LMTask(GPT2(**TINY), compile=True, compile_mode="reduce-overhead")
    LMTask(GPT2(**TINY), compile=True)
    assert seen == [("blocks", {"mode": "reduce-overhead"}), ("blocks", {})]
    with pytest.raises(ValueError, match="choose one of"):
        LMTask(GPT2(**TINY), compile=True, compile_mode="fast")
    with pytest.raises(ValueError, match="set compile=true"):
        LMTask(GPT2(**TINY), compile_mode="reduce-overhead")
