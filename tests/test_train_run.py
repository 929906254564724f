"""End-to-end training on the CPU: smoke run through the CLI, resume, every experiment/model config."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
FAST = ["debug=smoke", "logger=csv", "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="session")
def embedded_data():
    from train.data import prepare_embedded

    prepare_embedded()  # cached in data/cache/embedded after the first time (~30 s)
    return REPO / "data" / "cache" / "embedded"


def metrics(run_dir):
    with open(Path(run_dir) / "metrics.csv") as f:
        return list(csv.DictReader(f))


def series(rows, key):
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


def run_inprocess(overrides, out):
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers
    from train.run import train

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=FAST + list(overrides) + [f"output_dir={out}"])
    return train(cfg)


def test_smoke_cli_writes_everything_under_run_dir(embedded_data, tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "train/run.py", "debug=smoke", f"hydra.run.dir={run_dir}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = metrics(run_dir)
    loss = series(rows, "train/loss")
    assert max(loss) == 19 and all(v > 0 for v in loss.values())
    assert loss[19] < loss[4]  # it learns
    assert series(rows, "perf/tokens_per_s") and series(rows, "perf/step_time_ms")
    val_loss, val_ppl = series(rows, "val/loss")[19], series(rows, "val/ppl")[19]
    assert abs(val_ppl - 2.718281828 ** val_loss) / val_ppl < 1e-4
    assert {"step0000010.ckpt", "step0000020.ckpt", "last.ckpt"} <= set(os.listdir(run_dir / "checkpoints"))
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert "called before the ``update``" not in p.stderr  # the fused loss's val/ppl updates are counted
    assert "Epoch 0/-2" not in p.stdout + p.stderr


def test_progress_bar_describes_a_step_bounded_run():
    """Lightning sets max_epochs to -1 for a run bounded by max_steps, and its rich bar said "Epoch 0/-2"."""
    import lightning as L

    from train.callbacks import progress_bar

    for limits, want in (({"max_steps": 3}, "Epoch 0"), ({"max_epochs": 3}, "Epoch 0/2")):
        bar = progress_bar()
        if bar is None:
            pytest.skip("rich is not installed: Lightning's tqdm bar prints no epoch count")
        trainer = L.Trainer(**limits, callbacks=[bar], logger=False, enable_checkpointing=False, accelerator="cpu")
        bar._trainer = trainer  # what the bar's setup hook does
        assert bar._get_train_description(0).strip() == want


def test_progress_lines_when_the_bar_is_off(embedded_data, tmp_path, capsys):
    """Scripts and detached runs turn the progress bar off; SpeedMonitor then prints one line per window."""
    run_inprocess([], tmp_path / "run")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in lines] == ["step 5/20 (25%)", "step 10/20 (50%)", "step 15/20 (75%)",
                                                    "step 20/20 (100%)"]
    assert all(" | loss " in ln and " tok/s | " in ln and " ms/step" in ln for ln in lines)
    assert " | eta " in lines[0] and " | eta " not in lines[-1]


def test_a_fresh_run_in_an_occupied_folder_sets_the_earlier_run_aside(embedded_data, tmp_path, capsys):
    """Running the same command twice without ckpt_path: Lightning would delete the first run's metrics.csv and
    the second run's checkpoints would replace its own; train/run.py moves them to previous-1/ first."""
    out = tmp_path / "run"
    run_inprocess(["trainer.max_steps=10"], out)
    first = metrics(out)
    run_inprocess(["trainer.max_steps=5"], out)
    assert f"its files are now in {out / 'previous-1'} (to continue that run instead" in capsys.readouterr().out
    assert metrics(out / "previous-1") == first and max(series(first, "train/loss")) == 9
    assert max(series(metrics(out), "train/loss")) == 4  # the new run's own metrics only
    assert (out / "previous-1" / "checkpoints" / "last.ckpt").exists() and (out / "checkpoints" / "last.ckpt").exists()
    assert (out / "previous-1" / "calls.csv").read_text().count("\n") == 2  # header + the first run's one call


@pytest.mark.parametrize("resume_at,extra", [(4, []), (2, ["global_batch_size=4"])])
def test_resume_continues_the_same_curve(embedded_data, tmp_path, resume_at, extra):
    """Also from before half-way, where fewer batches are done than left: the loader's length once counted only
    what was left, so the resumed epoch ended early and read the same samples again (from step 6 of 8 here)."""
    common = ["trainer.max_steps=8", "callbacks.checkpoint.every_n_train_steps=2",
              "trainer.log_every_n_steps=1", "trainer.limit_val_batches=2", "eval_every_steps=4",
              "scheduler.warmup_steps=3", *extra]
    trainer_a, _ = run_inprocess(common, tmp_path / "a")
    ckpt = tmp_path / "a" / "checkpoints" / f"step{resume_at:07d}.ckpt"
    assert ckpt.exists()
    trainer_b, _ = run_inprocess(common + [f"ckpt_path={ckpt}"], tmp_path / "b")
    assert trainer_b.global_step == 8
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    loss_a, loss_b = series(a, "train/loss"), series(b, "train/loss")
    assert sorted(loss_b) == list(range(resume_at, 8))  # the logged step continues from the checkpoint
    for step in loss_b:  # same data, same dropout masks, same optimizer and LR state
        assert loss_b[step] == pytest.approx(loss_a[step], rel=1e-5), step
    lr_a, lr_b = series(a, "lr-AdamW/pg1"), series(b, "lr-AdamW/pg1")
    for step in lr_b:
        assert lr_b[step] == pytest.approx(lr_a[step], rel=1e-9)
    val_a, val_b = series(a, "val/ppl"), series(b, "val/ppl")
    assert sorted(val_b) == [s for s in sorted(val_a) if s >= resume_at] == [s for s in (3, 7) if s >= resume_at]
    for step in val_b:  # evaluations at the same steps as the unsplit run, with the same weights
        assert val_b[step] == pytest.approx(val_a[step], rel=1e-5), step


def test_a_chained_run_raises_no_false_alarms(embedded_data, tmp_path):
    """Lightning warns on a resumed call that its loader cannot resume, that the log folder's files will be deleted
    and that the checkpoint folder is not empty; train/run.py has dealt with each (HANDLED_WARNINGS), so none
    reaches the user."""
    import re
    import warnings

    from train.run import HANDLED_WARNINGS

    common = ["trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=2", "eval_every_steps=6"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_inprocess(common + ["callbacks.calls.max_steps=4"], tmp_path)  # a first call, stopped with a checkpoint
        trainer, _ = run_inprocess(common + ["ckpt_path=last"], tmp_path)
    assert trainer.global_step == 6
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if any(re.match(p, m) for p in HANDLED_WARNINGS)]


@pytest.mark.parametrize("overrides", [
    ["experiment=gpt2/small-corpus"],
    ["experiment=gpt2/medium-corpus"],
    ["experiment=gpt2/small-embedded"],
    ["model=gpt2-medium", "attn=sdpa"],
])
def test_every_experiment_and_model_config_runs(embedded_data, tmp_path, overrides):
    # Corpus experiments read the embedded tokens here (CI has no prepared corpus); the smoke
    # override shrinks the model, so this checks composition and wiring, not the recipe's scale.
    extra = ["trainer.max_steps=2", "trainer.limit_val_batches=1", "eval_every_steps=2",
             f"data.data_dir={embedded_data}", "global_batch_size=4"]
    trainer, task = run_inprocess(overrides + extra, tmp_path)
    assert trainer.global_step == 2
    assert trainer.accumulate_grad_batches == 2  # global batch 4 / micro-batch 2
    assert "val/ppl" in trainer.callback_metrics


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["flash", "blocksparse"])
def test_triton_attention_configs_slot_in(embedded_data, tmp_path, attn):
    trainer, _ = run_inprocess([f"attn={attn}", "trainer.max_steps=2", "trainer.limit_val_batches=1",
                                "eval_every_steps=2", "model.n_positions=64", "data.batch_size=1"], tmp_path)
    assert trainer.global_step == 2


def test_missing_data_fails_with_the_prepare_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python scripts/prepare_corpus.py"):
        run_inprocess(["data=corpus", f"data.data_dir={tmp_path / 'nothing'}"], tmp_path / "out")


@pytest.mark.parametrize("max_steps,profiled", [(6, 3), (4, 2)], ids=["whole-window", "run-ends-inside"])
def test_profile_window_writes_where_the_step_time_goes(embedded_data, tmp_path, max_steps, profiled):
    """callbacks.profile.start=2 steps=3: torch.profiler over optimizer steps 2-4, written to profile.{json,md};
    a run that ends inside the window reports the steps it profiled."""
    import json

    trainer, _ = run_inprocess([f"trainer.max_steps={max_steps}", "trainer.limit_val_batches=1",
                                f"eval_every_steps={max_steps}", "callbacks.profile.start=2",
                                "callbacks.profile.steps=3"], tmp_path)
    assert trainer.global_step == max_steps
    summary = json.loads((tmp_path / "profile.json").read_text())
    assert summary["steps"] == profiled and summary["start"] == 2 and summary["wall_ms"] > 0
    assert summary["top_host_ops"]  # on the CPU: host ops only (no kernels)
    md = (tmp_path / "profile.md").read_text()
    assert f"torch.profiler, optimizer steps 2-{2 + profiled - 1};" in md and "top host ops" in md


def test_profile_is_off_by_default_and_checks_its_window(embedded_data, tmp_path):
    from train.callbacks import StepProfiler

    run_inprocess(["trainer.max_steps=2", "trainer.limit_val_batches=1", "eval_every_steps=2"], tmp_path)
    assert not (tmp_path / "profile.json").exists()
    with pytest.raises(ValueError, match="profile window"):
        StepProfiler(start=3, steps=0)


def test_dropout_seed_draws_other_masks_from_the_same_init_and_data(embedded_data, tmp_path):
    """dropout_seed (the parity runs' other realisations, results/training/gpt2_parity_seeds/): with every dropout
    off, a run with it is the run without it, step for step (same init, same data order); with dropout on, the
    losses differ from the first step (other masks)."""
    def losses(name, overrides):
        run_inprocess(["trainer.max_steps=3", "trainer.log_every_n_steps=1", *overrides], tmp_path / name)
        return series(metrics(tmp_path / name), "train/loss")

    off = ["model.embd_pdrop=0.0", "model.attn_pdrop=0.0", "model.resid_pdrop=0.0"]
    assert losses("off", off) == losses("off_seed2", off + ["dropout_seed=2"])
    on, on_seed2 = losses("on", []), losses("on_seed2", ["dropout_seed=2"])
    assert sorted(on) == sorted(on_seed2) == [0, 1, 2]
    assert all(on[s] != on_seed2[s] for s in on)


def test_sigterm_stops_at_a_step_with_a_checkpoint_and_resumes(embedded_data, tmp_path):
    """SIGTERM to the whole process group (how a scheduler preempts a job), DataLoader workers included: the
    run stops at the next optimizer step with last.ckpt, calls.csv says so, and ckpt_path=last goes on from there."""
    import signal
    import time

    run_dir = tmp_path / "run"
    # No periodic evaluation: a SIGTERM that lands inside one stops without a checkpoint by design (no consistent
    # state to save there; calls.csv says so), which on a loaded machine made this test's timing flaky.
    cmd = [sys.executable, "train/run.py", *FAST, f"hydra.run.dir={run_dir}", "data.num_workers=2",
           "eval_every_steps=100000", "trainer.max_steps=100000", "callbacks.checkpoint.every_n_train_steps=100000"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    calls, deadline = run_dir / "calls.csv", time.time() + 240
    while not (calls.exists() and "running" in calls.read_text()) and p.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # some steps
    os.killpg(p.pid, signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in out, out[-3000:]
    with open(calls) as f:
        call = list(csv.DictReader(f))[-1]
    assert call["status"] == "stopped: SIGTERM", out[-3000:]
    assert "DataLoader worker" not in out
    stopped_at = int(call["end_step"])
    assert stopped_at > 0
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == stopped_at
    p = subprocess.run(cmd[:-2] + [f"trainer.max_steps={stopped_at + 2}", "ckpt_path=last"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(calls) as f:
        second = list(csv.DictReader(f))[-1]
    assert (second["start_step"], second["end_step"], second["status"]) == (str(stopped_at), str(stopped_at + 2),
                                                                             "finished")


def test_resuming_with_another_accumulation_is_refused(embedded_data, tmp_path):
    """The same global batch as other micro-batches (what the out-of-memory hint suggests) changes the accumulation,
    which Lightning's restored micro-batch counter does not follow: refused with what to do, not a silently
    different run."""
    common = ["trainer.max_steps=4", "callbacks.checkpoint.every_n_train_steps=2", "eval_every_steps=100000",
              "global_batch_size=4"]
    run_inprocess(common + ["data.batch_size=2"], tmp_path / "a")
    ckpt = tmp_path / "a" / "checkpoints" / "step0000002.ckpt"
    with pytest.raises(ValueError, match="gradient accumulation 2 and this run has 1"):
        run_inprocess(common + ["data.batch_size=4", f"ckpt_path={ckpt}"], tmp_path / "b")
    trainer, _ = run_inprocess(common + ["data.batch_size=2", f"ckpt_path={ckpt}"], tmp_path / "c")
    assert trainer.global_step == 4


def test_a_sigterm_after_the_step_hook_still_saves_that_step(embedded_data, tmp_path, monkeypatch):
    """The signal can land after CallLog's end-of-batch hook has looked and before Lightning's own check at the
    end of the batch (logging, a scheduler step): still between two steps, so last.ckpt is written for that step
    and the resumed run continues the unsplit run's curve. (On a loaded machine this window is what the
    process-group test above hits now and then.)"""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from train.callbacks import CallLog

    common = ["trainer.max_steps=8", "callbacks.checkpoint.every_n_train_steps=100000", "trainer.log_every_n_steps=1",
              "eval_every_steps=100000", "scheduler.warmup_steps=3"]
    run_inprocess(common, tmp_path / "a")
    hook = CallLog.on_train_batch_end

    def signal_lands_after_the_hook(self, trainer, *args):
        hook(self, trainer, *args)
        if trainer.global_step == 5:
            trainer._signal_connector.received_sigterm = True

    monkeypatch.setattr(CallLog, "on_train_batch_end", signal_lands_after_the_hook)
    with pytest.raises(SIGTERMException):
        run_inprocess(common, tmp_path / "b")
    monkeypatch.undo()
    with open(tmp_path / "b" / "calls.csv") as f:
        call = list(csv.DictReader(f))[-1]
    assert (call["end_step"], call["status"]) == ("5", "stopped: SIGTERM")
    assert torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 5
    trainer, _ = run_inprocess(common + ["ckpt_path=last"], tmp_path / "b")
    assert trainer.global_step == 8
    loss_a, loss_b = series(metrics(tmp_path / "a"), "train/loss"), series(metrics(tmp_path / "b"), "train/loss")
    assert sorted(loss_b) == [5, 6, 7]  # the resumed call goes on from the late checkpoint's step
    for step in (5, 6, 7):
        assert loss_b[step] == pytest.approx(loss_a[step], rel=1e-5), step


def test_compare_attention_streams_progress_and_reports_a_timeout(embedded_data, tmp_path):
    """compare_attention echoes each run's progress lines as they come, keeps the whole output in the run folder,
    and turns a run that outlives --timeout into an error row (its process group stopped) instead of crashing."""
    base = [sys.executable, "scripts/compare_attention.py", "--runs-dir", str(tmp_path / "runs"), "--out",
            str(tmp_path / "out"), "debug=smoke"]
    p = subprocess.run([*base, "--attn", "standard", "--name", "ok"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[standard] step 5/20 (25%) | loss " in p.stdout and "[standard] done: 20 steps" in p.stdout
    assert "step 20/20" in (tmp_path / "runs" / "standard" / "console.log").read_text()
    p = subprocess.run([*base, "--attn", "sdpa", "--name", "cut", "--timeout", "3"], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    table = (tmp_path / "out" / "cut.md").read_text()
    assert "timed out after 3" in table, table


def test_swap_eval_scores_the_runs_own_weights_with_each_kind(embedded_data, tmp_path, monkeypatch):
    """swap_eval loads a checkpoint's weights into the run's own config with attn= replaced: the run's kind gives
    back the validation perplexity the run logged at that step, the Triton kernel the same to rounding; and it
    names what is missing instead of evaluating something else."""
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "train/run.py", "debug=smoke", "trainer.enable_progress_bar=false",
                        f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from swap_eval import main

    out = main(["--run", str(run), "--attn", "standard,flash", "--steps", "20", "--out", str(tmp_path / "out")])
    logged = series(metrics(run), "val/ppl")[20 - 1]
    assert out[20]["standard"]["val/ppl"] == pytest.approx(logged, rel=1e-6)
    assert out[20]["flash"]["val/ppl"] == pytest.approx(logged, rel=1e-4)
    assert "flash vs standard: largest gap" in (tmp_path / "out" / "swap_eval.md").read_text()
    # parts over other checkpoints (one per GPU on the device) merge into one table; overlapping parts are refused
    for step in (10, 20):
        main(["--run", str(run), "--attn", "standard,sdpa", "--steps", str(step), "--out", str(tmp_path / "out"),
              "--name", f"part{step}"])
    parts = [str(tmp_path / "out" / f"part{step}.json") for step in (10, 20)]
    merged = main(["--merge", *parts, "--out", str(tmp_path / "out"), "--name", "all"])
    assert sorted(merged) == [10, 20] and merged[20]["standard"] == out[20]["standard"]
    assert "| 10 |" in (tmp_path / "out" / "all.md").read_text()
    with pytest.raises(ValueError, match="step 20 is in an earlier file"):
        main(["--merge", parts[1], parts[1], "--out", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="no checkpoint for steps"):
        main(["--run", str(run), "--steps", "15", "--out", str(tmp_path / "out")])
    with pytest.raises(FileNotFoundError, match="overrides.yaml"):
        main(["--run", str(tmp_path), "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("overrides,want", [
    (["experiment=lra/retrieval", "attn=standard"], "data.batch_size=16 global_batch_size=32"),
    (["experiment=lra/listops", "data.batch_size=16", "global_batch_size=32"], "data.batch_size=8 global_batch_size=32"),
    (["experiment=lra/text", "data.batch_size=15", "global_batch_size=30"], "data.batch_size=5 global_batch_size=30"),
    (["experiment=lra/text", "data.batch_size=1", "global_batch_size=32"], "at micro-batch 1: a smaller model"),
])
def test_out_of_memory_hint_keeps_the_batch(overrides, want):
    """After a CUDA OOM, run.py names the overrides that run the same batch per optimizer step in smaller
    micro-batches (the hint is checked to compose into a valid run: the batch still splits)."""
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers
    from train.run import out_of_memory_hint

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
        hint = out_of_memory_hint(cfg)
        assert want in hint
        if "global_batch_size=" in hint:
            new = compose("config", overrides=[*overrides, *hint.rsplit(": ", 1)[1].split()])
            assert new.global_batch_size % new.data.batch_size == 0 and new.data.batch_size < cfg.data.batch_size
