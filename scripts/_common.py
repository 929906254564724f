"""What every script shares: the checkout on sys.path, repo-relative paths, and the metadata block that
each results file records (GPU, library versions, UTC date and the command that reproduces the file from
the repository root).

    from _common import repo_root, run_metadata, markdown_header
    REPO = repo_root()                  # also makes `import kernels`, `import train` work
    meta = run_metadata()               # {"gpu", "torch", "triton", "python", "date", "command", ...}
    lines = markdown_header("Attention benchmark", meta)
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Environment variables that change what a kernel run measures: recorded in front of the command.
RECORDED_ENV_PREFIX = "FLASH_"


def require_gpu(script: str, what: str = "times CUDA kernels") -> None:
    """Stops a GPU-only script on a machine without a GPU, saying so, before it writes anything: each provider
    would fail there, and a table of errors (or a traceback from deep in a provider) says less."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"{script} {what}: it needs a GPU")


def repo_root() -> Path:
    """The checkout's root, put first on sys.path so that the scripts import the repo's packages."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return REPO


def repo_path(path: str | os.PathLike) -> Path:
    """A path given on the command line or as a default, resolved: relative paths count from the repo
    root (the scripts document their commands as run from there), so outputs land in the same folder
    whatever the working directory."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO / p


def rel(path: str | os.PathLike) -> str:
    """`path` as a results file records it: relative to the repo root when it lies inside the checkout."""
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def command_line(argv: list[str] | None = None) -> str:
    """The command that reproduces this run from the repo root: the FLASH_* settings in the environment,
    then `python scripts/NAME.py ARGS`, every argument inside the checkout made repo-relative."""
    argv = list(sys.argv if argv is None else argv)
    env = [f"{k}={_quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIX)]
    script = rel(Path(argv[0]).resolve()) if argv and argv[0] else "?"
    return " ".join([*env, "python", script, *(_quote(rel_arg(a)) for a in argv[1:])])


def rel_arg(arg: str) -> str:
    """An argument (`PATH`, `--opt=PATH`, a Hydra `key=PATH`) with an absolute PATH in the checkout made relative."""
    key, eq, value = arg.partition("=") if "=" in arg else ("", "", arg)
    return key + eq + rel(value) if os.path.isabs(value) else arg


def _quote(s: str) -> str:
    return shlex.quote(s) if not s or re.search(r"[\s'\"$`\\*?;&|<>()!{}\[\]]", s) else s


def run_metadata(argv: list[str] | None = None, *, device: bool = True, libs: tuple[str, ...] = ()) -> dict:
    """GPU, torch/triton/CUDA (and `libs`) versions, Python, UTC date and the reproducing command.

    device=False leaves the GPU out (tools that only compile). Imports torch/triton lazily so that
    `--help` stays fast."""
    import triton

    meta: dict = {}
    if device:
        import torch

        cuda = torch.cuda.is_available()
        meta["gpu"] = torch.cuda.get_device_name() if cuda else "cpu"
        if cuda:
            meta["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        meta.update(torch=torch.__version__, cuda=torch.version.cuda)
    meta["triton"] = triton.__version__
    for name in libs:
        meta[name] = __import__(name).__version__
    meta["python"] = platform.python_version()
    meta["host_cpu"] = host_cpu()
    meta["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta["command"] = command_line(argv)
    return meta


def host_cpu() -> str:
    """The host CPU's model name and core count: host-bound rows (small kernels, compiled graphs' launches)
    move with it between machines of the same GPU kind."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} x {os.cpu_count()}"


def ours_row_overrides(workdir: str, attn: str, compile_, *extra: str) -> list[str]:
    """The Hydra overrides that pick a bench row's attention, compile setting (true, false or a scope such as
    "model") and extra overrides, and its own scratch folder under workdir."""
    name = "-".join([attn, str(compile_), *(e.replace("=", "-") for e in extra)])
    return [f"attn={attn}", f"compile={str(compile_).lower()}", f"output_dir={workdir}/{name}", *extra]


def run_in_group(cmd: list[str], log: Path, timeout: float | None = None, echo=None,
                 stop_signal: int = signal.SIGTERM, grace: float = 60) -> tuple[int, list[str], bool]:
    """Run `cmd` from the repo root in its own session (process group: DDP ranks, DataLoader workers), its output
    appended to `log` line by line; echo(line) returns what to print of a line as it comes, or None. After `timeout` seconds the
    group gets `stop_signal` (train/run.py stops at the next optimizer step with a checkpoint on SIGTERM, Lightning
    gracefully on SIGINT) and SIGKILL `grace` seconds later; Ctrl-C here, or any error, stops it the same way
    rather than orphaning it. Returns (exit code, this run's output lines, timed out)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timed_out = threading.Event()

    def stop():
        for sig, wait in ((stop_signal, grace), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue

    timer = threading.Timer(timeout, lambda: (timed_out.set(), stop())) if timeout is not None else None
    if timer:
        timer.start()
    lines = []
    try:
        with open(log, "a") as f:
            for line in proc.stdout:
                f.write(line)
                lines.append(line.rstrip("\n"))
                shown = echo(line) if echo is not None else None
                if shown is not None:
                    print(shown, end="", flush=True)
        proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            stop()
    return proc.returncode, lines, timed_out.is_set()


def metrics_files(run_dir: Path) -> list[Path]:
    """A run's metrics files in call order: metrics.part1.csv, ..., metrics.csv (a resumed run keeps each
    earlier call's metrics.csv as metrics.partK.csv, train/run.py)."""
    parts = sorted(run_dir.glob("metrics.part*.csv"), key=lambda p: int(p.stem.removeprefix("metrics.part")))
    return [*parts, run_dir / "metrics.csv"]


def markdown_header(title: str, meta: dict) -> list[str]:
    """The first lines of every results table: title with the GPU, versions and date, the command."""
    versions = ", ".join(f"{k} {meta[k]}" for k in ("torch", "triton", "cuda", "transformers") if meta.get(k))
    gpu = f" ({meta['gpu']})" if meta.get("gpu") else ""
    host = f", host {meta['host_cpu']}" if meta.get("host_cpu") else ""
    return [f"# {title}{gpu}", "", f"{versions}{host}, {meta['date']}.", f"Command: `{meta['command']}`", ""]


def step_timer(warmup: int, total: int, per_step: bool = False):
    """A Lightning callback timing optimizer steps warmup .. total of a training run, with a device sync
    at both ends; after fit: .t0, .t1 (perf_counter seconds) and .loss (the last step's). Resets the peak
    memory counter when training starts. per_step: also a sync after every timed optimizer step, and .step_ms
    (each step's time; one sync per step, so leave it off where the step is short)."""
    import time

    import lightning as L
    import torch

    cuda = torch.cuda.is_available()

    class StepTimer(L.Callback):
        def on_train_start(self, trainer, pl_module):
            if cuda:
                torch.cuda.reset_peak_memory_stats()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == warmup and not hasattr(self, "t0"):
                cuda and torch.cuda.synchronize()
                self.t0, self.ends = time.perf_counter(), []
            elif per_step and hasattr(self, "t0") and trainer.global_step == warmup + len(self.ends) + 1 <= total:
                cuda and torch.cuda.synchronize()  # one sync per timed optimizer step: the per-step times
                self.ends.append(time.perf_counter())
            # Once: with gradient accumulation global_step stays at `total` for the next step's micro-batches
            if trainer.global_step == total and not hasattr(self, "t1"):
                cuda and torch.cuda.synchronize()
                self.t1 = time.perf_counter()
                # Lightning hands on the loss divided by the accumulation count
                self.loss = float(outputs["loss"]) * trainer.accumulate_grad_batches
                self.step_ms = [1000 * (b - a) for a, b in zip([self.t0] + self.ends, self.ends)] if per_step else None

    return StepTimer()


def run_row(cmd: list[str], name: str, timeout: float) -> dict:
    """Run one benchmark row in its own process (clean peak memory, no shared compile caches): the row
    prints `ROWJSON {...}`; a failure or timeout becomes {"row", "error"}. Adds the wall time, prints it."""
    import json
    import subprocess
    import time
    import traceback

    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("ROWJSON ")]
        if p.returncode == 0 and line:
            row = json.loads(line[-1][len("ROWJSON "):])
        else:
            row = {"row": name, "error": "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])}
    except subprocess.TimeoutExpired:
        row = {"row": name, "error": f"timed out after {timeout} s"}
    except Exception:
        row = {"row": name, "error": traceback.format_exc()[-2000:]}
    row["wall_s"] = time.time() - t
    print(name, {k: v for k, v in row.items() if k not in ("overrides", "profile")}, flush=True)
    return row


def every_row_failed(rows: list[dict]) -> bool:
    """Whether every row (there is at least one) failed for a reason other than running out of memory (a missing
    package, a broken checkout): a table of such rows would overwrite a good result with nothing."""
    return bool(rows) and all("error" in r and not r.get("oom") for r in rows)


def require_some_rows(rows: list[dict]) -> None:
    """Stop before writing a table in which every row failed (`every_row_failed`)."""
    if every_row_failed(rows):
        first = rows[0]["error"].strip().splitlines()[-1] if rows[0]["error"].strip() else "?"
        raise SystemExit(f"every row failed, nothing written (first row: {first})")


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display on the benchmark machines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_FLEX: dict = {}


def capture_graph(step, params):
    """`step` (a forward, or a forward+backward) captured in a CUDA graph, after warm-up on a side stream as capture
    requires; the params' .grad are cleared before each call so no accumulation kernel enters the graph. Replaying it
    times the device alone: no Python, autograd or launch path on the host."""
    import torch

    def clear():
        for t in params:
            t.grad = None

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            clear()
            step()
    torch.cuda.current_stream().wait_stream(side)
    clear()
    from train.cuda_graph import collector_paused

    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph):
        step()
    clear()
    return graph


def compose_config(overrides: list[str]):
    """The training config (configs/config.yaml) composed with Hydra overrides, as train/run.py would, without
    running anything."""
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def compiled_flex_attention():
    """torch.compile'd flex_attention, built once per process; a larger dynamo cache, since every new
    shape and block mask compiles its own graph."""
    if "fn" not in _FLEX:
        import torch
        import torch._dynamo as dynamo
        from torch.nn.attention.flex_attention import flex_attention

        dynamo.config.cache_size_limit = 256
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


# Where a training step's time goes: StepProfile and the report helpers live in train/profiling.py, shared
# with the training runs' own profiler callback (callbacks.profile).
repo_root()
from train.profiling import StepProfile, profile_markdown  # noqa: E402,F401


class LoopTimer:
    """Times steps warmup .. total of a hand-written training loop (a device sync at both ends), then
    profiles `profile` more steps (StepProfile). Call .at(step) at the top of every step, .end() after the
    loop; then .seconds and .summary (None without profiling)."""

    def __init__(self, warmup: int, total: int, profile: int = 0):
        self.warmup, self.total, self.profile = warmup, total, StepProfile(profile) if profile else None
        self.t0 = self.t1 = None

    def _now(self) -> float:
        import time

        import torch

        torch.cuda.is_available() and torch.cuda.synchronize()
        return time.perf_counter()

    def at(self, step: int) -> None:
        if step == self.warmup:
            self.t0 = self._now()
        if step == self.total and self.profile:
            self.t1 = self._now()
            self.profile.start()

    def end(self) -> None:
        if self.profile:
            self.profile.stop()
        else:
            self.t1 = self._now()

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    @property
    def summary(self) -> dict | None:
        return self.profile.summary if self.profile else None


def step_profiler(start: int, stop: int):
    """A Lightning callback that profiles optimizer steps start .. stop (none when stop == start); its
    .summary after fit (None without profiling)."""
    from train.callbacks import StepProfiler

    return StepProfiler(path=None, start=start if stop > start else None, steps=max(stop - start, 1))


