"""scripts/bench_longctx.py on a CPU: rows in-process on the tiny model (timing, OOM caught as a result), the
report (table, OOM cells, plot, merge) on synthetic rows, and (slow) the script end to end in subprocesses
with every attention kind, the Triton ones under the interpreter."""
import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import bench_longctx as bench  # noqa: E402

META = dict(gpu="test GPU", date="2026-01-01", torch="t", triton="t", cuda="c", command="python x")


def _args(row, seqlen=256, **kw):
    return argparse.Namespace(**{**dict(row=row, seqlen=seqlen, model="tiny", tokens=512, batch=None, steps=1,
                                        warmup=1, seed=0), **kw})


def test_rows_in_process_on_the_tiny_model():
    plain, ckpt = bench.one_row(_args("standard")), bench.one_row(_args("standard-ckpt"))
    for r in (plain, ckpt):
        assert r["batch"] == 2 and r["step_ms"] > 0 and r["tokens_per_s"] > 0 and "oom" not in r
        assert r["n_layer"] == 1 and r["d_model"] == 16 and r["peak_mem_gib"] is None  # no GPU here
    assert plain["loss"] == pytest.approx(ckpt["loss"], rel=1e-6)  # same step with and without recompute
    assert "model.activation_checkpointing=true" in ckpt["overrides"]
    assert "experiment=lra/path256" in bench.overrides_for("flash", 65536, "chosen")
    assert "experiment=lra/pathx" in bench.overrides_for("flash", 16384, "chosen")
    with pytest.raises(ValueError, match="not an R x R image"):
        bench.overrides_for("flash", 1000, "tiny")


def test_out_of_memory_is_a_result(monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", oom)
    r = bench.one_row(_args("standard"))
    assert r["oom"] is True and "Tried to allocate 64.00 GiB" in r["error"] and "step_ms" not in r
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # anything else is the row's failure, not an OOM
        bench.one_row(_args("standard"))


def _row(name, seqlen, step_ms=None, **kw):
    r = dict(row=name, seqlen=seqlen, batch=65536 // seqlen, model="chosen", steps=10, warmup=3, params=4_300_000,
             d_model=64, n_layer=2, n_head=4, **kw)
    if step_ms is not None:
        r.update(step_ms=step_ms, tokens_per_s=65536 / step_ms * 1000, peak_mem_gib=step_ms / 10)
    return r


def test_report_table_oom_cells_plot_and_merge(tmp_path):
    rows = [_row("standard", 16384, oom=True, error="CUDA out of memory"), _row("standard-ckpt", 16384, 900.0),
            _row("flash", 16384, 100.0), _row("blocksparse", 65536, 50.0, layout="butterfly+local block 128",
                                                density=0.0234),
            _row("standard", 65536, oom=True, error="CUDA out of memory"), _row("flash", 65536, 400.0),
            {"row": "sdpa", "seqlen": 65536, "batch": 1, "error": "Traceback\nRuntimeError: boom"}]
    md = bench.markdown(rows, META)
    assert md.startswith("# Long context") and "(test GPU)" in md.splitlines()[0] and "Command: `python x`" in md
    table = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
             for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    assert table["standard"] == ["OOM", "-", "-", "OOM", "-", "-"]
    assert table["flash"] == ["100.0", "655,360", "10.0", "400.0", "163,840", "40.0"]
    assert table["blocksparse"][:3] == ["-", "-", "-"] and table["blocksparse"][3] == "50.0"
    assert table["sdpa"][3] == "failed" and "sdpa at 65,536 failed: RuntimeError: boom" in md
    assert "density 0.0234" in md and "4 x 16,384 tokens, 1 x 65,536 tokens" in md
    bench.plot(rows, META, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    old = {"env": META, "rows": rows}
    merged, env = bench.merge_rows(old, [_row("flash", 65536, 390.0)], dict(META, command="python y"))
    assert len(merged) == len(rows) and env["command"] == "python x; python y"
    assert next(r for r in merged if (r["row"], r["seqlen"]) == ("flash", 65536))["step_ms"] == 390.0
    with pytest.raises(ValueError, match="earlier rows ran on test GPU"):
        bench.merge_rows(old, [], dict(META, gpu="other"))


@pytest.mark.slow
def test_end_to_end_every_kind(tmp_path):
    """Every row in its own process at a tiny length; flash and block-sparse under the Triton interpreter."""
    out = bench.main(["--model", "tiny", "--seqlens", "256", "--tokens", "256", "--steps", "1", "--warmup", "1",
                      "--out", str(tmp_path)])
    rows = {r["row"]: r for r in out["rows"]}
    assert set(rows) == set(bench.ROWS) and all(r.get("step_ms", 0) > 0 for r in rows.values()), rows
    assert rows["blocksparse"]["density"] == 1.0  # two blocks of 128: the layout keeps both
    saved = json.loads((tmp_path / "bench_longctx.json").read_text())
    assert saved["env"]["command"].startswith("python scripts/bench_longctx.py --model tiny")
    assert (tmp_path / "bench_longctx.md").exists() and (tmp_path / "bench_longctx.png").exists()
