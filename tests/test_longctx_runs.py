"""scripts/longctx_runs.py: the Path-X / Path-256 run report, from run folders a test writes (config,
overrides, metrics in two calls, calls.csv)."""
import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import longctx_runs as L  # noqa: E402


def write_run(d: Path, experiment: str, cls: str, max_steps: int, batch: int, windows, vals, test=None):
    (d / ".hydra").mkdir(parents=True)
    cfg = {"seed": 1, "init_from": None, "attn": {"_target_": f"kernels.attention.{cls}"},
           "data": {"task": "pathfinder", "batch_size": batch}, "trainer": {"max_steps": max_steps}}
    OmegaConf.save(OmegaConf.create(cfg), d / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create([f"experiment=lra/{experiment}", "init_from=null"]),
                   d / ".hydra" / "overrides.yaml")
    keys = ["step", "perf/step_time_ms", "perf/tokens_per_s", "perf/peak_mem_gib", "val/acc", "test/acc"]
    part1 = [keys] + [[s, ms, 1e6, 1.5, "", ""] for s, ms in windows[:2]]
    part1.append([vals[0][0], "", "", "", vals[0][1], ""])
    part2 = [keys] + [[s, ms, 1e6, 1.5, "", ""] for s, ms in windows[2:]]
    part2 += [[s, "", "", "", a, ""] for s, a in vals[1:]]
    if test is not None:
        part2.append([max_steps, "", "", "", "", test])
    for name, rows in (("metrics.part1.csv", part1), ("metrics.csv", part2)):
        (d / name).write_text("\n".join(",".join(str(x) for x in r) for r in rows) + "\n")
    (d / "calls.csv").write_text(
        "call,start_step,end_step,steps,wall_s,started_utc,ended_utc,status,resumed_from,device\n"
        "1,0,300,300,100,2026-11-25T00:00:00+00:00,2026-11-25T00:02:00+00:00,stopped: budget_s,,NVIDIA H100 x 1\n"
        f"2,300,{max_steps},300,100,2026-11-25T00:03:00+00:00,2026-11-25T00:05:00+00:00,finished,x,NVIDIA H100 x 1\n")


def test_report_of_a_shortened_pathx_run_and_an_unfinished_path256_run(tmp_path):
    runs = tmp_path / "runs"
    # Path-X, flash, batch 32 (half the recipe's 64), 600 of 600 steps over two calls; the first speed window
    # (compilation) is left out of the steady state: 700 ms a step at batch 32.
    write_run(runs / "pathx-short", "pathx", "FlashAttention", 600, 32,
              windows=[(49, 5000.0), (99, 700.0), (349, 700.0), (599, 700.0)],
              vals=[(149, 0.5), (299, 0.51), (449, 0.502), (599, 0.505)], test=0.503)
    write_run(runs / "nested" / "path256-short", "path256", "BlockSparseAttention", 600, 32,
              windows=[(49, 900.0), (99, 350.0)], vals=[(149, 0.5)])
    write_run(runs / "other", "listops", "FlashAttention", 10, 2, windows=[(9, 1.0)], vals=[(9, 0.2)])  # not ours
    out = tmp_path / "out"
    got = {r["experiment"]: r for r in L.main(["--runs", str(runs), "--out", str(out)])}
    assert set(got) == {"pathx", "path256"}
    px = got["pathx"]
    assert px["kind"] == "flash" and px["steps_done"] == 600 and px["recipe_steps"] == 500000
    assert px["val_curve"][0] == (149, 50.0) and px["val_last"] == pytest.approx(50.5)
    assert px["val_best"] == pytest.approx(51.0) and px["test_acc"] == pytest.approx(50.3)
    assert px["speed"]["step_time_ms"] == pytest.approx(700.0) and px["calls"] == 2
    # 500,000 steps x 0.7 s x (64 / 32) = 194.4 hours
    assert px["recipe_gpu_hours"] == pytest.approx(500000 * 0.7 * 2 / 3600)
    assert got["path256"]["test_acc"] is None and got["path256"]["kind"] == "blocksparse"
    md = (out / "longctx_runs.md").read_text()
    assert "| 600 of 600 | 500,000 | 50.5 / 51.0 | 50.3 | 61.4 (flash) | 700.0 |" in md
    assert "194.4" in md and (out / "longctx_runs.png").exists()
    assert "`python train/run.py experiment=lra/pathx init_from=null`" in md  # the command that resumes it
    assert json.loads((out / "longctx_runs.json").read_text())["runs"]


def test_no_run_folder_says_what_it_looked_for(tmp_path):
    with pytest.raises(SystemExit, match="no Path-X"):
        L.main(["--runs", str(tmp_path), "--out", str(tmp_path / "out")])
