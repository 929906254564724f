"""The FlashAttention paper's Table 3 on our framework: Long Range Arena accuracy and training speed for
every task x attention kind, written to results/lra/ (table3.md, table3.json, table3.png).

    python scripts/reproduce_lra.py                                  # everything: speed runs, then full runs
    python scripts/reproduce_lra.py --dry-run                        # print the commands, run nothing
    python scripts/reproduce_lra.py --tasks listops --kinds standard flash --seeds 1 2
    python scripts/reproduce_lra.py --max-steps 500 --speed-steps 100          # a quick pass
    python scripts/reproduce_lra.py --budget 560                     # stop in time for a 10-minute device call
    python scripts/reproduce_lra.py --collect outputs/lra            # the table from existing run folders only
    python scripts/reproduce_lra.py --tasks listops --kinds flash debug=smoke  # any Hydra override, every run

Two kinds of run, each its own `python train/run.py experiment=lra/TASK attn=KIND ...` process:
- speed runs, `--speed-steps` steps (default 200) per task x kind, no validation, no checkpoints, under
  RUNS/speed/TASK/KIND. They are rerun on every invocation that runs anything, so that the speedups over
  attn=standard always compare runs of one invocation (one device call, one GPU). Step time, tokens/s and
  peak memory are SpeedMonitor's steady state: every logged window of metrics.csv but the first.
- accuracy runs, the experiment's own recipe (or --max-steps, the warmup scaled in proportion), one per
  seed, under RUNS/TASK/KIND/seedS (seedS-stepsN with --max-steps); test/acc from metrics.csv. Resumable:
  a finished run (test/acc logged) is skipped, one that was cut off continues from its
  checkpoints/last.ckpt (checkpoints every --ckpt-every steps), its earlier metrics.csv kept beside.

--budget SECONDS bounds the whole invocation: no run starts without --min-run seconds left, and a run
still going at the deadline is interrupted (its last checkpoint stays); the table is written either way
and lists what is missing with the command that completes it.

Speed runs from a small carried folder (SPEED_PREPARE: ~23 MiB for the five tasks, instead of the full
data), split over two device calls that make one table:

    python scripts/reproduce_lra.py --prepare-speed-data data/cache/lra-speed       # once, on any machine
    python scripts/reproduce_lra.py --skip-accuracy --speed-data data/cache/lra-speed \\
        --tasks listops text retrieval --kinds standard flash blocksparse --speed-steps 60 \\
        --accumulate listops/standard=2 --accumulate text/standard=2 --accumulate retrieval/standard=4 \\
        --budget 480 --speed-timeout 150 --min-run 45 --runs outputs/lra-speed --out results/lra
    python scripts/reproduce_lra.py --skip-accuracy --speed-data data/cache/lra-speed --keep-speed \\
        --tasks image pathfinder --kinds standard flash blocksparse --speed-steps 100 \\
        --budget 480 --speed-timeout 150 --min-run 45 --runs outputs/lra-speed --out results/lra

attn=standard keeps ~7 bytes per score for the backward (the float32 softmax, the dropout mask, a bf16
copy for the second matmul) and needs about as much again while a layer runs: ListOps 32 x 8 heads x
2K^2 x 6 layers ~ 45 GiB kept, Text 32 x 4 x 4K^2 x 4 ~ 60 GiB, Retrieval (two documents) ~ 120 GiB;
hence the accumulation on an 80 GiB GPU, which is the default (DEFAULT_ACCUMULATE: the flags above only
spell it out). These are estimates: a run that still runs out of memory is listed as failed, and
`--keep-speed --tasks T --accumulate T/standard=2N` redoes task T.

--speed-data DIR: speed runs read task T from DIR/T (data.data_dir=...); accuracy runs are unaffected.
--speed-from A.json ...: a task this invocation measures no speed run for keeps the speed rows of the last
table that has them (--out's own table3.json first): e.g. `--collect outputs/lra --speed-from T.json` with the
table3.json a GPU machine wrote after `--skip-accuracy --tasks image pathfinder`, the other tasks' rows kept.
--keep-speed: only the speed runs of --tasks are rerun; other tasks' runs under RUNS/speed stay, each
with the session (GPU, command) that measured it, and the table covers them too. --accumulate
TASK/KIND=N: that task's runs of that kind, speed and accuracy, take their usual batch as N micro-batches
with gradient accumulation (data.batch_size=B/N global_batch_size=B), so that attn=standard fits in memory:
the same sequences per optimizer step; a speed row's step time and tokens/s cover the whole optimizer step,
so it compares with the others (the table notes it).

Data: each task reads the folder its data config names (configs/data/lra-*.yaml); --prepare runs the
prepare commands (cached, idempotent) first. Text, Retrieval and Image default to stand-ins for the
original data (train/lra/__init__.py STAND_INS); the table says which ran.
Relative paths (--runs, --out, --collect) count from the repo root.
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from _common import (compose_config, markdown_header, metrics_files, pyplot, rel, repo_path, repo_root, run_in_group,
                     run_metadata)

REPO = repo_root()

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder"}
KINDS = ("standard", "sdpa", "flash", "blocksparse")
KIND_OF_CLASS = {"StandardAttention": "standard", "SDPAttention": "sdpa", "FlashAttention": "flash",
                 "BlockSparseAttention": "blocksparse"}
# Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
# (arXiv 2205.14135), Table 3: test accuracy (%) and training speedup over the standard Transformer, A100.
PAPER = {
    "standard": {"name": "Transformer", "listops": 36.0, "text": 63.6, "retrieval": 81.6, "image": 42.3,
                 "pathfinder": 72.7, "avg": 59.3, "speedup": None},
    "flash": {"name": "FlashAttention", "listops": 37.6, "text": 63.9, "retrieval": 81.4, "image": 43.5,
              "pathfinder": 72.7, "avg": 59.8, "speedup": 2.4},
    "blocksparse": {"name": "Block-sparse FlashAttention", "listops": 37.0, "text": 63.0, "retrieval": 81.3,
                    "image": 43.6, "pathfinder": 73.3, "avg": 59.6, "speedup": 2.8},
}
# The original data of each task, for the stand-in column.
ORIGINAL = {"listops": "ListOps (LRA generator)", "text": "IMDB", "retrieval": "AAN", "image": "CIFAR-10",
            "pathfinder": "Pathfinder-32 (LRA generator)"}
PREPARE = {
    "listops": "python scripts/prepare_lra.py listops --out data/cache/lra/listops",
    "text": "python scripts/prepare_lra.py text --out data/cache/lra/text",
    "retrieval": "python scripts/prepare_lra.py retrieval --out data/cache/lra/retrieval",
    "image": "python scripts/prepare_lra.py image --out data/cache/lra/image",
    "pathfinder": "python scripts/prepare_lra.py pathfinder --resolution 32 --difficulty hard --num 200000 "
                  "--out data/cache/lra/pathfinder32-hard",
}
# The small folders the speed runs read with --speed-data DIR (DIR/TASK), built by --prepare-speed-data DIR.
# Speed runs read no val/test split (they must exist all the same) and cycle the train split (the
# datamodule reshuffles it every pass): 200 steps x 32 ListOps sequences are ~6 passes over 1,000. The
# sizes keep DIR ~23 MiB, small enough to carry to a GPU machine: a ListOps row is ~6.5 KB of text, a
# Retrieval pair up to 8 KB, an image 1 KB. Same sources and seeds as PREPARE, so the same length mix.
SPEED_PREPARE = {
    "listops": "python scripts/prepare_lra.py listops --num-train 1000 --num-val 50 --num-test 50 --out {out}",
    "text": "python scripts/prepare_lra.py text --num-train 2000 --num-val 100 --num-test 100 --out {out}",
    "retrieval": "python scripts/prepare_lra.py retrieval --num-train 1000 --num-val 100 --num-test 100 --out {out}",
    "image": "python scripts/prepare_lra.py image --num-train 2000 --num-val 200 --num-test 200 --out {out}",
    "pathfinder": "python scripts/prepare_lra.py pathfinder --resolution 32 --difficulty hard --num 3000 --out {out}",
}


# ---------------------------------------------------------------------------------------------- commands

def recipe(task: str) -> dict:
    """The experiment file's own step count, batch, warmup and evaluation interval (no composition needed)."""
    from omegaconf import OmegaConf

    e = OmegaConf.load(REPO / "configs" / "experiment" / "lra" / f"{task}.yaml")
    return {"max_steps": int(e.trainer.max_steps), "batch": int(e.data.batch_size),
            "warmup_steps": int(e.scheduler.warmup_steps), "eval_every_steps": int(e.get("eval_every_steps", 1000))}


@functools.lru_cache(maxsize=None)  # read_run asks once per run folder; callers only read the dict
def recipe_model(task: str) -> dict:
    """The model section the experiment builds now: its configs/model file, then the experiment's `model:`."""
    from omegaconf import OmegaConf

    e = OmegaConf.load(REPO / "configs" / "experiment" / "lra" / f"{task}.yaml")
    defaults = OmegaConf.to_container(e.defaults)
    name = next(d["override /model"] for d in defaults if isinstance(d, dict) and "override /model" in d)
    model = OmegaConf.merge(OmegaConf.load(REPO / "configs" / "model" / f"{name}.yaml"), e.get("model") or {})
    return OmegaConf.to_container(model)


def model_drift(task: str, run_model) -> list[str]:
    """'key: run value (now: value)' for each model setting where a run differs from what its experiment
    builds today (a key the run's config lacks took the constructor's default at the time): a run made
    before a model change is then marked in the table instead of being taken for the current recipe."""
    run = dict(run_model or {})
    # settings written as interpolations (${...}) are left out: the file and the run may hold them in
    # different (resolved or not) forms, and they follow other settings that are compared themselves
    literal = {k: v for k, v in recipe_model(task).items() if not (isinstance(v, str) and v.startswith("${"))}
    return [f"{k}: {run.get(k, 'unset')} (now {v})" for k, v in literal.items() if run.get(k) != v]


# Until this fix (train.data.ResumableSampler's length) a call resumed at step s of N, with s < N - s, ended its
# data epoch at step N - s and read the samples from step s on again after it.
RESUME_FIX_UTC = "2026-11-26T23:00:00+00:00"


def reread_spans(calls: list[dict] | None, max_steps) -> list[str]:
    """'steps a-b re-read the samples from step s': the training steps of a run made before RESUME_FIX_UTC
    that saw data an unsplit run would not have (read from its calls.csv)."""
    out = []
    for c in calls or []:
        start, end = int(c["start_step"] or 0), int(c["end_step"] or c["start_step"] or 0)
        if not isinstance(max_steps, int) or not start or c["started_utc"] >= RESUME_FIX_UTC:
            continue
        epoch_end = max_steps - start
        if start < epoch_end < end:
            out.append(f"steps {epoch_end}-{end} re-read the samples from step {start} (resume bug, fixed "
                       f"{RESUME_FIX_UTC[:10]})")
    return out


def accuracy_dir(runs: Path, task: str, kind: str, seed: int, max_steps: int | None) -> Path:
    return runs / task / kind / (f"seed{seed}" + (f"-steps{max_steps}" if max_steps else ""))


def speed_dir(runs: Path, task: str, kind: str) -> Path:
    return runs / "speed" / task / kind


def train_command(task: str, kind: str, run_dir: Path, overrides=(), python: str = "python") -> list[str]:
    return [python, "train/run.py", f"experiment=lra/{task}", f"attn={kind}", f"hydra.run.dir={rel(run_dir)}",
            "trainer.enable_progress_bar=false", *overrides]


def own_command(run_dir: Path, resume: bool = False) -> str | None:
    """The command line that made a run folder, from its .hydra/overrides.yaml (its own batch split, logger and
    other overrides included, the invocation's budget left out); with resume, continuing from its last.ckpt."""
    from omegaconf import OmegaConf

    f = run_dir / ".hydra" / "overrides.yaml"
    if not f.exists():
        return None
    drop = ("ckpt_path=", "callbacks.calls.budget_s=", "hydra.run.dir=")
    ov = [o for o in OmegaConf.to_container(OmegaConf.load(f)) if not o.startswith(drop)]
    ov.insert(2, f"hydra.run.dir={rel(run_dir)}")
    ckpt = resume_checkpoint(run_dir) if resume else None
    if ckpt is not None:
        ov.append(f"ckpt_path={rel(ckpt)}")
    return show(["python", "train/run.py", *ov])


def speed_command(task, kind, runs, steps, seed, extra=(), python="python", data_dir: str | None = None,
                  batch: tuple[int, int] | None = None) -> list[str]:
    """data_dir: the task's data folder (--speed-data); batch: (micro-batch, sequences per optimizer step)
    for a run that accumulates gradients (--accumulate). Both come after `extra`, so they win."""
    # No validation, test or checkpoints: only the training loop is timed.
    ov = [f"seed={seed}", f"trainer.max_steps={steps}", "trainer.limit_val_batches=0", "test_after_fit=false",
          "callbacks.checkpoint=null", "logger=csv", *extra]
    if data_dir is not None:
        ov.append(f"data.data_dir={data_dir}")
    if batch is not None:
        ov += [f"data.batch_size={batch[0]}", f"global_batch_size={batch[1]}"]
    return train_command(task, kind, speed_dir(runs, task, kind), ov, python)


def speed_data_dir(root: Path, task: str) -> str:
    """The data_dir override of a speed run reading root/TASK: `${repo:}/...` inside the checkout (like
    configs/data/lra-*.yaml: the command works from any clone), else the absolute path."""
    d = root / task
    r = rel(d)
    return "${repo:}/" + r if not Path(r).is_absolute() else str(d)


# attn=standard's micro-batches on an 80 GiB GPU (H100), for speed and accuracy runs alike: each task's batch of 32
# as 2 x 16 (ListOps, Text) or 4 x 8 (Retrieval), the splits the speed table measured at 28-39 GiB peak
# (results/lra/table3.md). --accumulate TASK/KIND=N replaces an entry; N=1 turns it off (e.g. on several GPUs).
DEFAULT_ACCUMULATE = {("listops", "standard"): 2, ("text", "standard"): 2, ("retrieval", "standard"): 4}


def parse_accumulate(specs) -> dict:
    """["text/standard=2", ...] -> {("text", "standard"): 2}; ValueError with the reason otherwise."""
    out = {}
    for spec in specs or ():
        key, eq, n = spec.partition("=")
        task, slash, kind = key.partition("/")
        if not (eq and slash):
            raise ValueError(f"--accumulate {spec!r}: expected TASK/KIND=N, e.g. retrieval/standard=2")
        if task not in TASKS or kind not in KINDS:
            raise ValueError(f"--accumulate {spec!r}: task must be one of {', '.join(TASKS)} and kind one of "
                             f"{', '.join(KINDS)}")
        try:
            steps = int(n)
        except ValueError:
            steps = 0
        if steps <= 0:
            raise ValueError(f"--accumulate {spec!r}: N must be a positive integer (micro-batches per step)")
        out[(task, kind)] = steps
    return out


def accumulated_batch(task: str, kind: str, n: int, extra=()) -> tuple[int, int]:
    """(micro-batch, sequences per step) for n accumulation steps: the run's own batch (the composed
    config, so the experiment, debug modes and overrides count) split into n micro-batches."""
    cfg = compose_config([f"experiment=lra/{task}", f"attn={kind}", *extra])
    total = int(cfg.get("global_batch_size") or cfg.data.batch_size)
    if total % n:
        raise ValueError(f"--accumulate {task}/{kind}={n}: the batch of {total} sequences does not split into "
                         f"{n} equal micro-batches ({task}/{kind}=1 runs it without accumulation)")
    return total // n, total


def accuracy_command(task, kind, runs, seed, max_steps=None, ckpt_every=500, extra=(), ckpt=None,
                     python="python", budget_s: float | None = None, batch: tuple[int, int] | None = None) -> list[str]:
    """budget_s: the run stops itself at the first optimizer step after that many seconds, saving
    checkpoints/last.ckpt there (train.callbacks.CallLog), so a call cut short by --budget loses no steps.
    batch: (micro-batch, sequences per optimizer step) with gradient accumulation, as for speed_command."""
    ov = [f"seed={seed}", f"callbacks.checkpoint.every_n_train_steps={ckpt_every}"]
    if budget_s is not None:
        ov.append(f"callbacks.calls.budget_s={int(budget_s)}")
    if max_steps:
        r = recipe(task)
        # The recipe's schedule shape at the shorter length: warmup scaled in proportion.
        ov += [f"trainer.max_steps={max_steps}",
               f"scheduler.warmup_steps={max(1, math.ceil(r['warmup_steps'] * max_steps / r['max_steps']))}"]
    ov += list(extra)
    if batch is not None:
        ov += [f"data.batch_size={batch[0]}", f"global_batch_size={batch[1]}"]
    if ckpt is not None:
        ov.append(f"ckpt_path={rel(ckpt)}")
    return train_command(task, kind, accuracy_dir(runs, task, kind, seed, max_steps), ov, python)


def show(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


# ---------------------------------------------------------------------------------------------- reading runs

def read_metrics(path: Path) -> list[dict]:
    """metrics.csv rows with the empty cells dropped and numbers as floats."""
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({k: float(v) for k, v in r.items() if k and v not in ("", None)})
    return rows


def last_value(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return vals[-1] if vals else None


def steady_speed(rows: list[dict]) -> dict:
    """SpeedMonitor.steady_state() from metrics.csv: every window but the first, weighted by its steps
    (a window's step count is the step difference to the previous logged window)."""
    win = [r for r in rows if "perf/step_time_ms" in r]
    if not win:
        return {}
    out_rows = []
    for prev, r in zip(win, win[1:]):
        steps = r["step"] - prev["step"]
        if steps <= 0:
            continue
        sec = r["perf/step_time_ms"] * steps / 1000
        out_rows.append((steps, sec, r.get("perf/tokens_per_s", 0.0) * sec))
    if not out_rows:  # a single window: report it rather than nothing
        r = win[0]
        out = {"step_time_ms": r["perf/step_time_ms"], "tokens_per_s": r.get("perf/tokens_per_s"), "windows": 1}
    else:
        steps, sec, tok = (sum(x[i] for x in out_rows) for i in range(3))
        out = {"step_time_ms": 1000 * sec / steps, "tokens_per_s": tok / sec, "windows": len(out_rows)}
    mem = [r["perf/peak_mem_gib"] for r in win if "perf/peak_mem_gib" in r]
    if mem:
        out["peak_mem_gib"] = max(mem)
    return out


def read_run(run_dir: Path) -> dict | None:
    """(task, kind, seed, steps, data source, metrics) of one run folder, from .hydra/config.yaml."""
    from omegaconf import OmegaConf

    cfg_path = run_dir / ".hydra" / "config.yaml"
    if not cfg_path.exists():
        return None
    cfg = OmegaConf.load(cfg_path)  # unresolved: only literal keys are read
    task = OmegaConf.select(cfg, "data.task")
    target = OmegaConf.select(cfg, "attn._target_") or ""
    kind = KIND_OF_CLASS.get(target.rsplit(".", 1)[-1])
    if task not in TASKS or kind is None:
        return None
    calls = [read_metrics(f) for f in metrics_files(run_dir)]
    rows = calls[-1]  # this (or the last) call's metrics.csv
    # the curve spans every call; where two logged the same step, the later (resumed) call's value counts
    curve = {int(r["step"]): r["val/acc"] for part in calls for r in part if "val/acc" in r and "step" in r}
    loss = {int(r["step"]): r["train/loss"] for part in calls for r in part if "train/loss" in r and "step" in r}
    call_log = read_calls(run_dir)
    source = OmegaConf.select(cfg, "data.source")
    model = OmegaConf.to_container(cfg.model) if "model" in cfg else None
    micro, total = OmegaConf.select(cfg, "data.batch_size"), OmegaConf.select(cfg, "global_batch_size")
    accum = total // micro if isinstance(total, int) and isinstance(micro, int) and micro and total > micro else 1
    return {"dir": run_dir, "task": task, "kind": kind, "seed": OmegaConf.select(cfg, "seed"),
            "accumulate": accum, "micro_batch": micro if isinstance(micro, int) else None,
            "max_steps": OmegaConf.select(cfg, "trainer.max_steps"), "source": source,
            "steps_done": int(max((r.get("step", 0) for r in rows), default=0)), "rows": rows,
            "test_acc": last_value(rows, "test/acc"), "val_acc": last_value(rows, "val/acc"),
            "val_curve": sorted(curve.items()), "train_loss_curve": sorted(loss.items()),
            "devices": run_devices(call_log),
            "speed": steady_speed(rows), "finished": finished(run_dir, rows, call_log),
            "model": model, "model_drift": model_drift(task, model),
            "data_drift": reread_spans(call_log, OmegaConf.select(cfg, "trainer.max_steps"))}


def read_calls(run_dir: Path) -> list[dict] | None:
    """The rows of the run's calls.csv (train.callbacks.CallLog), one per device call; None without the file."""
    f = run_dir / "calls.csv"
    if not f.exists():
        return None
    with open(f, newline="") as fh:
        return list(csv.DictReader(fh))


def run_devices(calls: list[dict] | None) -> list[str]:
    """'<device>[, <software>], <n> call(s), <first start> .. <last end>' per device (and software, where
    calls.csv records it) of a run's calls.csv rows."""
    by_device: dict = {}
    for r in calls or []:
        by_device.setdefault(", ".join(x for x in (r["device"], r.get("software")) if x), []).append(r)
    return [f"{d}, {len(rs)} call(s), {rs[0]['started_utc']} .. {rs[-1]['ended_utc'] or '?'}"
            for d, rs in by_device.items()]


def finished(run_dir: Path, rows=None, calls: list[dict] | None = None) -> bool:
    """An accuracy run is finished when it logged test/acc (run.py tests after fit), or when its last call
    ended training (calls.csv; runs with test_after_fit=false). A call stopped by its budget also prints
    run.py's `done:` line, so that line alone counts only for runs without calls.csv."""
    rows = read_metrics(run_dir / "metrics.csv") if rows is None else rows
    if last_value(rows, "test/acc") is not None:
        return True
    calls = read_calls(run_dir) if calls is None else calls
    if calls is not None:
        return bool(calls) and calls[-1]["status"] in ("finished", "ended before max_steps")
    log = run_dir / "stdout.log"
    return log.exists() and any(ln.startswith("done: ") for ln in log.read_text(errors="replace").splitlines())


def collect(runs: Path) -> dict:
    """Every run folder under `runs`: accuracy runs by (task, kind) -> seed, speed runs by (task, kind)."""
    acc: dict = {}
    speed: dict = {}
    for cfg in sorted(runs.rglob(".hydra/config.yaml")):
        run_dir = cfg.parent.parent
        r = read_run(run_dir)
        if r is None:
            continue
        is_speed = run_dir.relative_to(runs).parts[:1] == ("speed",)
        if is_speed:
            speed[(r["task"], r["kind"])] = r
            continue
        seeds = acc.setdefault((r["task"], r["kind"]), {})
        old = seeds.get(r["seed"])
        # One run per seed: a finished one over an unfinished one, then the longer recipe.
        if old is None or (r["finished"], r["max_steps"] or 0) > (old["finished"], old["max_steps"] or 0):
            seeds[r["seed"]] = r
    session = runs / "speed" / "session.json"
    # --keep-speed: each task's speed runs may come from another invocation, whose session sits beside them
    sessions = {p.parent.name: json.loads(p.read_text()) for p in sorted(runs.glob("speed/*/session.json"))}
    status = {(p.parent.parent.name, p.parent.name): p.read_text().strip()
              for p in sorted(runs.glob("speed/*/*/status"))}
    return {"accuracy": acc, "speed": speed, "speed_status": status, "speed_sessions": sessions,
            "speed_session": json.loads(session.read_text()) if session.exists() else None}


# ---------------------------------------------------------------------------------------------- the table

def stand_in(task: str, source: str | None) -> str:
    from train.lra import STAND_INS

    if source in STAND_INS:
        return f"stand-in: {source} for {STAND_INS[source]}"
    if source == "generated":
        return f"generated here ({ORIGINAL[task]})"
    return f"original ({source})" if source else "?"


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(found: dict, tasks=TASKS, kinds=KINDS) -> dict:
    """Accuracy (mean over finished seeds, in %) and speed per task x kind; speedups over standard."""
    out: dict = {"tasks": list(tasks), "kinds": list(kinds), "accuracy": {}, "speed": {}, "data": {},
                 "unfinished": [], "paper": PAPER, "speed_session": found.get("speed_session"),
                 "speed_sessions": {t: v for t, v in (found.get("speed_sessions") or {}).items() if t in tasks},
                 "speed_status": {}, "curves": []}
    for task in tasks:
        out["accuracy"][task], out["speed"][task] = {}, {}
        for kind in kinds:
            seeds = found["accuracy"].get((task, kind), {})
            done = {s: r for s, r in seeds.items() if r["finished"] and r["test_acc"] is not None}
            for s, r in seeds.items():
                out["curves"].append({"task": task, "kind": kind, "seed": s, "max_steps": r["max_steps"],
                                      "finished": s in done, "val_acc": r.get("val_curve", []),
                                      "train_loss": r.get("train_loss_curve", []),
                                      "data_drift": r.get("data_drift", [])})
                if s not in done:
                    out["unfinished"].append({"task": task, "kind": kind, "seed": s, "dir": rel(r["dir"]),
                                              "steps_done": r["steps_done"], "max_steps": r["max_steps"],
                                              "val_acc": r["val_acc"], "command": own_command(r["dir"], True),
                                              "devices": r.get("devices", []),
                                              "model_drift": r.get("model_drift", []),
                                              "data_drift": r.get("data_drift", [])})
                if r["source"] is not None:
                    out["data"][task] = {"source": r["source"], "note": stand_in(task, r["source"])}
            if done:
                accs = {int(s): 100 * r["test_acc"] for s, r in sorted(done.items())}
                out["accuracy"][task][kind] = {
                    "mean": sum(accs.values()) / len(accs), "seeds": accs,
                    "max_steps": sorted({r["max_steps"] for r in done.values()}),
                    "recipe_steps": recipe(task)["max_steps"], "dirs": [rel(r["dir"]) for r in done.values()],
                    "commands": {int(s): own_command(r["dir"]) for s, r in sorted(done.items())},
                    "devices": sorted({d for r in done.values() for d in r.get("devices", ())}),
                    "model_drift": sorted({d for r in done.values() for d in r.get("model_drift", ())}),
                    "data_drift": [f"seed {s}: {d}" for s, r in sorted(done.items()) for d in r.get("data_drift", ())]}
            sp = found["speed"].get((task, kind))
            if (task, kind) in (found.get("speed_status") or {}):  # failed, cut off (partly measured), no time
                out["speed_status"].setdefault(task, {})[kind] = found["speed_status"][(task, kind)]
            if sp and sp["speed"]:
                # the model's settings travel with the row, so that a table which keeps it later
                # (keep_earlier_speed) can tell whether the experiment still builds that model
                out["speed"][task][kind] = dict(sp["speed"], steps=sp["steps_done"], dir=rel(sp["dir"]),
                                                accumulate=sp["accumulate"], micro_batch=sp["micro_batch"],
                                                model=sp.get("model"),
                                                model_drift=sp["model_drift"] if sp.get("model") is not None else [])
                if sp["source"] is not None:
                    out["data"].setdefault(task, {"source": sp["source"], "note": stand_in(task, sp["source"])})
        base = out["speed"][task].get("standard", {}).get("step_time_ms")
        for kind, s in out["speed"][task].items():
            s["speedup"] = base / s["step_time_ms"] if base else None
    out["average"] = {}
    for kind in kinds:
        accs = [out["accuracy"][t][kind]["mean"] for t in tasks if kind in out["accuracy"][t]]
        # the paper averages all five tasks; a subset gets no average
        out["average"][kind] = sum(accs) / len(accs) if len(accs) == len(TASKS) else None
    out["mean_speedup"] = mean_speedups(out)
    out["parity"] = parity(out)
    for c in out["curves"]:  # every logged step of every run: used by parity, too long for table3.json
        c.pop("train_loss", None)
    return out


def _compare(a: list, b: list) -> dict | None:
    """Two validation curves [(step, acc)] at the steps both evaluated: count, last step, largest and last
    |difference| in points, and the mean signed difference a - b over the later half of those evaluations (a
    gap that keeps its sign shows there, where the largest one is often an early jump off a plateau); None
    when they share no evaluation."""
    bs = dict(b)
    both = [(step, acc, bs[step]) for step, acc in a if step in bs]
    if not both:
        return None
    gaps = [100 * abs(x - y) for _, x, y in both]
    return {"evals": len(both), "up_to": both[-1][0], "max_gap": max(gaps), "last_gap": gaps[-1],
            "late_mean": 100 * _late_mean(a, b)}


def _late_mean(a: list, b: list) -> float | None:
    """Mean of a - b over the later half of the steps both curves [(step, value)] logged; None if none."""
    bs = dict(b)
    both = [(x, bs[step]) for step, x in a if step in bs]
    late = both[len(both) // 2:]
    return sum(x - y for x, y in late) / len(late) if late else None


def parity(summary: dict) -> list[dict]:
    """Quality parity from the validation curves: each kind against attn=standard at the same seed, and
    as the noise to judge those by, the same kind across two seeds (each over the evaluations both runs
    made: a cut-off run compares on its prefix)."""
    curves = {(c["task"], c["kind"], c["seed"]): c["val_acc"] for c in summary.get("curves", []) if c["val_acc"]}
    losses = {(c["task"], c["kind"], c["seed"]): c.get("train_loss") or [] for c in summary.get("curves", [])}
    reread = {(c["task"], c["kind"], c["seed"]) for c in summary.get("curves", []) if c.get("data_drift")}
    rows = []

    def pair(a, b, **labels):
        cmp = _compare(curves[a], curves[b])
        if cmp:
            rows.append(dict(cmp, late_loss=_late_mean(losses.get(a, []), losses.get(b, [])),
                             reread=bool({a, b} & reread), **labels))

    for (task, kind, seed) in sorted(curves):
        if kind != "standard" and (task, "standard", seed) in curves:
            pair((task, kind, seed), (task, "standard", seed), task=task, pair=f"{kind} vs standard", seeds=str(seed))
        for (t2, k2, s2) in sorted(curves):
            if (t2, k2) == (task, kind) and s2 > seed:
                pair((task, kind, seed), (t2, k2, s2), task=task, pair=f"{kind} seed vs seed", seeds=f"{seed}, {s2}")
    return rows


def mean_speedups(summary: dict) -> dict:
    """{kind: geometric mean of its speedups over the tasks measured}."""
    return {kind: geomean([summary["speed"][t].get(kind, {}).get("speedup") for t in summary["tasks"]])
            for kind in summary["kinds"]}


def keep_earlier_speed(summary: dict, tables: list[Path]) -> None:
    """Accuracy runs span many device calls, each task's speed runs one: a task whose speed runs this
    invocation did not collect takes its rows (runs, session, command) from the last of `tables` (earlier
    table3.json files, e.g. one that came back from a GPU machine) that measured it."""
    fresh = {t for t in summary["tasks"] if summary["speed"].get(t)}
    used: dict = {}
    for path in tables:
        if not path.exists():
            continue
        old = json.loads(path.read_text())
        for t in summary["tasks"]:
            if t in fresh or not old.get("speed", {}).get(t):
                continue
            summary["speed"][t] = {k: v for k, v in old["speed"][t].items() if k in summary["kinds"]}
            for row in summary["speed"][t].values():  # against today's experiment; rows from before had no model
                if row.get("model") is not None:
                    row["model_drift"] = model_drift(t, row["model"])
            if t in (old.get("speed_status") or {}):
                summary["speed_status"][t] = old["speed_status"][t]
            session = (old.get("speed_sessions") or {}).get(t) or old.get("speed_session")
            if session:  # per task: tables from different invocations each name their own
                summary["speed_sessions"][t] = session
            if t in (old.get("data") or {}):
                summary["data"].setdefault(t, old["data"][t])
            summary["speed_session"] = summary["speed_session"] or old.get("speed_session")
            used[t] = rel(path)
    if not used:
        return
    summary["mean_speedup"] = mean_speedups(summary)
    summary["speed_kept_from"] = {t: used[t] for t in summary["tasks"] if t in used}
    print("speed rows kept from earlier tables: " + ", ".join(f"{t} ({p})" for t, p in used.items()), flush=True)


def _f(x, fmt="{:.1f}", none="-"):
    return none if x is None else fmt.format(x)


def markdown(summary: dict, meta: dict) -> str:
    tasks, kinds = summary["tasks"], summary["kinds"]
    lines = markdown_header("Long Range Arena: the FlashAttention paper's Table 3 on our framework", meta)
    if "table_written_on" in meta:
        lines[2:2] = ["Versions and date on the next line: the machine that wrote this table; the runs' own GPU "
                      "and dates are in the speed-run lines and the run tables below.", ""]
    sessions = summary.get("speed_sessions") or {}
    groups: dict = {}  # one line per invocation (--keep-speed puts several in one table)
    for t in tasks:
        if t in sessions:
            groups.setdefault(json.dumps(sessions[t], sort_keys=True), []).append(t)
    if not groups and summary.get("speed_session"):
        groups[json.dumps(summary["speed_session"], sort_keys=True)] = []
    for key, ts in groups.items():
        sess = json.loads(key)
        which = f" ({', '.join(TASK_TITLES[t] for t in ts)})" if len(groups) > 1 else ""
        data = f", data {sess['speed_data']}" if sess.get("speed_data") else ""
        lines += [f"Speed runs{which}: {sess.get('gpu', '?')}, torch {sess.get('torch', '?')}, {sess.get('date', '?')}"
                  f"{data}, `{sess.get('command', '?')}`."]
    if len({json.loads(k).get("gpu") for k in groups}) > 1:
        lines += ["The speed runs of different tasks ran on different GPUs: the mean speedups mix them."]
    kept: dict = {}
    for t, path in (summary.get("speed_kept_from") or {}).items():
        kept.setdefault(path, []).append(TASK_TITLES[t])
    for path, ts in kept.items():
        lines += [f"(Speed rows of {', '.join(ts)} kept from {path}: this invocation measured no speed run for them.)"]
    if groups:
        lines.append("")
    short = any(a["max_steps"] != [a["recipe_steps"]] for t in tasks for a in summary["accuracy"][t].values())
    lines += ["Test accuracy (%), mean over the finished seeds; speedup: training step time of attn=standard "
              "over this kind's, same task, same invocation, geometric mean over the tasks measured.", "",
              "| attention | " + " | ".join(TASK_TITLES[t] for t in tasks) + " | Avg | speedup | paper Avg | "
              "paper speedup |", "|---|" + "---:|" * (len(tasks) + 4)]
    for kind in kinds:
        cells = []
        for t in tasks:
            a = summary["accuracy"][t].get(kind)
            mark = "" if a is None or a["max_steps"] == [a["recipe_steps"]] else "\\*"
            cells.append(_f(a and a["mean"]) + mark)
        p = PAPER.get(kind, {})
        sp = summary["mean_speedup"].get(kind)
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {_f(summary['average'].get(kind))} | "
                     f"{_f(sp, '{:.2f}x')} | {_f(p.get('avg'))} | {_f(p.get('speedup'), '{:.1f}x')} |")
    if short:
        lines += ["", "\\* shorter than the experiment's recipe (trainer.max_steps below); not comparable with "
                  "the paper's numbers."]
    lines += ["", "The paper (Dao et al. 2022, Table 3, A100):", "",
              "| model | " + " | ".join(TASK_TITLES[t] for t in TASKS) + " | Avg | speedup |",
              "|---|" + "---:|" * (len(TASKS) + 2)]
    for kind, p in PAPER.items():
        lines.append(f"| {p['name']} (attn={kind}) | " + " | ".join(_f(p[t]) for t in TASKS)
                     + f" | {_f(p['avg'])} | {_f(p['speedup'], '{:.1f}x')} |")

    lines += ["", "Training speed, SpeedMonitor's steady state (every logged window but the first):", "",
              "| task | attention | step (ms) | tokens/s | vs standard | peak mem (GiB) | steps | note |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    accumulated = False
    for t in tasks:
        for kind in kinds:
            s = summary["speed"][t].get(kind)
            if s is None:
                why = (summary.get("speed_status") or {}).get(t, {}).get(kind)
                lines.append(f"| {TASK_TITLES[t]} | {kind} | not measured | | | | | {why or ''} |")
                continue
            notes = [(summary.get("speed_status") or {}).get(t, {}).get(kind)]
            if s.get("model_drift"):
                notes.append("model since changed: " + "; ".join(s["model_drift"]))
            if (s.get("accumulate") or 1) > 1:
                accumulated = True
                notes.insert(0, f"accumulated: {s['accumulate']} x {s['micro_batch']}")
            note = "; ".join(n for n in notes if n)
            lines.append(f"| {TASK_TITLES[t]} | {kind} | {s['step_time_ms']:.1f} | {_f(s.get('tokens_per_s'), '{:,.0f}')}"
                         f" | {_f(s.get('speedup'), '{:.2f}x')} | {_f(s.get('peak_mem_gib'), '{:.2f}')} "
                         f"| {s['steps']} | {note} |")
    if accumulated:
        lines += ["", "accumulated: N x B: the step's batch as N micro-batches of B with gradient accumulation "
                  "(--accumulate), so that attn=standard fits in memory: the same sequences per optimizer step, and "
                  "step time and tokens/s cover the whole step, so they compare with the other rows; peak memory is "
                  "that of one micro-batch."]

    lines += ["", "Runs (accuracy): steps run / the recipe's, seeds, the command of each seed's run, where it ran "
              "(its calls.csv):", "",
              "| task | attention | steps | seeds: test acc (%) | command | device | differs from today's code |",
              "|---|---|---|---|---|---|---|"]
    for t in tasks:
        for kind in kinds:
            a = summary["accuracy"][t].get(kind)
            if a:
                cmds = "; ".join(f"`{c}`" for c in (a.get("commands") or {}).values() if c)
                lines.append(f"| {TASK_TITLES[t]} | {kind} | {'/'.join(map(str, a['max_steps']))} of "
                             f"{a['recipe_steps']} | " + ", ".join(f"{s}: {v:.1f}" for s, v in a["seeds"].items())
                             + f" | {cmds} | {'; '.join(a.get('devices') or [])} | {'; '.join((a.get('model_drift') or []) + (a.get('data_drift') or []))} |")
    cut = summary.get("unfinished") or []
    if cut:
        lines += ["", "Runs cut off (resumable; the commands are under Missing), the last validation accuracy:", "",
                  "| task | attention | seed | steps done | val acc (%) | device | differs from today's code |",
                  "|---|---|---|---|---:|---|---|"]
        lines += [f"| {TASK_TITLES[u['task']]} | {u['kind']} | {u['seed']} | {u['steps_done']} of {u['max_steps']} "
                  f"| {_f(u.get('val_acc') and 100 * u['val_acc'])} | {'; '.join(u.get('devices') or [])} "
                  f"| {'; '.join((u.get('model_drift') or []) + (u.get('data_drift') or []))} |"
                  for u in cut]
    if summary.get("curves"):
        lines += ["", "Validation accuracy of every run against its step: table3_curves.png."]
    if summary.get("parity"):
        lines += ["", "Quality parity: validation accuracy of two runs at the evaluations both made (a cut-off run "
                      "compares on its prefix); the same kind across seeds is the run-to-run noise to judge the "
                      "kinds' gaps by. Later half: the mean signed difference (first run minus second) over the "
                      "later half of those evaluations, and of the training loss over the later half of the steps "
                      "both logged. Same seed means the same initialisation and data order, not the same dropout "
                      "masks: the kinds draw attention dropout differently, so the masks after it differ too, and "
                      "`dropout_seed` (other masks, same init and data) is the noise to judge a same-seed gap by "
                      "(LRA Image: results/lra/probes/image-dropout/):", "",
                  "| task | runs | seeds | evaluations | up to step | largest gap (points) | gap at the last | "
                  "later half, signed (points) | training loss, later half, signed |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {TASK_TITLES[p['task']]} | {p['pair']}{' *' if p.get('reread') else ''} | {p['seeds']} | "
                  f"{p['evals']} | {p['up_to']} | "
                  f"{p['max_gap']:.1f} | {p['last_gap']:.1f} | {_f(p.get('late_mean'), '{:+.1f}')} | "
                  f"{_f(p.get('late_loss'), '{:+.3f}')} |" for p in summary["parity"]]
        if any(p.get("reread") for p in summary["parity"]):
            lines += ["", "\\* one of the two runs re-read samples after a resume (the runs table says which steps): "
                      "from there on the two did not see the same data."]
    lines += ["", "Data:", ""]
    for t in tasks:
        d = summary["data"].get(t)
        lines.append(f"- {TASK_TITLES[t]}: {d['note'] if d else 'no run'}")
    missing = summary.get("missing") or []
    if missing:
        lines += ["", "Missing (not run, or cut off; each command runs or resumes it):", ""]
        lines += [f"- {m['task']} / {m['kind']} / seed {m['seed']}: {m['why']}: `{m['command']}`" for m in missing]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    plt = pyplot()
    tasks, kinds = summary["tasks"], summary["kinds"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(kinds)
    for ax, what in zip(axes, ("accuracy", "speedup")):
        for i, kind in enumerate(kinds):
            if what == "accuracy":
                ys = [summary["accuracy"][t].get(kind, {}).get("mean") for t in tasks]
            else:
                ys = [summary["speed"][t].get(kind, {}).get("speedup") for t in tasks]
            xs = [j + (i - (len(kinds) - 1) / 2) * width for j in range(len(tasks))]
            ax.bar(xs, [y or 0 for y in ys], width, label=kind)
            if what == "accuracy" and kind in PAPER:
                ax.scatter(xs, [PAPER[kind][t] for t in tasks], marker="_", s=200, color="k", zorder=3,
                           label="paper" if kind == "standard" else None)
        if what == "speedup":
            for kind, ls in (("flash", "--"), ("blocksparse", ":")):
                if kind in kinds:
                    ax.axhline(PAPER[kind]["speedup"], color="k", ls=ls, lw=1, label=f"paper {kind}")
            ax.set_ylabel("training step speedup over attn=standard")
        else:
            ax.set_ylabel("test accuracy (%)")
        ax.set_xticks(range(len(tasks)), [TASK_TITLES[t] for t in tasks])
        ax.legend(fontsize=8)
    fig.suptitle("Long Range Arena (FlashAttention paper Table 3 analogue)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(summary: dict, path: Path) -> None:
    """Validation accuracy against the optimizer step, one panel per task with runs; the paper's
    Transformer and FlashAttention test accuracies as horizontal references."""
    plt = pyplot()
    tasks = [t for t in summary["tasks"] if any(c["task"] == t and c["val_acc"] for c in summary["curves"])]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.8), squeeze=False)
    colors = {k: f"C{i}" for i, k in enumerate(KINDS)}
    for ax, t in zip(axes[0], tasks):
        for c in summary["curves"]:
            if c["task"] != t or not c["val_acc"]:
                continue
            steps, accs = zip(*c["val_acc"])
            recipe_run = c["max_steps"] == recipe(t)["max_steps"]
            label = f"{c['kind']} s{c['seed']}" + ("" if recipe_run else f" ({c['max_steps']} steps)") + \
                ("" if c["finished"] else ", cut off")
            ax.plot(steps, [100 * a for a in accs], marker=".", color=colors[c["kind"]],
                    ls="-" if recipe_run else ":", label=label)
        for kind, ls in (("standard", "--"), ("flash", "-.")):
            ax.axhline(PAPER[kind][t], color="k", ls=ls, lw=0.8, label=f"paper {kind} (test)")
        ax.set_title(TASK_TITLES[t])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("val accuracy (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(summary: dict, meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "table3.json").write_text(json.dumps({"env": meta, **summary}, indent=1, default=str))
    (out / "table3.md").write_text(markdown(summary, meta))
    plot(summary, out / "table3.png")
    if any(c["val_acc"] for c in summary.get("curves", [])):
        plot_curves(summary, out / "table3_curves.png")


# ---------------------------------------------------------------------------------------------- running

class Runner:
    """Runs one command at a time as its own process (group), within an optional deadline."""

    def __init__(self, deadline: float | None, min_run: float, dry_run: bool):
        self.deadline, self.min_run, self.dry_run = deadline, min_run, dry_run

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()

    # Seconds a run that stops itself (callbacks.calls.budget_s) keeps in hand for what follows its last
    # step: the validation due there, writing last.ckpt, and the interpreter's exit.
    SELF_STOP_MARGIN = 45

    def self_stop_budget(self) -> float | None:
        """budget_s for a run started now, so that it stops with a checkpoint before the deadline's SIGINT
        (which loses the steps since the last periodic checkpoint); None without a deadline."""
        if self.deadline is None or self.dry_run:
            return None
        return max(self.left() - self.SELF_STOP_MARGIN, 1.0)

    def run(self, cmd: list[str], log: Path, timeout: float | None = None) -> str:
        """'ok', 'failed', 'cut off' (the deadline or the timeout interrupted it) or 'no time'."""
        print("$", show(cmd), flush=True)
        if self.dry_run:
            return "dry run"
        if self.left() < self.min_run:
            return "no time"
        limit = min(self.left(), timeout or math.inf)
        # on the limit, SIGINT: Lightning stops gracefully and the last checkpoint stays
        rc, _, cut = run_in_group([sys.executable, *cmd[1:]], log, None if math.isinf(limit) else limit,
                                  stop_signal=signal.SIGINT, grace=30)
        if cut:
            return "cut off"
        return "ok" if rc == 0 else "failed"


def prepare_speed_data(root: Path, tasks, runner: Runner, runs: Path):
    """Build root/TASK for each task with SPEED_PREPARE's caps (cached: a folder already built is kept)."""
    failed = []
    for t in tasks:
        log = runs / "prepare" / f"speed-{t}.log"
        status = runner.run(shlex.split(SPEED_PREPARE[t].format(out=shlex.quote(rel(root / t)))), log)
        if status not in ("ok", "dry run"):
            failed.append(f"{t} ({status}; log {rel(log)})")
    if failed:
        raise SystemExit(f"--prepare-speed-data: failed for {', '.join(failed)}")
    if not runner.dry_run:
        size = sum(f.stat().st_size for t in tasks for f in (root / t).rglob("*") if f.is_file())
        print(f"{rel(root)}: {', '.join(tasks)}, {size / 2**20:.1f} MiB", flush=True)
    return None


def resume_checkpoint(run_dir: Path) -> Path | None:
    last = run_dir / "checkpoints" / "last.ckpt"
    return last if last.exists() else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides added to every run, e.g. debug=smoke")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[1])
    ap.add_argument("--max-steps", type=int, default=None, help="accuracy runs: steps instead of the recipe's")
    ap.add_argument("--speed-steps", type=int, default=200, help="steps of each speed run")
    ap.add_argument("--ckpt-every", type=int, default=500, help="accuracy runs: checkpoint interval (steps)")
    ap.add_argument("--skip-speed", action="store_true", help="keep the speed runs already in RUNS/speed")
    ap.add_argument("--skip-accuracy", action="store_true", help="speed runs only")
    ap.add_argument("--speed-data", default=None, metavar="DIR",
                    help="speed runs read task T's data from DIR/T (built by --prepare-speed-data DIR); "
                         "accuracy runs keep their configs' folders")
    ap.add_argument("--prepare-speed-data", default=None, metavar="DIR",
                    help="only build DIR/T, the small folders of the speed runs, for every --tasks T")
    ap.add_argument("--keep-speed", action="store_true",
                    help="rerun the speed runs of --tasks only and keep those of other tasks in RUNS/speed, so "
                         "that several invocations (device calls) make one table")
    ap.add_argument("--accumulate", action="append", default=[], metavar="TASK/KIND=N",
                    help="that task's runs of that kind (speed and accuracy) split the batch into N micro-batches "
                         "with gradient accumulation (same sequences per step; e.g. retrieval/standard=2); "
                         "repeatable; defaults for attn=standard on 80 GiB: " + ", ".join(
                             f"{t}/{k}={n}" for (t, k), n in DEFAULT_ACCUMULATE.items()) + "; N=1 turns one off")
    ap.add_argument("--prepare", action="store_true", help="run the tasks' data preparation first")
    ap.add_argument("--budget", type=float, default=None, help="seconds this invocation may take")
    ap.add_argument("--min-run", type=float, default=60, help="seconds a run needs left to start")
    ap.add_argument("--speed-timeout", type=float, default=600, help="seconds a speed run may take")
    ap.add_argument("--runs", default="outputs/lra", help="root of the run folders")
    ap.add_argument("--collect", default=None, metavar="DIR", help="only collect the run folders under DIR")
    ap.add_argument("--out", default="results/lra")
    ap.add_argument("--speed-from", nargs="+", default=[], metavar="TABLE3_JSON",
                    help="earlier tables whose speed rows fill the tasks this invocation measures no speed run for "
                         "(after --out's own table3.json; the last table that measured a task wins)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_intermixed_args(argv)  # overrides may come before and after options
    if args.speed_steps <= 0:
        ap.error(f"--speed-steps must be a positive integer, got {args.speed_steps}")
    try:
        accumulate = {**DEFAULT_ACCUMULATE, **parse_accumulate(args.accumulate)}
    except ValueError as e:
        ap.error(str(e))
    t0 = time.time()
    runner = Runner(None if args.budget is None else t0 + args.budget, args.min_run, args.dry_run)
    runs = repo_path(args.collect or args.runs)
    extra = list(args.overrides)
    missing = []

    if args.prepare_speed_data:
        return prepare_speed_data(repo_path(args.prepare_speed_data), args.tasks, runner, runs)
    batches = {}  # (task, kind) -> (micro-batch, batch) of every run that accumulates, missing commands' too
    try:
        for (t, kind), n in accumulate.items():
            if t in args.tasks and kind in args.kinds and n > 1:
                batches[(t, kind)] = accumulated_batch(t, kind, n, extra)
    except ValueError as e:
        ap.error(str(e))

    def run_command(t, kind, seed, max_steps=args.max_steps, ckpt=None, budget_s=None):
        """The accuracy run of (t, kind, seed) as this invocation runs or lists it."""
        return accuracy_command(t, kind, runs, seed, max_steps, args.ckpt_every, extra, ckpt, budget_s=budget_s,
                                batch=batches.get((t, kind)))

    speed_data = repo_path(args.speed_data) if args.speed_data else None
    if not args.collect:
        if args.prepare:
            for t in args.tasks:
                runner.run(PREPARE[t].split(), runs / "prepare" / f"{t}.log")
        if not args.skip_speed:
            seed = args.seeds[0]
            if speed_data is not None and not args.dry_run:
                from train.lra.datamodule import is_ready

                absent = [t for t in args.tasks if not is_ready(t, speed_data / t)]
                if absent:
                    raise SystemExit(f"--speed-data {rel(speed_data)}: no prepared data for {', '.join(absent)} "
                                     f"(DIR/TASK); build it with: python scripts/reproduce_lra.py "
                                     f"--prepare-speed-data {rel(speed_data)} --tasks {' '.join(absent)}")
            if not args.dry_run:
                # One invocation's speeds per task, never mixed: --keep-speed keeps other tasks' runs only.
                for old in ([runs / "speed" / t for t in args.tasks] if args.keep_speed else [runs / "speed"]):
                    shutil.rmtree(old, ignore_errors=True)
                session = run_metadata(argv and ["reproduce_lra.py", *argv])
                if speed_data is not None:
                    session["speed_data"] = rel(speed_data)
                (runs / "speed").mkdir(parents=True, exist_ok=True)
                (runs / "speed" / "session.json").write_text(json.dumps(session))
                for t in args.tasks:
                    (runs / "speed" / t).mkdir()
                    (runs / "speed" / t / "session.json").write_text(json.dumps(session))
            # standard first: every other kind of a task is compared with it
            for t in args.tasks:
                for kind in sorted(args.kinds, key=lambda k: k != "standard"):
                    d = speed_dir(runs, t, kind)
                    cmd = speed_command(t, kind, runs, args.speed_steps, seed, extra,
                                        data_dir=speed_data_dir(speed_data, t) if speed_data is not None else None,
                                        batch=batches.get((t, kind)))
                    status = runner.run(cmd, d / "stdout.log", args.speed_timeout)
                    if status not in ("ok", "dry run"):
                        print(f"  speed {t}/{kind}: {status}", flush=True)
                        d.mkdir(parents=True, exist_ok=True)
                        (d / "status").write_text(f"{status}: {rel(d / 'stdout.log')}\n"
                                                  if status != "no time" else "no time left\n")
        if not args.skip_accuracy:
            for t in args.tasks:
                for kind in args.kinds:
                    for seed in args.seeds:
                        d = accuracy_dir(runs, t, kind, seed, args.max_steps)
                        if finished(d):
                            print(f"  done already: {rel(d)}", flush=True)
                            continue
                        ckpt = resume_checkpoint(d)
                        # resumed: train/run.py keeps the cut-off metrics.csv as metrics.partK.csv
                        cmd = run_command(t, kind, seed, ckpt=ckpt, budget_s=runner.self_stop_budget())
                        status = runner.run(cmd, d / "stdout.log")
                        if status not in ("ok", "dry run"):
                            ckpt = resume_checkpoint(d)
                            missing.append({"task": t, "kind": kind, "seed": seed, "why": status,
                                            "command": show(run_command(t, kind, seed, ckpt=ckpt))})
                            print(f"  {t}/{kind}/seed{seed}: {status}", flush=True)
        if args.dry_run:
            return None

    found = collect(runs)
    tasks = args.tasks
    if args.keep_speed:  # the table covers the kept tasks too
        tasks = [t for t in TASKS if t in args.tasks or any(k[0] == t for k in found["speed"])]
    summary = summarize(found, tasks, args.kinds)
    if not args.dry_run:
        keep_earlier_speed(summary, [repo_path(args.out) / "table3.json", *map(repo_path, args.speed_from)])
    known = {(m["task"], m["kind"], m["seed"]) for m in missing}
    for u in summary["unfinished"]:
        if (u["task"], u["kind"], u["seed"]) not in known:
            d = REPO / u["dir"]
            steps = u["max_steps"] if u["max_steps"] != recipe(u["task"])["max_steps"] else None
            last = resume_checkpoint(d)
            missing.append({"task": u["task"], "kind": u["kind"], "seed": u["seed"],
                            "why": f"cut off at step {u['steps_done']} of {u['max_steps']}"
                                   + ("" if last else " (no last.ckpt here: the command starts it again)"),
                            "command": u.get("command") or show(run_command(u["task"], u["kind"], u["seed"], steps,
                                                                            last))})
    for (t, kind), seeds in sorted(found["accuracy"].items()):
        for seed, r in sorted(seeds.items()):
            if t in args.tasks and r["finished"] and r.get("data_drift") and (t, kind, seed) not in known:
                steps = r["max_steps"] if r["max_steps"] != recipe(t)["max_steps"] else None
                missing.append({"task": t, "kind": kind, "seed": seed,
                                "why": "re-read samples after a resume (the runs table says which steps); the "
                                       "command runs it again, and train/run.py moves the earlier run to previous-1/",
                                "command": show(run_command(t, kind, seed, steps))})
    known |= {(m["task"], m["kind"], m["seed"]) for m in missing}
    for t in args.tasks:
        for kind in args.kinds:
            if kind in summary["accuracy"][t] or any(k[:2] == (t, kind) for k in known):
                continue
            for seed in args.seeds:
                missing.append({"task": t, "kind": kind, "seed": seed, "why": "not run",
                                "command": show(run_command(t, kind, seed))})
    summary["missing"] = missing
    meta = run_metadata(argv and ["scripts/reproduce_lra.py", *argv])
    if summary["speed_session"] and summary["speed_session"].get("gpu"):
        # the runs' GPU, not that of the machine collecting them
        meta = dict(meta, gpu=summary["speed_session"]["gpu"], table_written_on=meta["gpu"])
    write_results(summary, meta, repo_path(args.out))
    print((repo_path(args.out) / "table3.md").read_text())
    return summary


if __name__ == "__main__":
    main()
