"""scripts/bench_bert.py on a CPU: the report arithmetic on synthetic rows, each row kind run in-process on
a tiny BERT and tiny prepared data, and (slow: the flash row trains under the Triton interpreter, minutes
on a loaded 2-core machine) the whole script end to end in subprocesses."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import bench_bert as bench  # noqa: E402

META = dict(gpu="test GPU", date="2026-01-01", torch="t", triton="t", cuda="c", transformers="x", command="python x",
            data="embedded (data/cache/bert/embedded-512)", padding_fraction=0.176, mean_length=422.0)


def _row(name, seconds, **kw):
    return dict(row=name, seconds=seconds, steps=10, warmup=2, batch=16, seq_len=512, model="large",
                real_tokens=67_520, sum_sq_len=3_000_000, loss=7.5, peak_mem_gib=30.0, **kw)


def test_report_ratios_mfu_and_target():
    rows = [_row("hf-eager", 4.0), _row("hf-sdpa", 2.0), _row("ours-flash", 0.8), _row("ours-standard", 1.5),
            {"row": "hf-eager-compile", "error": "Traceback\nRuntimeError: boom"}]
    bench.derive(rows, peak_flops=1e15, flops_of=lambda r: 1e14)
    assert rows[2]["tokens_per_s"] == pytest.approx(67_520 / 0.8) and rows[2]["vs_hf_sdpa"] == pytest.approx(2.5)
    assert rows[1]["step_ms"] == pytest.approx(200.0) and rows[2]["mfu"] == pytest.approx(0.125)
    assert rows[0]["vs_hf_sdpa"] == pytest.approx(0.5)  # a row before hf-sdpa
    md = bench.markdown(rows, META)
    assert "padding fraction of the timed batches 0.176" in md and "real tokens only" in md
    flash = next(line for line in md.splitlines() if line.startswith("| ours-flash |"))
    assert [c.strip() for c in flash.strip("|").split("|")][1:5] == ["84,400", "80.0", "2.50x", "12.5%"]
    assert "| hf-eager-compile | failed: RuntimeError: boom |" in md
    assert "2.50x, PASS" in md
    slow = bench.derive([_row("hf-sdpa", 1.0), _row("ours-flash", 0.9)])
    assert "MISS" in bench.markdown(slow, META) and slow[1].get("mfu") is None


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    import gzip

    from train import bert_data as bd

    with gzip.open(bd.EMBEDDED, "rt") as f:
        texts = [json.loads(line)["text"] for line in f][-8:]
    out = tmp_path_factory.mktemp("bench") / "tiny-64"
    bd.prepare_examples(texts, out, bd.Settings(max_seq_len=64, max_predictions=9, dupe_factor=1, val_fraction=0.2),
                        stamp="tiny", num_proc=1)
    return out


def _args(tiny_data, tmp_path, row, profile=0, accumulate=1):
    return argparse.Namespace(row=row, model="tiny", steps=2, warmup=1, batch=4, accumulate=accumulate, seq_len=64, seed=0,
                              data_dir=str(tiny_data), data_source="corpus", workdir=str(tmp_path), profile=profile)


@pytest.mark.parametrize("row", ["hf-sdpa", "ours-sdpa"])
def test_rows_run_in_process_on_a_tiny_bert(tiny_data, tmp_path, row):
    r = bench.one_row(_args(tiny_data, tmp_path, row, profile=2 if row == "ours-sdpa" else 0))
    assert r["seconds"] > 0 and r["loss"] > 0 and r["row"] == row
    if row == "ours-sdpa":  # the profiled steps come after the timed ones and are summarised per step
        prof = r["profile"]
        assert prof["steps"] == 2 and prof["wall_ms"] > 0 and prof["top_host_ops"]
        assert "where a step's time goes" in "\n".join(bench.profile_markdown([r])).lower()
    else:
        assert r["profile"] is None
    lengths = bench.timed_lengths(_args(tiny_data, tmp_path, row))
    assert r["real_tokens"] == lengths.sum() <= 2 * 4 * 64 and len(lengths) == 8


@pytest.mark.parametrize("row", ["hf-sdpa", "ours-sdpa"])
def test_accumulated_steps_time_only_the_timed_steps(tiny_data, tmp_path, row):
    """--accumulate: a timed step is a LAMB step over that many micro-batches. The timed window ends at the
    last timed step, not at the last micro-batch before the profiled ones (Lightning keeps global_step there
    for a whole step), and the loss is the micro-batch's, not Lightning's loss / accumulation."""
    one = bench.one_row(_args(tiny_data, tmp_path, row, accumulate=1))
    r = bench.one_row(_args(tiny_data, tmp_path, row, profile=1, accumulate=3))
    assert r["accumulate"] == 3 and r["real_tokens"] > 2 * one["real_tokens"]  # 3x the sequences per step
    assert 9.0 < r["loss"] < 12.0  # ln(30522) + ln 2 = 11.0 at initialisation, not a third of it
    if row == "ours-sdpa":
        assert len(r["step_ms_each"]) == 2
        assert sum(r["step_ms_each"]) == pytest.approx(1000 * r["seconds"], rel=1e-3)


@pytest.mark.slow
def test_end_to_end_on_cpu(tiny_data, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "scripts/bench_bert.py", "--model", "tiny", "--seq-len", "64", "--batch", "4",
                        "--steps", "2", "--warmup", "1", "--data-dir", str(tiny_data), "--data-source", "corpus",
                        "--rows", "hf-sdpa,ours-standard,ours-flash", "--row-timeout", "1500", "--out", str(tmp_path / "out"),
                        "--workdir", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True,
                       timeout=3000, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "bench_bert.json").read_text())
    assert [r["row"] for r in data["rows"]] == ["hf-sdpa", "ours-standard", "ours-flash"]
    assert all("tokens_per_s" in r for r in data["rows"]), data["rows"]
    md = (tmp_path / "out" / "bench_bert.md").read_text()
    assert "| ours-flash |" in md and "padding fraction" in md


def test_merge_keeps_rows_from_an_earlier_call():
    old = {"env": dict(META, command="python a"), "rows": [_row("ours-flash", 1.0), _row("hf-sdpa", 3.0)]}
    rows, env = bench.merge_rows(old, [_row("hf-sdpa", 2.0), _row("hf-eager", 4.0)], dict(META, command="python b"))
    assert [r["row"] for r in rows] == ["hf-eager", "hf-sdpa", "ours-flash"] and rows[1]["seconds"] == 2.0
    assert env["command"] == "python a; python b"
    with pytest.raises(ValueError, match="differs"):
        bench.merge_rows(old, [], dict(META, padding_fraction=0.3))


def test_rows_that_read_other_examples_are_refused():
    env = dict(META, data_stamp="a")
    bench.check_same_data([_row("hf-sdpa", 1.0, data_stamp="a"), {"row": "hf-eager", "error": "x"}], env)
    with pytest.raises(RuntimeError, match="changed during the run"):
        bench.check_same_data([_row("hf-sdpa", 1.0, data_stamp="a"), _row("ours-flash", 1.0, data_stamp="b")], env)


def _curve(accs, losses, tokens_per_s, step_s):
    evals = [{"step": 100 * (i + 1), "seconds": step_s * 100 * (i + 1), "mlm_acc": a, "mlm_loss": l, "nsp_acc": 0.5}
             for i, (a, l) in enumerate(zip(accs, losses))]
    return {"evals": evals, "seconds": evals[-1]["seconds"], "steps": evals[-1]["step"], "tokens_per_s": tokens_per_s}


def test_bert_quality_summary_times_levels_and_gaps():
    import bert_quality as bq
    curves = {"flash": _curve([0.05, 0.12, 0.21], [7.0, 6.0, 5.0], 200.0, 0.5),
              "standard": _curve([0.05, 0.11, 0.20], [7.0, 6.1, 5.05], 100.0, 1.0)}
    summary = bq.summarize(curves)
    assert [row["level"] for row in summary["levels"]] == [0.10, 0.11, 0.12, 0.13, 0.14, 0.15, 0.16, 0.18, 0.20]
    first = summary["levels"][0]  # both reach 0.10 at step 200: 100 s flash, 200 s standard
    assert first["flash"] == 100 and first["standard"] == 200 and first["speedup"]["flash"] == 2.0
    assert summary["max_acc_gap"] == pytest.approx(0.01) and summary["max_loss_gap"] == pytest.approx(0.1)
    assert summary["throughput_flash_over_standard"] == 2.0
    text = bq.markdown(curves, summary, {"gpu": "cpu", "torch": "x", "triton": "x", "cuda": None, "date": "d",
                                         "command": "c"}, [])
    assert "masked-LM loss 0.1000" in text and "2.00x" in text and "No accuracy level" not in text


def test_bert_quality_says_when_no_level_was_reached():
    import bert_quality as bq
    curves = {"flash": _curve([0.064, 0.064], [7.8, 6.8], 200.0, 0.5),
              "standard": _curve([0.064, 0.064], [7.8, 6.8], 100.0, 1.0)}
    summary = bq.summarize(curves)
    assert summary["levels"] == []
    text = bq.markdown(curves, summary, {"gpu": "cpu", "torch": "x", "triton": "x", "cuda": None, "date": "d",
                                         "command": "c"}, [])
    assert "No accuracy level from 0.10 up was reached" in text


def test_bert_quality_combines_seeds_into_ratios_and_their_mean(tmp_path):
    import bert_quality as bq
    paths = []
    for seed, flash_step_s in ((1, 1 / 3), (2, 1 / 6)):  # evaluations every 100 steps; standard 2/3 s per step
        curves = {"flash": _curve([0.05, 0.12, 0.16], [7.0, 6.2, 6.0], 1.5, flash_step_s),
                  "standard": _curve([0.05, 0.14, 0.155], [7.0, 6.05, 6.0], 1.0, 2 / 3)}
        env = {"gpu": "test GPU", "torch": "x", "triton": "x", "date": "d", "command": f"python x --seed {seed}"}
        path = tmp_path / f"q{seed}.json"
        path.write_text(json.dumps({"env": env, "curves": curves, **bq.summarize(curves)}))
        paths.append(path)
    text = bq.combine(paths, acc_target=0.15, loss_target=6.1)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")
            and line.split("|")[1].strip() in ("1", "2", "mean")}
    # seed 1: both reach acc 0.15 at their third evaluation (flash 100 s, standard 200 s); loss <= 6.1 at flash's
    # third (100 s) and standard's second (133 s). Seed 2 halves flash's times.
    assert rows["1"] == ("| 1 | 0.1600 / 0.1550 | 6.000 / 6.000 | 1.50x | 100 / 200 (2.00x) | 100 / 200 (2.00x) "
                         "| 100 / 133 (1.33x) |")
    assert "| 50 / 200 (4.00x) | 50 / 200 (4.00x) | 50 / 133 (2.67x) |" in rows["2"]
    assert rows["mean"] == "| mean | | | 1.50x | 3.00x | 3.00x | 2.00x |"
    assert "test GPU" in text and "python x --seed 2" in text
    unreached = bq.combine(paths, acc_target=0.5, loss_target=1.0)
    assert "| mean | | | 1.50x | 3.00x | - | - |" in unreached


def test_data_source_comes_from_the_prepared_folder(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"source": "corpus"}))
    assert bench.data_source_of(str(tmp_path), None) == "corpus"
    assert bench.data_source_of(str(tmp_path), "embedded") == "embedded"  # given wins
    assert bench.data_source_of(None, None) == "embedded"
    assert bench.data_source_of(str(tmp_path / "not-there"), None) == "embedded"


def test_plot_draws_every_row_and_names_failed_ones(tmp_path):
    rows = [_row("hf-sdpa", 2.0), _row("ours-flash", 1.0), {"row": "hf-eager", "error": "torch.OutOfMemoryError: CUDA"}]
    bench.derive(rows)
    bench.plot(rows, {"padding_fraction": 0.4, "gpu": "test"}, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
