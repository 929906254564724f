"""cuda_graph=true (train/cuda_graph.py): graphed training matches eager training, dropout stays random
and reproducible, and every case a graph cannot follow is refused with an error that says why."""
import contextlib
import copy
import gc
import weakref

import pytest
import torch

from models.encoder import SequenceClassifier
from train.cuda_graph import GraphedModel, GraphedStep, collector_paused, make_capturable
from train.task import ClassificationTask

CUDA = torch.cuda.is_available()


def classifier(attention="standard", dropout=0.0, seed=0, attn_dropout=None):
    from kernels.attention import FlashAttention, StandardAttention

    torch.manual_seed(seed)
    factory = {"standard": StandardAttention, "flash": FlashAttention}[attention]
    return SequenceClassifier(vocab_size=257, num_classes=10, max_positions=129, d_model=32, n_layer=2, n_head=1,
                              d_ff=64, dropout=dropout, attn_dropout=dropout if attn_dropout is None else attn_dropout,
                              pooling="cls",
                              attention_factory=factory)


def batches(n, batch=8, length=129, device="cuda"):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 257, (batch, length), generator=g).to(device),
             torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(n)]


def train_steps(model, call, data, accumulate=1, set_to_none=True):
    """AdamW steps, each over `accumulate` micro-batches (Lightning's order: forward, zero_grad, backward);
    the losses as floats."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for i, (ids, labels) in enumerate(data):
        loss = torch.nn.functional.cross_entropy(call(input_ids=ids).float(), labels)
        if i % accumulate == 0:
            opt.zero_grad(set_to_none=set_to_none)
        loss.backward()
        if i % accumulate == accumulate - 1:
            opt.step()
        losses.append(loss.item())
    return losses


# ---- refused, with the reason (CPU) ----------------------------------------------------------------

def test_inputs_a_graph_cannot_follow_are_refused():
    g = GraphedModel(classifier())
    ids = torch.zeros(2, 129, dtype=torch.long)
    with pytest.raises(ValueError, match="attention mask"):
        g(input_ids=ids, attention_mask=torch.ones_like(ids))
    with pytest.raises(TypeError, match="tensors only"):
        g(input_ids=ids, seq_lengths=[129, 129])


def test_evaluation_runs_the_plain_model():
    model = classifier().eval()
    ids = torch.randint(0, 257, (2, 129))
    with torch.no_grad():
        torch.testing.assert_close(GraphedModel(model)(input_ids=ids), model(input_ids=ids), rtol=0, atol=0)


def test_cuda_graph_with_compile_is_refused():
    with pytest.raises(ValueError, match="choose one"):
        ClassificationTask(classifier(), compile=True, cuda_graph=True)


@pytest.mark.skipif(CUDA, reason="checks the CPU refusal")
def test_cpu_run_with_cuda_graph_says_it_needs_a_gpu(tmp_path):
    from tests.test_train_run import run_inprocess

    with pytest.raises(ValueError, match="needs a CUDA device"):
        run_inprocess(["experiment=lra/image", "cuda_graph=true", "trainer.max_steps=2"], tmp_path)


def test_collector_paused_collects_first_and_restores_the_collector():
    """A capture must not meet Python's cyclic collector (train/cuda_graph.py, collector_paused): garbage in
    cycles is freed on entry, the collector stays off inside, and its earlier state comes back, on errors too."""
    freed = []

    class Node:
        pass

    gc.disable()  # keep the cycle until collector_paused frees it
    node = Node()
    node.self = node
    weakref.finalize(node, freed.append, "cycle")
    del node
    gc.enable()
    with collector_paused():
        assert freed == ["cycle"] and not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()


def test_step_capture_runs_with_the_collector_paused(monkeypatch):
    """cuda_graph=step's capture (CPU, the graph faked): the collector is off while the step is captured, and on
    again after."""
    import train.cuda_graph as cg

    during = []

    @contextlib.contextmanager
    def fake_graph(graph, **kwargs):
        during.append(gc.isenabled())
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state: None)
    graph, out = cg._cuda_capture(lambda batch: batch + 1, torch.zeros(()))
    assert (graph, out.item()) == ("graph", 1.0)
    assert during == [False] and gc.isenabled()


def test_model_capture_runs_with_the_collector_paused(monkeypatch):
    """cuda_graph=true's capture (CPU, make_graphed_callables faked, the input a stand-in that says it is on
    CUDA): the collector is off while the model is captured, and on again after."""
    import types

    during = []

    def fake_make_graphed_callables(module, sample_args, **kwargs):
        during.append(gc.isenabled())
        return module

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_make_graphed_callables)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state: None)
    ids = types.SimpleNamespace(device=torch.device("cuda"), clone=lambda: None)
    GraphedModel(classifier())._capture((), {"input_ids": ids})
    assert during == [False] and gc.isenabled()


# ---- on the GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_graphed_training_matches_eager(attention):
    """Without dropout the graphed and eager runs take the same steps (float32, no autocast)."""
    data = batches(5)
    inputs = [ids.clone() for ids, _ in data]
    eager = classifier(attention).cuda()
    graphed = copy.deepcopy(eager)
    want = train_steps(eager, eager, data)
    got = train_steps(graphed, GraphedModel(graphed), data)
    assert got[-1] < got[0]
    assert all(torch.equal(a, ids) for a, (ids, _) in zip(inputs, data))  # the caller's batches untouched
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("accumulate,set_to_none", [(2, True), (1, False), (3, False)])
def test_graphed_gradients_accumulate_as_eager_ones(accumulate, set_to_none):
    """The graph hands its gradient buffers to the parameters; a second backward must add, not overwrite."""
    data = batches(6)
    eager = classifier("flash").cuda()
    graphed = copy.deepcopy(eager)
    want = train_steps(eager, eager, data, accumulate, set_to_none)
    got = train_steps(graphed, GraphedModel(graphed), data, accumulate, set_to_none)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.gpu
def test_graphed_training_under_bf16_autocast_matches_eager():
    data = batches(4)
    eager = classifier("flash").cuda()
    graphed = copy.deepcopy(eager)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # Lightning's bf16-mixed (weight cache on)
        want = train_steps(eager, eager, data)
        got = train_steps(graphed, GraphedModel(graphed), data)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_graphed_dropout_is_new_each_step_and_fixed_by_the_seed(attention, monkeypatch):
    # Attention dropout only: with hidden dropout on too, a mask frozen into the graph would go unnoticed.
    # Deterministic mode while the graph is captured: at this head dim flash's fused dropout backward adds dQ in a
    # varying order (kernels/flash.py, _fused_bwd), which would make the gradients differ by rounding, not masks.
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    model = classifier(attention, dropout=0.0, attn_dropout=0.3).cuda()
    g = GraphedModel(model)
    (ids, labels), = batches(1)

    def loss_at(seed):
        torch.manual_seed(seed)
        out = torch.nn.functional.cross_entropy(g(input_ids=ids).float(), labels)
        out.backward()
        grad = next(model.parameters()).grad.clone()
        model.zero_grad(set_to_none=True)
        return out.item(), grad

    a, ga = loss_at(1)
    b, gb = loss_at(2)
    a2, ga2 = loss_at(1)
    assert a != b and not torch.equal(ga, gb)  # the masks change from step to step
    assert a == a2 and torch.equal(ga, ga2)    # and the seed fixes them


@pytest.mark.gpu
def test_changed_shapes_are_refused():
    model = classifier().cuda()
    g = GraphedModel(model)
    g(input_ids=torch.zeros(4, 129, dtype=torch.long, device="cuda")).sum().backward()
    model.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="changed shape"):
        g(input_ids=torch.zeros(2, 129, dtype=torch.long, device="cuda"))


@pytest.mark.gpu
def test_lra_image_smoke_run_with_cuda_graph(tmp_path):
    from tests.test_train_run import metrics, run_inprocess, series

    run_inprocess(["experiment=lra/image", "attn=flash", "cuda_graph=true", "trainer.max_steps=12",
                   "eval_every_steps=12"], tmp_path)
    rows = metrics(tmp_path)
    loss = series(rows, "train/loss")
    assert loss and all(v == v and v > 0 for v in loss.values())
    assert series(rows, "val/acc") and series(rows, "perf/step_time_ms")


# ---- cuda_graph=step: the whole training step as one graph ----------------------------------------

class _EagerReplay:
    """A stand-in for a captured step on the CPU: replay() runs the step's body on the static batch and
    writes its outputs into the same output tensors, as a graph's replay does. Capturing runs nothing."""

    def __init__(self, body, static_batch):
        self.body, self.batch = body, static_batch
        self.out = (torch.zeros(()), {})

    def replay(self):
        loss, logs = self.body(self.batch)
        self.out[0].copy_(loss)
        for k, v in logs.items():
            self.out[1].setdefault(k, torch.zeros_like(v)).copy_(v)


def _fake_capture(body, static_batch):
    g = _EagerReplay(body, static_batch)
    return g, g.out


def test_unknown_cuda_graph_mode_is_refused():
    with pytest.raises(ValueError, match="choose false, true"):
        ClassificationTask(classifier(), cuda_graph="model")


@pytest.mark.skipif(CUDA, reason="checks the CPU refusal")
def test_cpu_run_with_step_graph_says_it_needs_a_gpu(tmp_path):
    from tests.test_train_run import run_inprocess

    with pytest.raises(ValueError, match="cuda_graph=step: it needs a CUDA device"):
        run_inprocess(["experiment=lra/image", "cuda_graph=step", "trainer.max_steps=2"], tmp_path)


def test_step_graph_loop_trains_as_eager(tmp_path, monkeypatch):
    """The loop around the graph (CPU, a stand-in replay): eager steps, then capture + replay, the batch copied
    into the static inputs each step, Lightning's step count, the scheduler, gradient clipping, the logs, a
    checkpoint and a resumed run: every logged loss and the final weights equal those of the eager run with the
    same seed."""
    import train.cuda_graph as cg
    import train.task as task_module
    from tests.test_train_run import run_inprocess, series

    monkeypatch.setattr(cg, "_cuda_capture", _fake_capture)
    monkeypatch.setattr(task_module.Task, "cuda_graph_problems", lambda self: [])
    monkeypatch.setattr(task_module, "make_capturable", lambda opt, device: None)  # CPU AdamW can't
    common = ["experiment=lra/image", "trainer.log_every_n_steps=1", "eval_every_steps=6",
              "callbacks.checkpoint.every_n_train_steps=6", "scheduler.warmup_steps=3",
              "trainer.gradient_clip_val=0.05"]  # small enough to clip: the graph clips as Lightning does
    runs = {}
    for mode in ("false", "step"):
        out = tmp_path / mode
        run_inprocess(common + [f"cuda_graph={mode}", "trainer.max_steps=6"], out)
        run_inprocess(common + [f"cuda_graph={mode}", "trainer.max_steps=10", "ckpt_path=last"], out)
        rows = []
        for f in sorted(out.glob("metrics*.csv")):
            rows += metrics_rows(f)
        runs[mode] = (series(rows, "train/loss"), series(rows, "train/acc"),
                      torch.load(out / "checkpoints" / "last.ckpt", weights_only=False))
    (loss_e, acc_e, ck_e), (loss_g, acc_g, ck_g) = runs["false"], runs["step"]
    assert sorted(loss_g) == sorted(loss_e) and max(loss_g) == 9 and len(loss_g) == 10
    for step in loss_e:
        assert loss_g[step] == pytest.approx(loss_e[step], rel=1e-5, abs=1e-6), step
        assert acc_g[step] == acc_e[step]
    assert ck_g["global_step"] == ck_e["global_step"] == 10
    for name, w in ck_e["state_dict"].items():
        torch.testing.assert_close(ck_g["state_dict"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    # equal weights after warm-up and cosine decay: the scheduler stepped as in the eager run; the rate at the end
    lr_e = ck_e["optimizer_states"][0]["param_groups"][0]["lr"]
    lr_g = ck_g["optimizer_states"][0]["param_groups"][0]["lr"]
    assert float(lr_g) == pytest.approx(float(lr_e))


def test_step_graph_takes_the_lm_tasks_tensor_batches(tmp_path, monkeypatch):
    """GPT-2's LM task hands the step one tensor of token windows, not a dict: with a stand-in replay (CPU), the
    step-graph run logs the eager run's losses and ends at its weights."""
    import train.cuda_graph as cg
    import train.task as task_module
    from tests.test_train_run import run_inprocess, series

    monkeypatch.setattr(cg, "_cuda_capture", _fake_capture)
    monkeypatch.setattr(task_module.Task, "cuda_graph_problems", lambda self: [])
    monkeypatch.setattr(task_module, "make_capturable", lambda opt, device: None)
    common = ["model=gpt2", "debug=smoke", "trainer.max_steps=6", "trainer.log_every_n_steps=1", "eval_every_steps=6"]
    runs = {}
    for mode in ("false", "step"):
        out = tmp_path / mode
        run_inprocess(common + [f"cuda_graph={mode}"], out)
        rows = []
        for f in sorted(out.glob("metrics*.csv")):
            rows += metrics_rows(f)
        runs[mode] = (series(rows, "train/loss"), torch.load(out / "checkpoints" / "last.ckpt", weights_only=False))
    (loss_e, ck_e), (loss_g, ck_g) = runs["false"], runs["step"]
    assert len(loss_g) == len(loss_e) == 6
    for step in loss_e:
        assert loss_g[step] == pytest.approx(loss_e[step], rel=1e-5, abs=1e-6), step
    for name, w in ck_e["state_dict"].items():
        torch.testing.assert_close(ck_g["state_dict"][name], w, rtol=1e-5, atol=1e-6, msg=name)


def test_step_graph_refuses_gradient_accumulation(tmp_path, monkeypatch):
    from tests.test_train_run import run_inprocess

    with pytest.raises(ValueError, match="cuda_graph=step: global_batch_size asks for 2 micro-batches"):
        run_inprocess(["experiment=lra/image", "cuda_graph=step", "data.batch_size=4", "global_batch_size=8"], tmp_path)


def metrics_rows(path):
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.gpu
@pytest.mark.parametrize("clip", ["null", "0.05"])
@pytest.mark.parametrize("experiment", ["experiment=lra/image", "model=gpt2"])
def test_step_graph_run_matches_eager_on_gpu(tmp_path, clip, experiment):
    """The real capture: LRA Image's and GPT-2's smoke models (GPT-2: its fused LM-head loss, one tensor batch) with
    flash attention and dropout, bf16, 12 steps (3 eager, then the captured step replayed), with and without
    gradient clipping inside the graph: the same losses as the eager run of the same seed, to bf16 rounding."""
    from tests.test_train_run import metrics, run_inprocess, series

    size = [] if experiment.startswith("experiment=") else ["debug=smoke"]
    common = [experiment, *size, "attn=flash", "trainer.max_steps=12", "trainer.log_every_n_steps=1",
              "eval_every_steps=12", f"trainer.gradient_clip_val={clip}"]
    losses = {}
    for mode in ("false", "step"):
        run_inprocess(common + [f"cuda_graph={mode}"], tmp_path / mode)
        rows = metrics(tmp_path / mode)
        losses[mode] = series(rows, "train/loss")
        assert series(rows, "val/acc" if "lra" in experiment else "val/loss")
    assert sorted(losses["step"]) == sorted(losses["false"]) and len(losses["step"]) == 12
    for step, want in losses["false"].items():
        assert losses["step"][step] == pytest.approx(want, rel=2e-2, abs=2e-2), step


@contextlib.contextmanager
def _stale_graph_in_a_cycle():
    """A captured graph that only the cyclic collector frees, as an earlier GraphedModel leaves behind (its
    autograd Function class is a cycle). Destroying it while another capture runs breaks that capture. The
    automatic collector stays off in the block, so only an explicit collection frees it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        graph, x = torch.cuda.CUDAGraph(), torch.zeros(1, device="cuda")
        with torch.cuda.graph(graph):
            x.add_(1)
        cycle = [graph, x]
        cycle.append(cycle)
        del graph, x, cycle
        yield
    finally:
        if enabled:
            gc.enable()


def _collect_if_capturing():
    """The collector running in the middle of a capture, as it may whenever a capture allocates."""
    if torch.cuda.is_current_stream_capturing():
        gc.collect()


class _CollectsInForward(torch.nn.Module):
    """The classifier, with _collect_if_capturing at the start of its forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        _collect_if_capturing()
        return self.inner(**kwargs)


@pytest.mark.gpu
def test_graphed_model_capture_survives_a_collection_mid_capture():
    model = _CollectsInForward(classifier("flash").cuda())
    with _stale_graph_in_a_cycle():
        losses = train_steps(model, GraphedModel(model), batches(1) * 3)
    assert all(v == v for v in losses) and losses[-1] < losses[0]


@pytest.mark.gpu
def test_step_graph_capture_survives_a_collection_mid_capture():
    model = classifier("flash").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    make_capturable(opt, torch.device("cuda"))

    def body(batch):
        _collect_if_capturing()
        loss = torch.nn.functional.cross_entropy(model(input_ids=batch["input_ids"]).float(), batch["labels"])
        opt.zero_grad(set_to_none=False)  # the graph updates the gradient buffers of the eager step in place
        loss.backward()
        opt.step()
        return loss, {}

    step = GraphedStep(eager_steps=1)
    with _stale_graph_in_a_cycle():
        losses = [step(body, {"input_ids": ids, "labels": labels})[0].item() for ids, labels in batches(1) * 4]
    assert all(v == v for v in losses) and losses[-1] < losses[0]
