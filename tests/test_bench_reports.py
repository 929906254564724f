"""The block-sparse benchmark's report code (markdown table, target check, plot) on synthetic rows: the
GPU part of the benchmark cannot run here, but the arithmetic that turns timings into the committed
tables and PASS/MISS lines can."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import bench_blocksparse as bench  # noqa: E402

META = dict(gpu="test GPU", date="2026-01-01", torch="t", triton="t", cuda="c", command="python x", tiles={})


def _row(provider, fwdbwd, seqlen=16384, density=0.0625, sweep="seqlen", **extra):
    return dict(sweep=sweep, pattern="butterfly", seqlen=seqlen, headdim=64, batch=1, nheads=32, density=density,
                provider=provider, fwd_ms=fwdbwd / 3, fwdbwd_ms=fwdbwd, peak_extra_mb=10.0, rounds=3,
                round_spread=1.1, **extra)


def rows():
    return [_row("ours", 1.0, graphed_ms=0.9), _row("flash", 12.0), _row("flex", 1.5, graphed_ms=0.8),
            dict(_row("standard", 0.0), error="OOM")]


def test_markdown_ratios_and_columns():
    md = bench.markdown(rows(), META, [])
    ours = next(line for line in md.splitlines() if "| ours |" in line)
    cells = [c.strip() for c in ours.strip("|").split("|")]
    # speedup vs dense 12/1, target 0.7/density, vs flex 1.5/1, graphed ms, graphed ratio 0.8/0.9
    assert cells[7:12] == ["12.00x", "11.2x", "1.50x", "0.900", "0.89x"]
    assert "| standard | OOM |" in md
    assert "non-causal" in md
    causal_md = bench.markdown(rows(), dict(META, causal=True), [])
    assert "block_size 128, causal;" in causal_md and "non-causal" not in causal_md


def test_targets_pass_and_miss():
    lines = bench.targets(rows()).splitlines()
    ours = next(line for line in lines if "n= 16384" in line)
    assert "vs flash  12.00x" in ours and "11.2x: PASS" in ours
    assert "vs flex  1.50x (PASS)" in ours and "graphed  0.89x (MISS)" in ours
    slow = [_row("ours", 2.0), _row("flash", 12.0), _row("flex", 1.5)]
    line = bench.targets(slow).splitlines()[1]
    assert "6.00x" in line and "11.2x: MISS" in line and "0.75x (MISS)" in line


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    data = rows() + [_row(p, t, seqlen=4096, density=d, sweep="density") for p, t, d in
                     (("ours", 1.0, 0.25), ("ours", 0.6, 0.125), ("flex", 1.2, 0.25), ("flash", 4.0, 1.0))]
    path = tmp_path / "x.png"
    bench.plot(data, str(path))
    assert path.stat().st_size > 10_000


def test_a_run_whose_every_row_failed_writes_nothing():
    from _common import require_some_rows
    with pytest.raises(SystemExit, match="every row failed.*No module named 'hydra'"):
        require_some_rows([{"row": "a", "error": "Traceback ...\nModuleNotFoundError: No module named 'hydra'"},
                           {"row": "b", "error": "timed out after 5 s"}])
    require_some_rows([{"row": "a", "error": "CUDA out of memory", "oom": True}, {"row": "b", "error": "x"}])
    require_some_rows([{"row": "a", "error": "x"}, {"row": "b", "step_ms": 1.0}])


def test_attention_bench_interleaves_rounds_and_keeps_errors(monkeypatch):
    """bench_point times the providers of a shape in turn, in alternating order, and keeps each one's median round;
    a provider that fails (here: at setup) becomes an error row, and the others still run."""
    import torch

    import bench_attention as ba

    order, clock = [], {"ours": iter([1.0, 5.0, 2.0]), "flex": iter([3.0, 3.0, 9.0])}

    def provider(name, causal, n):
        if name == "sdpa_cudnn":
            raise RuntimeError("no kernel for this shape")
        return (lambda q, k, v: q), "bnhd"

    def time_modes(fn, q, k, v, do, modes, rep, row, graphed=False):
        order.append(row["provider"])
        t = next(clock[row["provider"]])
        graph = {"fwd_graphed_ms": t / 2} if row["provider"] == "ours" else {"fwd_graph_error": "capture failed"}
        return {**row, "fwd_ms": t, "fwd_tflops": 0.0, **(graph if graphed else {})}

    monkeypatch.setattr(ba, "make_provider", provider)
    monkeypatch.setattr(ba, "inputs", lambda shape, gen: tuple(torch.zeros(shape) for _ in range(4)))
    monkeypatch.setattr(ba, "time_modes", time_modes)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch, "Generator", lambda device=None: type("G", (), {"manual_seed": lambda s, x: s})())
    rows = ba.bench_point(["ours", "sdpa_cudnn", "flex"], 1, 2, 4, 8, True, ["fwd"], False, 10, 3, graphed=True)
    assert order == ["ours", "flex", "flex", "ours", "ours", "flex"]
    ours, cudnn, flex = rows
    assert ours["fwd_ms"] == 2.0 and flex["fwd_ms"] == 3.0  # medians of the three rounds
    assert ours["rounds_ms"] == {"fwd": [1.0, 5.0, 2.0]}
    assert "no kernel" in cudnn["error"] and "fwd_ms" not in cudnn
    assert ours["fwd_tflops"] == ba.flops(1, 2, 4, 8, True, "fwd") / 2.0 * 1e-9
    assert ours["fwd_graphed_ms"] == 1.0  # the median of the rounds' graph replays too
    assert "fwd_graphed_ms" not in flex and flex["fwd_graph_error"] == "capture failed"  # its eager time stands


def test_model_shapes_time_every_provider_at_both_shapes_and_count_real_tokens(monkeypatch, tmp_path):
    """--model-shapes: GPT-2 small and BERT-large (a padded batch with seeded real lengths), dropout 0 and 0.1, every
    provider through bench_point with the shape's own setup; TFLOP/s from the real tokens only; a provider that
    cannot run a point (Flex with dropout) is an error row, and the table says so."""
    import argparse
    import json

    import torch

    import bench_attention as ba

    lengths = ba.bert_lengths(ba.MODEL_SHAPES["bert-large"]["b"])
    assert ba.BERT_LENGTHS[0] <= int(lengths.min()) and int(lengths.max()) <= ba.BERT_LENGTHS[1]
    assert 280 < float(lengths.float().mean()) < 335  # about the BERT benchmark's mean real length, 307
    assert torch.equal(lengths, ba.bert_lengths(56))  # seeded
    assert ba.real_flops([3, 5], 2, 8, False, "fwd") == ba.flops(1, 2, 3, 8, False, "fwd") + ba.flops(1, 2, 5, 8,
                                                                                                     False, "fwd")
    calls = []

    def bench_point(names, b, h, n, d, causal, modes, memory, rep, rounds, setup=None, flop_count=None,
                    graphed=False):
        assert graphed  # the model shapes are where eager times can be the host's
        calls.append((b, n, causal, rounds))
        rows = []
        for name in names:
            row = {"provider": name, "hdim": d, "seqlen": n, "batch": b, "heads": h, "causal": causal}
            if name == "flex" and len(calls) % 2 == 0:  # the dropout point
                rows.append({**row, "error": "ValueError: FlexAttention has no dropout"})
                continue
            ms = 1.0 if name == "ours" else 2.0
            rows.append({**row, "fwd_ms": ms / 4, "fwdbwd_ms": ms, "fwd_tflops": 0.0, "fwdbwd_graphed_ms": ms / 2,
                         "fwdbwd_tflops": flop_count("fwdbwd") / ms * 1e-9})
        return rows

    monkeypatch.setattr(ba, "bench_point", bench_point)
    monkeypatch.setattr(ba, "autotune_picks", lambda: {})
    args = argparse.Namespace(out=str(tmp_path), tag="m", rep=10, rounds=3, providers=None)
    ba.model_shapes(args, {"gpu": "X", "date": "d", "command": "c", "rounds": 3})
    assert calls == [(16, 1024, True, 3), (16, 1024, True, 3), (56, 512, False, 3), (56, 512, False, 3)]
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    assert len(rows) == 4 * len(ba.MODEL_PROVIDERS)
    bert = next(r for r in rows if r["shape"] == "bert-large" and r["provider"] == "ours" and r["dropout"] == 0.1)
    assert bert["real_tokens"] == int(lengths.sum()) < 56 * 512
    assert bert["fwdbwd_tflops"] == pytest.approx(ba.real_flops(lengths, 16, 64, False, "fwdbwd") * 1e-9)
    md = (tmp_path / "m.md").read_text()
    assert "| sdpa_flash | 0.0 | 0.500 | 2.000 |" in md and "| 2.00 | 2.00 | 1.000 | 2.00 |" in md  # twice ours'
    assert "| flex | 0.1 | ValueError: FlexAttention has no dropout | - | - | - | - | - | - |" in md
    assert "| flex | 0.1 | ValueError: FlexAttention has no dropout |" in md
    assert f"{int(lengths.sum()):,} real tokens of 28,672" in md
    # --providers: those rows only, in the table's order; a provider these shapes do not run is refused
    args.providers, args.tag = ["sdpa_cudnn", "ours"], "some"
    ba.model_shapes(args, {"gpu": "X", "date": "d", "command": "c", "rounds": 3})
    rows = json.loads((tmp_path / "some.json").read_text())["rows"]
    assert [r["provider"] for r in rows] == ["ours", "sdpa_cudnn"] * 4
    args.providers = ["ours", "standard"]
    with pytest.raises(SystemExit, match="not standard"):
        ba.model_shapes(args, {"gpu": "X", "date": "d", "command": "c", "rounds": 3})


def test_graphed_upto_graphs_only_the_short_rows(tmp_path, monkeypatch):
    """--graphed-upto N: CUDA-graph times at lengths up to N, for the interleaved peers (never the standard
    baseline, timed alone); the longer rows stay eager only."""
    import sys

    import bench_attention as ba

    calls = []

    def bench_point(names, b, h, n, d, causal, modes, memory, rep, rounds, setup=None, flop_count=None,
                    graphed=False):
        calls.append((tuple(names), n, graphed))
        return [{"provider": p, "hdim": d, "seqlen": n, "batch": b, "heads": h, "causal": causal, "fwd_ms": 1.0,
                 "fwdbwd_ms": 2.0, "fwd_tflops": 1.0, "fwdbwd_tflops": 1.0} for p in names]

    monkeypatch.setattr(ba, "bench_point", bench_point)
    monkeypatch.setattr(ba, "autotune_picks", lambda: {})
    monkeypatch.setattr(ba, "standard_fits", lambda b, h, n: True)
    monkeypatch.setattr(ba, "plot", lambda rows, path: None)
    monkeypatch.setattr(ba, "require_gpu", lambda script, what: None)
    monkeypatch.setattr(sys, "argv", ["bench_attention.py", "--seqlens", "512", "1024", "4096", "--hdims", "64",
                                      "--causal", "no", "--providers", "ours", "standard", "sdpa_cudnn",
                                      "--no-gpt2", "--no-memory", "--graphed-upto", "1024", "--out", str(tmp_path)])
    ba.main()
    assert calls == [(("ours", "sdpa_cudnn"), 512, True), (("standard",), 512, False),
                     (("ours", "sdpa_cudnn"), 1024, True), (("standard",), 1024, False),
                     (("ours", "sdpa_cudnn"), 4096, False), (("standard",), 4096, False)]


def test_attention_table_adds_graphed_ratios_only_when_measured():
    """--graphed: one more column, the forward+backward ratio of CUDA-graph replays against each peer that has one;
    without graph times the table keeps its columns."""
    import bench_attention as ba

    def row(provider, ms, graphed=None):
        r = {"provider": provider, "hdim": 64, "seqlen": 512, "batch": 32, "heads": 32, "causal": False,
             "fwd_ms": ms / 3, "fwdbwd_ms": ms, "fwd_tflops": 1.0, "fwdbwd_tflops": 1.0}
        return {**r, "fwdbwd_graphed_ms": graphed} if graphed else r

    meta = {"gpu": "X", "date": "d", "command": "c", "rounds": 3}
    plain = ba.markdown([row("ours", 1.0), row("sdpa_flash", 1.2), row("flex", 0.9)], meta)
    assert "graphed" not in plain and "| 512 | 1 / 1 | 1 / 1 | 1 / 1 | 1.20, 1.20 | 0.90, 0.90 |" in plain
    md = ba.markdown([row("ours", 1.0, 0.5), row("sdpa_flash", 1.2, 1.0), row("flex", 0.9, 0.75),
                      row("standard", 5.0)], meta)
    assert "| graphed x sdpa_flash / flex |" in md  # standard, timed outside the graphs, has no graphed ratio
    assert "| 5.00, 5.00 | 2.00 / 1.50 |" in md
    header, rule = [line for line in md.splitlines() if line.startswith("| seqlen") or line.startswith("|---")][:2]
    assert header.count("|") == rule.count("|")


def test_training_bench_keeps_the_committed_tables_while_every_row_fails(tmp_path, monkeypatch):
    """bench_training writes its tables after each row, but not while every row so far failed: a run whose rows all
    fail (a missing package on the device) stops with the reason and leaves the tables it would overwrite alone."""
    import bench_training

    out = tmp_path / "training"
    out.mkdir()
    (out / "bench_training.md").write_text("the committed table\n")
    results = {"hf-eager": {"row": "hf-eager", "error": "Traceback ...\nModuleNotFoundError: No module named 'hydra'"},
               "hf-sdpa": {"row": "hf-sdpa", "tokens_per_s": 1000.0, "step_ms": 16.4, "peak_mem_gib": 2.0,
                           "loss": 9.5}}
    monkeypatch.setattr(bench_training, "run_row", lambda cmd, name, timeout: dict(results[name]))
    argv = ["bench_training.py", "--data-source", "corpus", "--data-dir", str(tmp_path), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv + ["--rows", "hf-eager"])
    with pytest.raises(SystemExit, match="every row failed.*No module named 'hydra'"):
        bench_training.main()
    assert (out / "bench_training.md").read_text() == "the committed table\n"
    assert not (out / "bench_training.json").exists()
    monkeypatch.setattr(sys, "argv", argv + ["--rows", "hf-eager,hf-sdpa"])
    bench_training.main()
    table = (out / "bench_training.md").read_text()
    assert "| hf-eager | failed: ModuleNotFoundError: No module named 'hydra' |" in table
    assert "| hf-sdpa | 1,000 | 16.4 | 1.00x |" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_timing_scripts_refuse_a_machine_without_a_gpu_before_writing(tmp_path, monkeypatch):
    import bench_attention as ba

    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["bench_attention.py", "--model-shapes", "--out", str(out)])
    with pytest.raises(SystemExit, match="bench_attention.py times CUDA kernels .*: it needs a GPU"):
        ba.main()
    monkeypatch.setattr(sys, "argv", ["bench_blocksparse.py", "--out", str(out)])
    with pytest.raises(SystemExit, match="bench_blocksparse.py times CUDA kernels .*: it needs a GPU"):
        bench.main()
    assert not out.exists()
