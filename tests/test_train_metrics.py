"""Perplexity, LR schedule and FLOP/MFU arithmetic on hand-computed cases."""
import math
import warnings

import pytest
import torch

from train.callbacks import detect_peak_flops, flops_per_token
from train.metrics import Perplexity
from train.optim import warmup_cosine


def test_perplexity_hand_computed():
    # two positions over a 4-word vocabulary: p(target) = 1/4 (uniform) and 1/2 (logits log 2, log 1, ...)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0, 0.0]]])
    targets = torch.tensor([[2, 0]])
    m = Perplexity()
    m.update(logits, targets)
    nll, ppl = m.compute()
    expected = (math.log(4) + math.log(2)) / 2  # p = 3 / (3 + 1 + 1 + 1) = 1/2
    assert nll.dtype == torch.float64
    assert nll.item() == pytest.approx(expected, rel=1e-6)
    assert ppl.item() == pytest.approx(math.sqrt(8), rel=1e-6)


def test_perplexity_is_over_tokens_not_batches():
    torch.manual_seed(0)
    logits, targets = torch.randn(5, 7, 11), torch.randint(0, 11, (5, 7))
    whole = Perplexity()
    whole.update(logits, targets)
    parts = Perplexity()
    parts.update(logits[:4], targets[:4])
    parts.update(logits[4:, :3], targets[4:, :3])  # a short last batch
    parts.update(logits[4:, 3:], targets[4:, 3:])
    nll_ref = torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), targets.flatten())
    assert whole.compute()[0].item() == pytest.approx(nll_ref.item(), rel=1e-6)
    assert parts.compute()[0].item() == pytest.approx(nll_ref.item(), rel=1e-6)
    # ignore_index positions do not count
    m = Perplexity()
    t = targets.clone()
    t[0, 0] = -100
    m.update(logits, t)
    assert m.count.item() == 34
    # update_mean (a fused loss's batch mean) weighs each batch by its count, a short last batch included
    means = Perplexity()
    for sl in (slice(0, 4), slice(4, 5)):
        mean = torch.nn.functional.cross_entropy(logits[sl].flatten(0, 1), targets[sl].flatten())
        means.update_mean(mean, targets[sl].numel())
    assert means.count.item() == 35
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchmetrics warns when compute() comes before any counted update
        assert means.compute()[0].item() == pytest.approx(nll_ref.item(), rel=1e-6)
    means.update_mean(torch.tensor(0.0), 35)  # a later batch must not be hidden by the cached result
    assert means.compute()[0].item() == pytest.approx(nll_ref.item() / 2, rel=1e-6)


def test_warmup_cosine():
    assert warmup_cosine(0, 10, 110, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(9, 10, 110, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(60, 10, 110, 0.1) == pytest.approx(0.55)  # half way down the cosine
    assert warmup_cosine(110, 10, 110, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(500, 10, 110, 0.1) == pytest.approx(0.1)


def test_flops_and_peak():
    # GPT-2 small at T=1024: 6N + 12*12*12*64*1024/2 (causal)
    n = 123_653_376
    assert flops_per_token(n, 12, 12, 64, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024 / 2
    assert flops_per_token(n, 12, 12, 64, 1024, causal=False) == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert detect_peak_flops("NVIDIA H100 80GB HBM3") == 989.5e12
    assert detect_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert detect_peak_flops("Some CPU") is None


def test_compare_attention_summary(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from compare_attention import read_metrics, summarize

    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,perf/tokens_per_s,perf/step_time_ms,perf/peak_mem_gib,step,train/loss,val/ppl\n"
                   "0,10.0,900.0,1.0,9,5.0,\n"      # first window: warm-up, left out of the speed
                   "0,100.0,100.0,2.0,19,4.0,\n"
                   "0,300.0,50.0,1.5,29,3.0,\n"
                   "0,,,,29,,42.0\n")
    s = summarize(read_metrics(csv))
    assert s["tokens_per_s"] == 200.0 and s["step_time_ms"] == 75.0
    assert s["peak_mem_gib"] == 2.0 and s["val/ppl"] == 42.0 and s["train/loss"] == 3.0


def test_compare_attention_reads_every_call_of_a_chained_run(tmp_path):
    """A run resumed with ckpt_path=last keeps its first call's metrics.csv as metrics.part1.csv; its early
    evaluations live there (the session-18 parity table lost them when only metrics.csv was read)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from compare_attention import finished, read_metrics, summarize

    head = "epoch,perf/tokens_per_s,perf/step_time_ms,step,val/ppl\n"
    (tmp_path / "metrics.part1.csv").write_text(head + "0,10.0,900.0,99,\n0,100.0,100.0,199,\n0,,,249,500.0\n"
                                                "0,100.0,100.0,399,\n0,,,499,400.0\n0,,,749,999.0\n")
    # the second call resumed from the checkpoint at step 600: its 749 replaces the first call's
    (tmp_path / "metrics.csv").write_text(head + "0,20.0,800.0,649,\n0,300.0,50.0,699,\n0,,,749,300.0\n"
                                          "0,,,999,250.0\n")
    series = read_metrics(tmp_path / "metrics.csv")
    assert series["val/ppl"] == [(249, 500.0), (499, 400.0), (749, 300.0), (999, 250.0)]
    s = summarize(series)  # each call's first window (warm-up) left out: 100, 100, 300
    assert abs(s["tokens_per_s"] - 500.0 / 3) < 1e-9 and s["val/ppl"] == 250.0
    assert finished(tmp_path / "metrics.csv", 1000)


def test_compare_attention_parity_and_reuse(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from compare_attention import configured_max_steps, finished, parity, read_metrics

    def run(name, ppls):
        path = tmp_path / name / "metrics.csv"
        path.parent.mkdir()
        path.write_text("epoch,step,val/ppl\n" + "".join(f"0,{s},{p}\n" for s, p in ppls))
        return {"attn": name, "series": read_metrics(path)}, path

    ref, ref_path = run("standard", [(100, 500.0), (200, 100.0)])
    close, _ = run("flash", [(100, 502.0), (200, 100.5)])  # 0.4% and 0.5%
    far, far_path = run("sdpa", [(100, 500.0)])            # 2% off at its only evaluation, and not finished
    far["series"]["val/ppl"] = [(100, 510.0)]
    text = "\n".join(parity([ref, close, far], tol=0.01))
    assert "flash vs standard: largest gap 0.50% over 2 evaluations (tolerance 1.0%): PASS" in text
    assert "sdpa vs standard: largest gap 2.00% over 1 evaluations (tolerance 1.0%): MISS" in text
    assert "| 200 | 100.00 | 100.50 (+0.50%) | - |" in text
    assert finished(ref_path, 200) and finished(ref_path, 201) and not finished(far_path, 200)
    assert not finished(ref_path, 202) and not finished(ref_path, None)
    # --reuse reads max_steps from the composed config: the experiment's, or an override's
    assert configured_max_steps(["experiment=gpt2/small-parity"]) == 1500
    assert configured_max_steps(["experiment=gpt2/small-parity", "trainer.max_steps=20"]) == 20


def test_compare_attention_tabulates_existing_runs_without_running(tmp_path):
    """--tabulate (after a GPU machine was taken back mid-sweep): a table from the run folders alone, the short
    run labelled with the step it reached, parity over the evaluations both made, a missing kind an error row."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import compare_attention

    runs = tmp_path / "runs"
    for name, ppls in (("standard", [(99, 200.0), (199, 100.0)]), ("flash", [(99, 201.0)])):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.csv").write_text(
            "epoch,step,perf/tokens_per_s,perf/step_time_ms,val/ppl\n0,49,1000,9,\n0,79,1200,8,\n"
            + "".join(f"0,{s},,,{p}\n" for s, p in ppls))
        (runs / name / "calls.csv").write_text(
            "call,started_utc,ended_utc,device,software\n"
            f"1,2026-01-0{len(name) % 9}T00:00:00,,GPU X x 4,\"torch 9.0, triton 8.0\"\n")
    compare_attention.main(["--tabulate", "--attn", "standard,flash,sdpa", "--runs-dir", str(runs), "--out",
                            str(tmp_path / "table"), "--name", "t", "experiment=gpt2/small-parity",
                            "trainer.max_steps=200"])
    md = (tmp_path / "table" / "t.md").read_text()
    assert "| standard | 1,200 |" in md and "| flash (stopped at step 100 of 200) | 1,200 |" in md
    assert "flash vs standard: largest gap 0.50% over 1 evaluations" in md
    assert "| sdpa | failed: no run:" in md
    assert md.startswith("# Attention kinds, same training config (GPU X x 4)\n\ntorch 9.0, triton 8.0, trained 2026-01-05")
    assert not (runs / "sdpa").exists()  # nothing ran


def test_progress_line():
    from train.callbacks import progress_line

    rec = {"step": 1000, "tokens_per_s": 350123.4, "step_time_ms": 45.8, "mfu": 0.2871, "peak_mem_gib": 9.43}
    assert progress_line(rec, 12000, 3.2104) == ("step 1000/12000 (8%) | loss 3.210 | 350,123 tok/s | 45.8 ms/step | "
                                                 "MFU 28.7% | 9.4 GiB | eta 8m 24s")
    assert progress_line({**rec, "step_time_ms": 1000.0}, 12000, None).endswith("1000.0 ms/step | MFU 28.7% | 9.4 GiB | eta 3h 03m")
    assert progress_line({"step": 7, "tokens_per_s": 10.0, "step_time_ms": 1.0}, -1, None) == "step 7 | 10 tok/s | 1.0 ms/step"
