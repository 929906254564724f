"""LRA reproduction: per-experiment block-sparse layouts in the attn config, and scripts/reproduce_lra.py's
commands, resume logic, collection, table, JSON and plot on run folders the tests write (no training
except the slow end-to-end test)."""
import json
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from train.config import CONFIG_DIR, register_resolvers

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import reproduce_lra as R  # noqa: E402

register_resolvers()


def cfg_for(*overrides):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[*overrides, "output_dir=outputs/compose-only"])


# ------------------------------------------------------------------------------ attn=blocksparse layouts

def test_experiment_layout_reaches_blocksparse():
    cfg = cfg_for("experiment=lra/listops", "attn=blocksparse")
    assert list(cfg.attn.pattern) == ["butterfly", "global_local"] and cfg.attn.block_size == 128
    core = instantiate(cfg.attn)(dropout=0.0)
    assert core.pattern == ["butterfly", "global_local"] and core.block_size == 128
    assert core.pattern_kwargs == {"window": 0, "n_global": 1}  # options the experiment did not set stay out
    pf = instantiate(cfg_for("experiment=lra/pathfinder", "attn=blocksparse").attn)(dropout=0.0)
    assert (pf.pattern, pf.block_size, pf.pattern_kwargs) == ("butterfly", 64, {})


def test_every_lra_experiment_has_a_layout_that_builds():
    for task in R.TASKS:
        cfg = cfg_for(f"experiment=lra/{task}", "attn=blocksparse")
        assert "blocksparse_layout" in cfg and "lra_blocksparse" not in cfg
        instantiate(cfg.attn)(dropout=0.0)  # the constructor builds a layout: unknown options would raise


def test_other_attn_kinds_ignore_the_layout():
    for kind in ("flash", "standard", "sdpa"):
        cfg = cfg_for("experiment=lra/listops", f"attn={kind}")
        assert set(cfg.attn.keys()) == {"_target_", "_partial_"}
        instantiate(cfg.attn)(dropout=0.0)


def test_blocksparse_defaults_and_command_line_options():
    core = instantiate(cfg_for("attn=blocksparse").attn)(dropout=0.0)
    assert (core.pattern, core.block_size, core.pattern_kwargs) == ("butterfly", 128, {})
    for opt in ("+attn.window=2", "attn.window=2"):  # the documented + form keeps working
        core = instantiate(cfg_for("attn=blocksparse", "attn.pattern=local", opt).attn)(dropout=0.0)
        assert (core.pattern, core.pattern_kwargs) == ("local", {"window": 2})
    core = instantiate(cfg_for("experiment=lra/listops", "attn=blocksparse", "attn.window=1").attn)(dropout=0.0)
    assert core.pattern_kwargs == {"window": 1, "n_global": 1}


def test_attn_config_lists_every_pattern_option():
    """A new option of a pattern builder needs its line in configs/attn/blocksparse.yaml."""
    import inspect

    from kernels.sparsity import PATTERNS

    opts = {p for fn in PATTERNS.values() for p in inspect.signature(fn).parameters} - {
        "seqlen_q", "seqlen_k", "block_size", "device"}
    declared = set(OmegaConf.load(CONFIG_DIR / "attn" / "blocksparse.yaml").keys()) - {
        "_target_", "_partial_", "pattern", "block_size"}
    assert declared == opts


# ------------------------------------------------------------------------------ synthetic run folders

def write_run(run_dir: Path, task: str, kind: str, seed=1, max_steps=None, test_acc=None, step_ms=None,
              tokens=1000, mem=None, source=None, windows=4, every=10):
    cls = {v: k for k, v in R.KIND_OF_CLASS.items()}[kind]
    max_steps = max_steps or R.recipe(task)["max_steps"]
    source = source or {"listops": "generated", "text": "spamassassin", "retrieval": "linux-doc",
                        "image": "fashion-mnist", "pathfinder": "generated"}[task]
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = {"seed": seed, "attn": {"_target_": f"kernels.attention.{cls}", "_partial_": True},
           "data": {"task": task, "source": source, "data_dir": "${repo:}/data/cache/lra/" + task},
           "trainer": {"max_steps": max_steps}}
    OmegaConf.save(OmegaConf.create(cfg), run_dir / ".hydra" / "config.yaml")
    keys = ["epoch", "perf/peak_mem_gib", "perf/step_time_ms", "perf/tokens_per_s", "step", "test/acc", "train/loss"]
    lines = [",".join(keys)]
    for w in range(windows):
        # the first window is slow (compilation): steady state must leave it out
        ms = (step_ms or 100.0) * (5 if w == 0 else 1)
        vals = ["0", "" if mem is None else str(mem), str(ms), str(tokens * 1000 / ms), str((w + 1) * every - 1), "", "1.0"]
        lines.append(",".join(vals) if step_ms else ",".join(["0", "", "", "", str((w + 1) * every - 1), "", "1.0"]))
    if test_acc is not None:
        lines.append(",".join(["1", "", "", "", str(max_steps), str(test_acc), ""]))
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    speeds = {"standard": 300.0, "sdpa": 150.0, "flash": 120.0, "blocksparse": 100.0}
    accs = {"standard": 0.36, "sdpa": 0.37, "flash": 0.38, "blocksparse": 0.35}
    for task in ("listops", "text"):
        for kind, ms in speeds.items():
            write_run(R.speed_dir(root, task, kind), task, kind, max_steps=200, step_ms=ms, mem=2.0)
            write_run(R.accuracy_dir(root, task, kind, 1, None), task, kind, test_acc=accs[kind])
    # a second seed for flash on listops, and a cut-off blocksparse seed 2 with a checkpoint
    write_run(R.accuracy_dir(root, "listops", "flash", 2, None), "listops", "flash", seed=2, test_acc=0.40)
    cut = R.accuracy_dir(root, "listops", "blocksparse", 2, None)
    write_run(cut, "listops", "blocksparse", seed=2)
    (cut / "checkpoints").mkdir()
    (cut / "checkpoints" / "last.ckpt").write_bytes(b"")
    (root / "speed" / "session.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.x",
                                                            "date": "2026-11-30", "command": "python x"}))
    return root


def test_steady_speed_leaves_out_the_first_window(tmp_path):
    write_run(tmp_path / "r", "listops", "flash", step_ms=50.0, tokens=2000, mem=1.5)
    s = R.steady_speed(R.read_metrics(tmp_path / "r" / "metrics.csv"))
    assert s["step_time_ms"] == pytest.approx(50.0) and s["tokens_per_s"] == pytest.approx(2000 * 1000 / 50)
    assert s["windows"] == 3 and s["peak_mem_gib"] == 1.5


def test_collect_table_json_plot(runs, tmp_path):
    out = tmp_path / "out"
    s = R.main(["--collect", str(runs), "--out", str(out), "--tasks", "listops", "text"])
    assert s["speed"]["listops"]["flash"]["speedup"] == pytest.approx(2.5)
    assert s["speed"]["text"]["blocksparse"]["speedup"] == pytest.approx(3.0)
    assert s["mean_speedup"]["sdpa"] == pytest.approx(2.0)
    assert s["accuracy"]["listops"]["flash"]["seeds"] == {1: pytest.approx(38.0), 2: pytest.approx(40.0)}
    assert s["accuracy"]["listops"]["flash"]["mean"] == pytest.approx(39.0)
    assert s["accuracy"]["listops"]["blocksparse"]["seeds"] == {1: pytest.approx(35.0)}  # seed 2 unfinished
    assert s["average"]["standard"] is None  # two of five tasks: no average
    (m,) = [m for m in s["missing"] if m["seed"] == 2]
    assert m["kind"] == "blocksparse" and "ckpt_path=" in m["command"] and "last.ckpt" in m["command"]
    assert s["data"]["text"]["note"] == "stand-in: spamassassin for IMDB"
    md = (out / "table3.md").read_text()
    assert "| blocksparse | 35.0 | 35.0 | - | 3.00x | 59.6 | 2.8x |" in md
    assert "| ListOps | flash | 120.0 |" in md and "2.50x" in md
    assert "FlashAttention (attn=flash) | 37.6 | 63.9 | 81.4 | 43.5 | 72.7 | 59.8 | 2.4x" in md
    assert "stand-in: spamassassin for IMDB" in md
    assert md.startswith("# Long Range Arena") and "(NVIDIA H100 80GB HBM3)" in md.splitlines()[0]
    js = json.loads((out / "table3.json").read_text())
    assert js["paper"]["blocksparse"]["speedup"] == 2.8 and "command" in js["env"]
    assert (out / "table3.png").stat().st_size > 1000


def test_full_table_average_and_short_run_marker(tmp_path):
    root = tmp_path / "runs"
    for task in R.TASKS:
        write_run(R.accuracy_dir(root, task, "flash", 1, 50), task, "flash", max_steps=50, test_acc=0.5)
    s = R.main(["--collect", str(root), "--out", str(tmp_path / "out"), "--kinds", "flash"])
    assert s["average"]["flash"] == pytest.approx(50.0)
    md = (tmp_path / "out" / "table3.md").read_text()
    assert "50.0\\*" in md and "shorter than the experiment's recipe" in md and "not measured" in md


def test_dry_run_commands_skip_finished_and_resume_cut_off(runs, capsys):
    assert R.main(["--dry-run", "--runs", str(runs), "--tasks", "listops", "--seeds", "1", "2"]) is None
    cmds = [ln[2:] for ln in capsys.readouterr().out.splitlines() if ln.startswith("$ ")]
    speed = [c for c in cmds if "/speed/" in c]
    assert len(speed) == 4 and "attn=standard" in speed[0]  # standard first, the reference of the speedups
    assert all("trainer.max_steps=200" in c and "callbacks.checkpoint=null" in c for c in speed)
    acc = [c for c in cmds if "/speed/" not in c]
    # seed 1 of every kind and seed 2 of flash are finished; seed 2 of blocksparse resumes
    assert len(acc) == 3
    (resume,) = [c for c in acc if "attn=blocksparse" in c]
    assert "seed=2" in resume and "ckpt_path=" in resume and resume.endswith("last.ckpt")
    assert all(c.startswith("python train/run.py experiment=lra/listops attn=") for c in cmds)


def test_dry_run_step_budget_and_overrides(tmp_path, capsys):
    R.main(["--dry-run", "--runs", str(tmp_path), "--tasks", "text", "--kinds", "flash", "--max-steps", "2000",
            "--skip-speed", "debug=smoke"])
    (cmd,) = [ln[2:] for ln in capsys.readouterr().out.splitlines() if ln.startswith("$ ")]
    # recipe: 20,000 steps with warmup 8,000 -> 2,000 steps with warmup 800, in its own folder
    assert "trainer.max_steps=2000" in cmd and "scheduler.warmup_steps=800" in cmd
    assert "seed1-steps2000" in cmd and cmd.endswith("debug=smoke") and "attn=flash" in cmd


@pytest.mark.slow
def test_end_to_end_smoke(tmp_path):
    """One task x kind for real (debug=smoke, CPU): a speed run, an accuracy run, the table. attn=standard:
    the Triton kernels under the CPU interpreter take minutes for the same steps."""
    out = tmp_path / "out"
    s = R.main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--tasks", "listops", "--kinds", "standard",
                "--speed-steps", "10", "debug=smoke", "trainer.log_every_n_steps=2"])
    assert s["speed"]["listops"]["standard"]["step_time_ms"] > 0
    assert s["speed"]["listops"]["standard"]["speedup"] == pytest.approx(1.0)
    assert 0 <= s["accuracy"]["listops"]["standard"]["mean"] <= 100 and not s["missing"]
    # a second invocation skips the finished accuracy run
    s2 = R.main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--tasks", "listops", "--kinds", "standard",
                 "--skip-speed", "debug=smoke"])
    assert s2["accuracy"]["listops"]["standard"]["seeds"] == s["accuracy"]["listops"]["standard"]["seeds"]


# ------------------------------------------------------------------------------ speed runs from a small folder

def speed_cmds(capsys):
    return [ln[2:] for ln in capsys.readouterr().out.splitlines() if ln.startswith("$ ")]


def test_speed_data_overrides_speed_runs_only(tmp_path, capsys):
    R.main(["--dry-run", "--runs", str(tmp_path / "runs"), "--tasks", "listops", "pathfinder", "--kinds", "flash",
            "--speed-data", "data/cache/lra-speed"])
    cmds = speed_cmds(capsys)
    speed, acc = [c for c in cmds if "/speed/" in c], [c for c in cmds if "/speed/" not in c]
    assert len(speed) == 2 and len(acc) == 2
    assert "'data.data_dir=${repo:}/data/cache/lra-speed/listops'" in speed[0]
    assert "'data.data_dir=${repo:}/data/cache/lra-speed/pathfinder'" in speed[1]
    assert not any("data_dir" in c for c in acc)  # accuracy runs read their configs' folders
    # the override names the folder the datamodule gets
    cfg = cfg_for("experiment=lra/text", "data.data_dir=${repo:}/data/cache/lra-speed/text")
    assert cfg.data.data_dir == str(REPO / "data/cache/lra-speed/text")
    # outside the checkout: the absolute path
    R.main(["--dry-run", "--skip-accuracy", "--runs", str(tmp_path), "--tasks", "text", "--kinds", "flash",
            "--speed-data", str(tmp_path / "small")])
    (cmd,) = speed_cmds(capsys)
    assert f"data.data_dir={tmp_path / 'small' / 'text'}" in cmd


def test_speed_data_must_be_prepared(tmp_path):
    with pytest.raises(SystemExit, match="--prepare-speed-data .* --tasks text"):
        R.main(["--skip-accuracy", "--runs", str(tmp_path / "runs"), "--tasks", "text", "--kinds", "flash",
                "--speed-data", str(tmp_path / "none")])
    assert not (tmp_path / "runs" / "speed").exists()  # failed before deleting or running anything


def test_prepare_speed_data_commands(tmp_path, capsys):
    assert R.main(["--dry-run", "--prepare-speed-data", "data/cache/lra-speed", "--tasks", "text", "pathfinder"]) is None
    text_cmd, pf_cmd = speed_cmds(capsys)
    assert text_cmd.startswith("python scripts/prepare_lra.py text --num-train ")
    assert text_cmd.endswith("--out data/cache/lra-speed/text")
    assert "--resolution 32" in pf_cmd and pf_cmd.endswith("--out data/cache/lra-speed/pathfinder")
    for cmd in R.SPEED_PREPARE.values():  # every one parses
        import prepare_lra

        with pytest.raises(SystemExit) as e:
            prepare_lra.main([*cmd.format(out="x").split()[2:], "--help"])
        assert e.value.code == 0
    capsys.readouterr()


def test_accumulate_parsed_and_applied(tmp_path, capsys):
    R.main(["--dry-run", "--skip-accuracy", "--runs", str(tmp_path), "--tasks", "retrieval", "text",
            "--kinds", "standard", "flash", "--accumulate", "retrieval/standard=2", "--accumulate", "text/flash=4"])
    cmds = {(c.split()[2][len("experiment=lra/"):], c.split()[3][len("attn="):]): c for c in speed_cmds(capsys)}
    assert cmds[("retrieval", "standard")].endswith("data.batch_size=16 global_batch_size=32")
    assert cmds[("text", "flash")].endswith("data.batch_size=8 global_batch_size=32")
    assert "global_batch_size" not in cmds[("retrieval", "flash")]
    # attn=standard accumulates by default (DEFAULT_ACCUMULATE, sized for 80 GiB); N=1 turns an entry off
    assert cmds[("text", "standard")].endswith("data.batch_size=16 global_batch_size=32")
    R.main(["--dry-run", "--skip-accuracy", "--runs", str(tmp_path), "--tasks", "retrieval", "text",
            "--kinds", "standard", "--accumulate", "text/standard=1"])
    cmds = {c.split()[2][len("experiment=lra/"):]: c for c in speed_cmds(capsys)}
    assert cmds["retrieval"].endswith("data.batch_size=8 global_batch_size=32")
    assert "global_batch_size" not in cmds["text"]
    # the batch the run would have: debug modes and overrides count, and the last override wins
    R.main(["--dry-run", "--skip-accuracy", "--runs", str(tmp_path), "--tasks", "image", "--kinds", "standard",
            "--accumulate", "image/standard=2", "data.batch_size=64"])
    (cmd,) = speed_cmds(capsys)
    assert cmd.endswith("data.batch_size=64 data.batch_size=32 global_batch_size=64")
    cfg = cfg_for("experiment=lra/image", "data.batch_size=64", "data.batch_size=32", "global_batch_size=64")
    assert (cfg.data.batch_size, cfg.global_batch_size) == (32, 64)
    assert R.parse_accumulate(["pathfinder/blocksparse=8"]) == {("pathfinder", "blocksparse"): 8}


def test_accuracy_runs_and_missing_commands_accumulate_too(tmp_path, capsys):
    """A standard accuracy run of Retrieval takes its batch of 32 as 4 x 8, like its speed run: without it, the
    command the table lists for a missing run would run out of memory on one 80 GiB GPU."""
    R.main(["--dry-run", "--skip-speed", "--runs", str(tmp_path), "--tasks", "retrieval", "--kinds", "standard",
            "flash"])
    cmds = {c.split()[3][len("attn="):]: c for c in speed_cmds(capsys)}
    assert cmds["standard"].endswith("data.batch_size=8 global_batch_size=32")
    assert "global_batch_size" not in cmds["flash"]
    (tmp_path / "runs").mkdir()
    summary = R.main(["--collect", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--tasks", "retrieval",
                      "--kinds", "standard", "flash"])
    capsys.readouterr()
    by_kind = {m["kind"]: m["command"] for m in summary["missing"]}
    assert by_kind["standard"].endswith("data.batch_size=8 global_batch_size=32")
    assert "global_batch_size" not in by_kind["flash"]


@pytest.mark.parametrize("spec,why", [("retrieval=2", "TASK/KIND=N"), ("retrieval/standard", "TASK/KIND=N"),
                                      ("cifar/standard=2", "task must be one of"),
                                      ("text/naive=2", "kind one of"), ("text/standard=0", "positive integer"),
                                      ("text/standard=two", "positive integer"),
                                      ("text/standard=3", "does not split into 3")])
def test_bad_accumulate_errors(tmp_path, capsys, spec, why):
    with pytest.raises(SystemExit):
        R.main(["--dry-run", "--skip-accuracy", "--runs", str(tmp_path), "--tasks", "text",
                "--kinds", "standard", "--accumulate", spec])
    assert why in capsys.readouterr().err


def test_bad_speed_steps(tmp_path, capsys):
    with pytest.raises(SystemExit):
        R.main(["--dry-run", "--runs", str(tmp_path), "--speed-steps", "0"])
    assert "--speed-steps must be a positive integer" in capsys.readouterr().err


def fake_runner(ms_of, fail=()):
    """Runner.run stand-in: a speed command writes the run folder a real run would (config + metrics)."""
    def run(self, cmd, log, timeout=None):
        ov = dict(c.split("=", 1) for c in cmd[2:] if "=" in c)
        task, kind = ov["experiment"].split("/")[1], ov["attn"]
        if (task, kind) in fail:
            return "failed"
        d = Path(ov["hydra.run.dir"])
        write_run(d, task, kind, max_steps=int(ov["trainer.max_steps"]), step_ms=ms_of[kind], mem=1.0)
        if "global_batch_size" in ov:
            cfg = OmegaConf.load(d / ".hydra" / "config.yaml")
            cfg.data.batch_size, cfg.global_batch_size = int(ov["data.batch_size"]), int(ov["global_batch_size"])
            OmegaConf.save(cfg, d / ".hydra" / "config.yaml")
        return "ok"
    return run


def test_keep_speed_two_invocations_make_one_table(tmp_path, monkeypatch):
    runs, out = tmp_path / "runs", tmp_path / "out"
    small = tmp_path / "small"
    from train.lra.datamodule import auto_prepare

    for t in ("listops", "text", "image"):
        auto_prepare(t, small / t, **({"num_train": 8, "num_val": 2, "num_test": 2} if t == "listops" else {}))
    monkeypatch.setattr(R.Runner, "run", fake_runner({"standard": 200.0, "flash": 100.0}))
    common = ["--skip-accuracy", "--runs", str(runs), "--out", str(out), "--kinds", "standard", "flash",
              "--speed-data", str(small)]
    R.main([*common, "--tasks", "listops", "text", "--accumulate", "text/standard=2"])
    first = json.loads((runs / "speed" / "listops" / "session.json").read_text())
    assert first["speed_data"] == str(small)
    # the second call: a stale text run is replaced, listops kept, image added
    monkeypatch.setattr(R.Runner, "run", fake_runner({"standard": 300.0, "flash": 100.0}))
    s = R.main([*common, "--tasks", "text", "image", "--keep-speed", "--accumulate", "text/standard=1"])
    assert s["tasks"] == ["listops", "text", "image"]
    assert s["speed"]["listops"]["flash"]["speedup"] == pytest.approx(2.0)  # kept from the first call
    assert s["speed"]["text"]["flash"]["speedup"] == pytest.approx(3.0)  # rerun
    assert s["speed"]["text"]["standard"]["accumulate"] == 1  # the first call's accumulated run is gone
    assert json.loads((runs / "speed" / "listops" / "session.json").read_text()) == first
    md = (out / "table3.md").read_text()
    assert "Speed runs (ListOps):" in md and "Speed runs (Text, Image):" in md
    # without --keep-speed: one invocation's runs only
    R.main([*common, "--tasks", "image"])
    assert sorted(p.name for p in (runs / "speed").iterdir() if p.is_dir()) == ["image"]


def test_accumulated_and_failed_runs_in_the_table(tmp_path, monkeypatch):
    runs, out = tmp_path / "runs", tmp_path / "out"
    monkeypatch.setattr(R.Runner, "run", fake_runner({"standard": 200.0, "flash": 100.0},
                                                     fail={("retrieval", "flash")}))
    s = R.main(["--skip-accuracy", "--runs", str(runs), "--out", str(out), "--kinds", "standard", "flash",
                "--tasks", "retrieval", "--accumulate", "retrieval/standard=4"])
    st = s["speed"]["retrieval"]["standard"]
    assert (st["accumulate"], st["micro_batch"]) == (4, 8)
    md = (out / "table3.md").read_text()
    assert "| accumulated: 4 x 8 |" in md and "gradient accumulation (--accumulate)" in md
    assert "| Retrieval | flash | not measured | | | | | failed: " in md
    assert (runs / "speed" / "retrieval" / "flash" / "status").read_text().startswith("failed")


def test_cut_off_speed_run_is_flagged(tmp_path, monkeypatch):
    runs, out = tmp_path / "runs", tmp_path / "out"
    measured = fake_runner({"standard": 200.0, "flash": 100.0})

    def cut_off(self, cmd, log, timeout=None):
        measured(self, cmd, log, timeout)
        return "cut off" if "attn=flash" in cmd else "ok"

    monkeypatch.setattr(R.Runner, "run", cut_off)
    s = R.main(["--skip-accuracy", "--runs", str(runs), "--out", str(out), "--kinds", "standard", "flash",
                "--tasks", "image"])
    assert s["speed"]["image"]["flash"]["speedup"] == pytest.approx(2.0)
    assert "| 2.00x | 1.00 | 39 | cut off: " in (out / "table3.md").read_text()


# ------------------------------------------------------------------- accuracy runs over many device calls

def write_cut_off_run(run_dir: Path, overrides: list[str]):
    """A pathfinder run resumed once: its first call's metrics in metrics.part1.csv, the second's in
    metrics.csv, its command in .hydra/overrides.yaml, its calls in calls.csv, a last.ckpt."""
    write_run(run_dir, "pathfinder", "flash")
    head = "epoch,step,train/loss,val/acc\n"
    (run_dir / "metrics.part1.csv").write_text(head + "0,99,0.7,\n0,99,,0.50\n0,199,,0.55\n")
    (run_dir / "metrics.csv").write_text(head + "0,199,,0.56\n0,299,0.6,\n0,299,,0.61\n")
    OmegaConf.save(OmegaConf.create(overrides), run_dir / ".hydra" / "overrides.yaml")
    (run_dir / "calls.csv").write_text(
        "call,start_step,end_step,steps,wall_s,started_utc,ended_utc,status,resumed_from,device\n"
        "1,0,200,200,10,2026-11-25T07:00:00+00:00,2026-11-25T07:01:00+00:00,stopped: budget_s,,GPU X x 1\n"
        "2,200,300,100,5,2026-11-25T08:00:00+00:00,2026-11-25T08:01:00+00:00,stopped: budget_s,x,GPU X x 1\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")


def test_cut_off_run_curve_command_and_device(tmp_path):
    root = tmp_path / "runs"
    d = R.accuracy_dir(root, "pathfinder", "flash", 1, None)
    write_cut_off_run(d, ["experiment=lra/pathfinder", "attn=flash", "seed=1", "data.batch_size=256",
                          "callbacks.calls.budget_s=500", "ckpt_path=old.ckpt"])
    s = R.main(["--collect", str(root), "--out", str(tmp_path / "out"), "--tasks", "pathfinder"])
    (u,) = s["unfinished"]
    assert u["steps_done"] == 299 and u["val_acc"] == pytest.approx(0.61)
    assert u["devices"] == ["GPU X x 1, 2 call(s), 2026-11-25T07:00:00+00:00 .. 2026-11-25T08:01:00+00:00"]
    # the curve spans both calls; the resumed call's value wins at the step both logged
    (c,) = s["curves"]
    assert c["val_acc"] == [(99, 0.5), (199, 0.56), (299, 0.61)] and not c["finished"]
    # resumed with the run's own overrides, not this invocation's; the old budget and checkpoint dropped
    (m,) = [m for m in s["missing"] if m["kind"] == "flash"]
    assert "data.batch_size=256" in m["command"] and "budget_s" not in m["command"]
    assert "old.ckpt" not in m["command"] and m["command"].endswith("checkpoints/last.ckpt")
    md = (tmp_path / "out" / "table3.md").read_text()
    assert "| Pathfinder | flash | 1 | 299 of 62400 | 61.0 | GPU X x 1, 2 call(s)" in md
    assert (tmp_path / "out" / "table3_curves.png").stat().st_size > 1000


def test_collect_without_speed_runs_keeps_the_earlier_speed_rows(runs, tmp_path):
    out = tmp_path / "out"
    R.main(["--collect", str(runs), "--out", str(out), "--tasks", "listops", "text"])
    acc_only = tmp_path / "acc-only"
    write_run(R.accuracy_dir(acc_only, "listops", "flash", 1, None), "listops", "flash", test_acc=0.5)
    s = R.main(["--collect", str(acc_only), "--out", str(out), "--tasks", "listops", "text"])
    assert s["speed"]["listops"]["flash"]["speedup"] == pytest.approx(2.5)
    assert s["mean_speedup"]["sdpa"] == pytest.approx(2.0)
    assert s["speed_kept_from"] == {t: R.rel(out / "table3.json") for t in ("listops", "text")}
    assert s["accuracy"]["listops"]["flash"]["seeds"] == {1: pytest.approx(50.0)}
    md = (out / "table3.md").read_text()
    assert "Speed rows of ListOps, Text kept from" in md and "| ListOps | flash | 120.0 |" in md
    # a fresh --out has nothing to keep: the speed rows say so
    s2 = R.main(["--collect", str(acc_only), "--out", str(tmp_path / "fresh"), "--tasks", "listops"])
    assert not s2["speed"]["listops"] and "speed_kept_from" not in s2


def test_kept_speed_rows_say_when_the_experiment_changed_its_model(runs, tmp_path):
    """A speed row carries its run's model settings; a later table that keeps the row compares them with what
    the experiment builds then, and the note says what changed (the row measured another model)."""
    d = R.speed_dir(runs, "listops", "flash")
    cfg = OmegaConf.load(d / ".hydra" / "config.yaml")
    cfg.model = R.recipe_model("listops")
    OmegaConf.save(cfg, d / ".hydra" / "config.yaml")
    out = tmp_path / "out"
    s = R.main(["--collect", str(runs), "--out", str(out), "--tasks", "listops"])
    assert s["speed"]["listops"]["flash"]["model_drift"] == [] and "model since changed" not in (out / "table3.md").read_text()
    assert s["speed"]["listops"]["sdpa"]["model"] is None  # a run without model settings: nothing to compare
    table = json.loads((out / "table3.json").read_text())
    table["speed"]["listops"]["flash"]["model"]["d_model"] = 7  # as if the experiment's d_model changed since
    (out / "table3.json").write_text(json.dumps(table))
    acc_only = tmp_path / "acc-only"
    write_run(R.accuracy_dir(acc_only, "listops", "flash", 1, None), "listops", "flash", test_acc=0.5)
    s = R.main(["--collect", str(acc_only), "--out", str(out), "--tasks", "listops"])
    now = R.recipe_model("listops")["d_model"]
    assert s["speed"]["listops"]["flash"]["model_drift"] == [f"d_model: 7 (now {now})"]
    assert f"model since changed: d_model: 7 (now {now})" in (out / "table3.md").read_text()


def test_speed_rows_of_some_tasks_come_from_another_table(runs, tmp_path):
    """A GPU machine remeasured one task's speed (its table3.json came back): collecting the accuracy runs
    with --speed-from takes that task's rows and session from it and keeps the other task's from --out."""
    out, remote = tmp_path / "out", tmp_path / "remote"
    R.main(["--collect", str(runs), "--out", str(out), "--tasks", "listops", "text"])
    table = json.loads((out / "table3.json").read_text())
    table["speed"] = {"text": {k: dict(v, step_time_ms=v["step_time_ms"] / 2) for k, v in table["speed"]["text"].items()}}
    table["speed_sessions"] = {"text": {"gpu": "GPU Y", "command": "remeasured", "date": "d"}}
    remote.mkdir()
    (remote / "table3.json").write_text(json.dumps(table))
    before = json.loads((out / "table3.json").read_text())
    acc_only = tmp_path / "acc-only"
    write_run(R.accuracy_dir(acc_only, "listops", "flash", 1, None), "listops", "flash", test_acc=0.5)
    s = R.main(["--collect", str(acc_only), "--out", str(out), "--tasks", "listops", "text",
                "--speed-from", str(remote / "table3.json")])
    assert s["speed"]["listops"] == before["speed"]["listops"]
    assert s["speed"]["text"]["flash"]["step_time_ms"] == pytest.approx(before["speed"]["text"]["flash"]["step_time_ms"] / 2)
    assert s["speed_sessions"]["text"]["gpu"] == "GPU Y"
    assert s["speed_kept_from"] == {"listops": R.rel(out / "table3.json"), "text": R.rel(remote / "table3.json")}
    md = (out / "table3.md").read_text()
    assert "Speed runs (Text): GPU Y" in md and "Speed rows of Text kept from" in md


def test_budget_lets_accuracy_runs_stop_themselves(tmp_path, monkeypatch):
    seen = []

    def run(self, cmd, log, timeout=None):
        seen.append(" ".join(cmd))
        return "ok"
    monkeypatch.setattr(R.Runner, "run", run)
    # overrides before and after the options (parse_intermixed_args)
    R.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--skip-speed", "logger=csv",
            "--tasks", "listops", "--kinds", "flash", "--budget", "600", "data.batch_size=16"])
    (cmd,) = seen
    budget = int(cmd.split("callbacks.calls.budget_s=")[1].split()[0])
    assert 600 - R.Runner.SELF_STOP_MARGIN - 5 <= budget <= 600 - R.Runner.SELF_STOP_MARGIN
    assert "logger=csv" in cmd and "data.batch_size=16" in cmd
    seen.clear()  # without --budget the runs get no budget of their own
    R.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--skip-speed", "--tasks", "listops",
            "--kinds", "flash"])
    assert "budget_s" not in seen[0]


def test_a_run_stopped_by_its_budget_is_resumed_not_taken_as_finished(tmp_path, capsys):
    """run.py prints its `done:` line after a budget stop too; calls.csv's last status decides."""
    root = tmp_path / "runs"
    d = R.accuracy_dir(root, "pathfinder", "flash", 1, None)
    write_cut_off_run(d, ["experiment=lra/pathfinder", "attn=flash", "seed=1"])
    (d / "stdout.log").write_text("call 2: steps 200 -> 300 in 5.0 s, stopped: budget_s\ndone: 300 steps, {}\n")
    assert not R.finished(d)
    R.main(["--dry-run", "--runs", str(root), "--tasks", "pathfinder", "--kinds", "flash", "--skip-speed"])
    (cmd,) = [ln[2:] for ln in capsys.readouterr().out.splitlines() if ln.startswith("$ ")]
    assert cmd.endswith("checkpoints/last.ckpt")
    with open(d / "calls.csv", "a") as f:  # a third call that reached max_steps
        f.write("3,300,62400,62100,9,2026-11-25T09:00:00+00:00,2026-11-25T09:09:00+00:00,finished,x,GPU X x 1\n")
    assert R.finished(d)


def test_runs_made_before_a_model_change_are_marked(tmp_path):
    now = R.recipe_model("listops")
    assert R.model_drift("listops", now) == []
    old = {k: v for k, v in now.items() if k != "embedding_std"}
    assert R.model_drift("listops", old) == ["embedding_std: unset (now 1.0)"]
    assert R.model_drift("listops", dict(now, n_layer=2)) == [f"n_layer: 2 (now {now['n_layer']})"]
    root = tmp_path / "runs"
    d = R.accuracy_dir(root, "listops", "flash", 1, None)
    write_run(d, "listops", "flash", test_acc=0.4)
    cfg = OmegaConf.load(d / ".hydra" / "config.yaml")
    cfg.model = old
    OmegaConf.save(cfg, d / ".hydra" / "config.yaml")
    s = R.main(["--collect", str(root), "--out", str(tmp_path / "out"), "--tasks", "listops"])
    assert s["accuracy"]["listops"]["flash"]["model_drift"] == ["embedding_std: unset (now 1.0)"]
    assert "| embedding_std: unset (now 1.0) |" in (tmp_path / "out" / "table3.md").read_text()


def test_runs_resumed_before_the_sampler_fix_are_marked_where_they_re_read_samples():
    call = lambda n, start, end, when: {"call": str(n), "start_step": str(start), "end_step": str(end),  # noqa: E731
                                        "started_utc": when, "status": "x"}
    before, after = "2026-11-25T08:00:00+00:00", "2026-11-27T08:00:00+00:00"
    # resumed at 7280 of 20000: the old loader's epoch ended at 12720 and the call went on to 17359
    calls = [call(1, 0, 1870, before), call(2, 1870, 7280, before), call(3, 7280, 17359, before),
             call(4, 17359, 20000, before)]
    assert R.reread_spans(calls, 20000) == ["steps 12720-17359 re-read the samples from step 7280 (resume bug, fixed "
                                            "2026-11-26)"]
    assert R.reread_spans([call(1, 0, 3501, before), call(2, 3501, 5000, before)], 5000) == []  # past half-way
    assert R.reread_spans([call(1, 0, 7280, after), call(2, 7280, 17359, after)], 20000) == []  # fixed since
    assert R.reread_spans(None, 20000) == []


def test_a_finished_run_that_re_read_samples_is_marked_and_listed_for_a_rerun(tmp_path):
    root = tmp_path / "runs"
    d = R.accuracy_dir(root, "listops", "flash", 1, None)
    write_run(d, "listops", "flash", max_steps=5000, test_acc=0.4)
    (d / "calls.csv").write_text(
        "call,start_step,end_step,steps,wall_s,started_utc,ended_utc,status,resumed_from,device\n"
        "1,0,1000,1000,10,2026-11-25T07:00:00+00:00,2026-11-25T07:01:00+00:00,stopped: budget_s,,GPU X x 1\n"
        "2,1000,5000,4000,50,2026-11-25T08:00:00+00:00,2026-11-25T08:09:00+00:00,finished,x,GPU X x 1\n")
    s = R.main(["--collect", str(root), "--out", str(tmp_path / "out"), "--tasks", "listops", "--kinds", "flash"])
    note = "steps 4000-5000 re-read the samples from step 1000"
    assert any(note in x for x in s["accuracy"]["listops"]["flash"]["data_drift"])
    (rerun,) = [m for m in s["missing"] if m["why"].startswith("re-read samples")]
    assert rerun["seed"] == 1 and "ckpt_path" not in rerun["command"] and "attn=flash" in rerun["command"]
    assert note in (tmp_path / "out" / "table3.md").read_text()


def test_parity_compares_kinds_on_shared_evaluations_and_seeds_for_noise():
    curve = lambda *accs: [(100 * (i + 1), a) for i, a in enumerate(accs)]  # noqa: E731
    summary = {"curves": [
        {"task": "listops", "kind": "standard", "seed": 1, "val_acc": curve(0.20, 0.30),  # cut off after 2
         "train_loss": curve(2.0, 1.5, 1.0, 0.9)},
        {"task": "listops", "kind": "flash", "seed": 1, "val_acc": curve(0.22, 0.25, 0.40),
         "train_loss": curve(2.0, 1.6, 1.2, 1.0, 0.8)},
        {"task": "listops", "kind": "flash", "seed": 2, "val_acc": curve(0.21, 0.33, 0.41)},
        {"task": "text", "kind": "flash", "seed": 1, "val_acc": curve(0.5)},  # no standard run: nothing
    ]}
    rows = R.parity(summary)
    by = {(r["pair"], r["seeds"]): r for r in rows}
    assert set(by) == {("flash vs standard", "1"), ("flash seed vs seed", "1, 2")}
    vs = by[("flash vs standard", "1")]
    assert vs["evals"] == 2 and vs["up_to"] == 200  # the standard run's prefix
    assert vs["max_gap"] == pytest.approx(5.0) and vs["last_gap"] == pytest.approx(5.0)
    assert vs["late_mean"] == pytest.approx(-5.0)  # signed, flash minus standard, over the later evaluation
    assert vs["late_loss"] == pytest.approx(0.15)  # steps 300, 400 both logged: (0.2 + 0.1) / 2
    noise = by[("flash seed vs seed", "1, 2")]
    assert noise["evals"] == 3 and noise["max_gap"] == pytest.approx(8.0) and noise["last_gap"] == pytest.approx(1.0)
    assert noise["late_mean"] == pytest.approx(-4.5)  # mean of (0.25 - 0.33, 0.40 - 0.41) in points
    assert noise["late_loss"] is None  # seed 2 logged no training loss
