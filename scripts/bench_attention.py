"""Attention benchmark: runtime (forward, forward+backward), TFLOP/s and peak extra memory vs sequence length.

Providers: ours (kernels.flash), standard (plain PyTorch, the paper's baseline), PyTorch SDPA's flash,
efficient and cuDNN backends (torch.nn.attention.sdpa_kernel), FlexAttention (torch.compile'd).
Shapes follow the issue: batch x seqlen = 16K tokens, nheads x headdim = 2048, bf16.
FLOPs: 4 * B * H * N^2 * D forward (halved when causal), 3.5x that for forward+backward.

Full run (about 8 minutes on an H100):
    python scripts/bench_attention.py --out results/attention --tag h100
Quick tuning run:
    python scripts/bench_attention.py --seqlens 1024 4096 --hdims 128 --providers ours sdpa_flash --no-memory
Short rows, where the eager time can be the host's, with each provider's CUDA-graph replay beside it:
    python scripts/bench_attention.py --seqlens 512 1024 --hdims 64 128 --rounds 3 --graphed --tag short_graphed
The table with those replays at its short rows only (results/attention/rerun_h100.sh):
    python scripts/bench_attention.py --rounds 3 --graphed-upto 2048 --tag h100
What fused dropout costs at the GPT-2 small training shape (B 16, N 1024, H 12, D 64, causal, bf16): ours and
SDPA-flash with dropout 0 and 0.1, forward and forward+backward, one process:
    python scripts/bench_attention.py --dropout --tag dropout_gpt2
Every provider at the GPT-2 small and BERT-large (padded, varlen) training shapes, dropout 0 and 0.1:
    python scripts/bench_attention.py --model-shapes --rounds 3 --tag model_shapes_h100
  (--providers ours sdpa_cudnn: those rows only, in a minute or two)
Writes <tag>.csv, <tag>.json (rows + GPU, versions, date, command, autotune picks), <tag>.md, <tag>.png
(--dropout: <tag>.json and <tag>.md) to --out, by default results/attention/.
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from _common import (capture_graph, compiled_flex_attention, markdown_header, pyplot, repo_path, repo_root,
                     require_gpu, run_metadata)

repo_root()

PROVIDERS = ["ours", "standard", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex"]
TOKENS, WIDTH = 16384, 2048


def flops(b, h, n, d, causal, mode):
    f = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def sdpa_backend(name):
    """The SDPBackend of provider sdpa_flash / sdpa_efficient / sdpa_cudnn; None for sdpa_default (PyTorch picks)."""
    from torch.nn.attention import SDPBackend

    return {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
            "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_default": None}[name]


def make_provider(name, causal, n):
    """Return (fn(q, k, v) -> out, layout) where layout 'bnhd' or 'bhnd' is the provider's native one."""
    if name == "ours":
        from kernels.flash import flash_attn_func
        return (lambda q, k, v: flash_attn_func(q, k, v, causal=causal)), "bnhd"
    if name == "standard":
        from kernels.standard import standard_attention
        return (lambda q, k, v: standard_attention(q, k, v, causal=causal)), "bnhd"
    if name.startswith("sdpa_"):
        from torch.nn.attention import sdpa_kernel
        backend = sdpa_backend(name)

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn, "bhnd"
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask
        compiled = compiled_flex_attention()
        mask = None
        if causal:
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cuda")
        return (lambda q, k, v: compiled(q, k, v, block_mask=mask)), "bhnd"
    raise ValueError(name)


def inputs(shape, gen):
    """q, k, v (requiring grad) and dO, bf16 on the GPU, drawn from `gen`."""
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    return q, k, v, torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def time_modes(fn, q, k, v, do, modes, rep, row, graphed=False):
    """Median ms of `fn(q, k, v)` per mode ("fwd" under no_grad, "fwdbwd" = autograd.grad of q, k, v), and
    TFLOP/s from the shape in `row`; written into `row`. With `graphed`, also `<mode>_graphed_ms`: the same call
    captured in a CUDA graph and replayed, the device's time alone (where the eager time is the host's, at short
    kernels on a slow host, the two differ), or `<mode>_graph_error` where capture fails."""
    import triton.testing
    for mode in modes:
        if mode == "fwd":
            def run():
                with torch.no_grad():
                    fn(q, k, v)
        else:
            def run():
                torch.autograd.grad(fn(q, k, v), (q, k, v), do)
        run()  # compile / autotune outside the timing
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median")
        row[f"{mode}_ms"] = ms
        if graphed:
            try:
                graph = capture_graph(run, (q, k, v))
                row[f"{mode}_graphed_ms"] = triton.testing.do_bench(graph.replay, warmup=10, rep=rep,
                                                                    return_mode="median")
            except Exception as e:  # noqa: BLE001  (the eager time stands; the row says why there is no other)
                row[f"{mode}_graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            graph = None
        shape = row["batch"], row["heads"], row["seqlen"], row["hdim"], row["causal"]
        row[f"{mode}_tflops"] = flops(*shape, mode) / ms * 1e-9
    return row


def peak_extra_mib(fn, q, k, v, do) -> float:
    """Peak memory of one forward+backward beyond what was allocated before it, MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_point(names, b, h, n, d, causal, modes, memory, rep, rounds, setup=None, flop_count=None, graphed=False):
    """One row per provider at one shape (or, for a provider that fails there, a row with its error). With rounds >
    1 the providers are timed in turn, in alternating order, `rounds` times, and each mode's time is the median of
    the rounds' do_bench medians: the machine's speed drifts by several percent over minutes, which a ratio of two
    providers timed minutes apart would carry. setup(name) -> (fn, q, k, v, dO) and flop_count(mode) replace the
    uniform (b, n, h, d) batch of `make_provider` (the model shapes: a varlen batch, dropout). graphed: see
    `time_modes`; those times are medians over the rounds too."""
    if setup is None:
        def setup(name):
            fn, layout = make_provider(name, causal, n)
            shape = (b, n, h, d) if layout == "bnhd" else (b, h, n, d)
            return (fn, *inputs(shape, torch.Generator(device="cuda").manual_seed(0)))
    flop_count = flop_count or (lambda mode: flops(b, h, n, d, causal, mode))
    rows, state = {}, {}
    for name in names:
        row = {"provider": name, "hdim": d, "seqlen": n, "batch": b, "heads": h, "causal": causal}
        try:
            state[name] = setup(name)
            rows[name] = row
        except Exception as e:  # noqa: BLE001  (a peer without this shape: record and go on)
            rows[name] = {**row, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    times = {name: {m: [] for m in modes} for name in state}
    graph_times = {name: {m: [] for m in modes} for name in state}
    for r in range(rounds):
        for name in (list(state) if r % 2 == 0 else list(state)[::-1]):
            if "error" in rows[name]:
                continue
            try:
                t = time_modes(*state[name], modes, rep, dict(rows[name]), graphed=graphed)
            except Exception as e:  # noqa: BLE001
                rows[name]["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                torch.cuda.empty_cache()
                continue
            for m in modes:
                times[name][m].append(t[f"{m}_ms"])
                if f"{m}_graphed_ms" in t:
                    graph_times[name][m].append(t[f"{m}_graphed_ms"])
                elif f"{m}_graph_error" in t:
                    rows[name][f"{m}_graph_error"] = t[f"{m}_graph_error"]
    for name in state:
        row = rows[name]
        if "error" not in row:
            for m in modes:
                row[f"{m}_ms"] = statistics.median(times[name][m])
                row[f"{m}_tflops"] = flop_count(m) / row[f"{m}_ms"] * 1e-9
                if graph_times[name][m]:
                    row[f"{m}_graphed_ms"] = statistics.median(graph_times[name][m])
            if rounds > 1:
                row["rounds_ms"] = times[name]
        if memory and "error" not in row:
            row["peak_extra_MiB"] = peak_extra_mib(*state[name])
        state[name] = None
        torch.cuda.empty_cache()
    return [rows[name] for name in names]


GPT2_SMALL = dict(b=16, n=1024, h=12, d=64)


def dropout_cost(args, meta):
    """Ours and SDPA-flash at the GPT-2 small attention shape, causal, dropout 0 and 0.1, forward and
    forward+backward, in this process; writes <tag>.json and <tag>.md."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.flash import flash_attn_func
    b, n, h, d = GPT2_SMALL["b"], GPT2_SMALL["n"], GPT2_SMALL["h"], GPT2_SMALL["d"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for prov in ("ours", "sdpa_flash", "sdpa_default"):
        q, k, v, do = inputs((b, n, h, d) if prov == "ours" else (b, h, n, d), gen)
        for p in (0.0, 0.1):
            if prov == "ours":
                def fn(q, k, v, p=p):
                    return flash_attn_func(q, k, v, dropout_p=p, causal=True)
            elif prov == "sdpa_default":  # the backend PyTorch picks itself, as attn=sdpa gets in training
                def fn(q, k, v, p=p):
                    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            else:
                def fn(q, k, v, p=p):
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            row = {"kind": "dropout", "provider": prov, "dropout": p, "batch": b, "seqlen": n, "heads": h,
                   "hdim": d, "causal": True}
            rows.append(time_modes(fn, q, k, v, do, ("fwd", "fwdbwd"), args.rep, row))
            print(json.dumps(row), flush=True)
    meta["autotune"] = autotune_picks()
    base = os.path.join(args.out, args.tag)
    with open(base + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    md = dropout_markdown(rows, meta)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)


def dropout_markdown(rows, meta):
    ref = {(r["provider"], r["dropout"]): r for r in rows}
    lines = markdown_header("Fused dropout at the GPT-2 small attention shape", meta) + [
        "B 16, N 1024, H 12, D 64, causal, bf16; median ms of triton.testing.do_bench (forward under no_grad; "
        "forward+backward = autograd.grad of q, k, v). Ours draws the mask with one Philox4x32-7 call per 2 x 4 "
        "scores in the scores' own register layout (kernels/flash.py, dropout_keep); sdpa_default: the backend PyTorch picks itself (what attn=sdpa runs); "
        "every provider autotuned / run in this process.", "",
        "| provider | dropout | fwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | dropout cost fwd (ms) | dropout cost fwd+bwd (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        base0 = ref.get((r["provider"], 0.0))
        cost = [f"{r[k] - base0[k]:+.3f}" if base0 and r["dropout"] > 0 else "" for k in ("fwd_ms", "fwdbwd_ms")]
        lines.append(f"| {r['provider']} | {r['dropout']} | {r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | "
                     f"{r['fwdbwd_tflops']:.0f} | {cost[0]} | {cost[1]} |")
    return "\n".join(lines) + "\n"


# The two training shapes issue 13 names. BERT-large's batch is the micro-batch of results/bert/bench_bert.md (56
# sequences padded to 512) with real lengths drawn uniform in BERT_LENGTHS: mean 307, as that run's timed batches had
# (padding fraction 0.40).
MODEL_SHAPES = {"gpt2-small": dict(b=16, n=1024, h=12, d=64, causal=True, varlen=False),
                "bert-large": dict(b=56, n=512, h=16, d=64, causal=False, varlen=True)}
MODEL_PROVIDERS = ["ours", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_default", "flex"]
BERT_LENGTHS = (114, 500)


def bert_lengths(b: int, seed: int = 0) -> torch.Tensor:
    """Real lengths of one padded BERT batch, seeded (int64, on the host)."""
    lo, hi = BERT_LENGTHS
    return torch.randint(lo, hi + 1, (b,), generator=torch.Generator().manual_seed(seed))


def real_flops(lengths, h, d, causal, mode) -> float:
    """FLOPs of the real tokens only, each sequence its own n^2: a padded provider computes more in its time, so its
    TFLOP/s here is what the real work got."""
    return sum(flops(1, h, int(n), d, causal, mode) for n in lengths)


def model_setup(shape: dict, name: str, p: float, lengths: torch.Tensor):
    """(fn, q, k, v, dO) of provider `name` at a model shape with dropout p, as that model runs it: ours on the packed
    real tokens where the batch is padded (the models remove the padding once per forward), SDPA and Flex on the
    padded batch with its key-padding mask. Raises where the provider cannot run it."""
    from torch.nn.attention import sdpa_kernel

    b, n, h, d, causal, varlen = (shape[k] for k in ("b", "n", "h", "d", "causal", "varlen"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    if name == "ours":
        if varlen:
            from kernels.flash import flash_attn_varlen_func

            cu = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
            cu[1:] = torch.cumsum(lengths.to("cuda"), 0)
            longest = int(lengths.max())

            def packed(q, k, v):
                return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, dropout_p=p, check_seqlens=False)
            return (packed, *inputs((int(lengths.sum()), h, d), gen))
        from kernels.flash import flash_attn_func

        return (lambda q, k, v: flash_attn_func(q, k, v, dropout_p=p, causal=causal)), *inputs((b, n, h, d), gen)
    lens = lengths.to("cuda")
    if name == "flex":
        if p > 0:
            raise ValueError("FlexAttention has no dropout")
        from torch.nn.attention.flex_attention import create_block_mask

        if varlen:
            block = create_block_mask(lambda bi, hi, qi, ki: (qi < lens[bi]) & (ki < lens[bi]), b, None, n, n,
                                      device="cuda")
        else:
            block = create_block_mask(lambda bi, hi, qi, ki: qi >= ki, None, None, n, n, device="cuda")
        compiled = compiled_flex_attention()
        return (lambda q, k, v: compiled(q, k, v, block_mask=block)), *inputs((b, h, n, d), gen)
    backend = sdpa_backend(name)
    # SDPA's flash backend (FlashAttention-2) takes no mask: on a padded batch it computes the padding like real
    # tokens, which is what FA2 costs there without its varlen API (PyTorch does not expose it)
    mask = None
    if varlen and name != "sdpa_flash":
        mask = (torch.arange(n, device="cuda")[None, :] < lens[:, None])[:, None, None, :]

    def padded(q, k, v):
        if backend is None:  # the backend PyTorch picks itself (what attn=sdpa gets in training)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
    return (padded, *inputs((b, h, n, d), gen))


def model_shapes(args, meta):
    """Every provider at the GPT-2 small and BERT-large training shapes, dropout 0 and 0.1, forward and
    forward+backward, providers interleaved over --rounds; writes <tag>.json and <tag>.md."""
    rows = []
    base = os.path.join(args.out, args.tag)
    others = [p for p in args.providers or () if p not in MODEL_PROVIDERS]
    if others:
        raise SystemExit(f"--model-shapes runs {' '.join(MODEL_PROVIDERS)}, not {' '.join(others)}")
    providers = [p for p in MODEL_PROVIDERS if p in (args.providers or MODEL_PROVIDERS)]
    for shape_name, shape in MODEL_SHAPES.items():
        b, n, h, d, causal = (shape[k] for k in ("b", "n", "h", "d", "causal"))
        lengths = bert_lengths(b) if shape["varlen"] else torch.full((b,), n)
        for p in (0.0, 0.1):
            point = bench_point(providers, b, h, n, d, causal, ["fwd", "fwdbwd"], False, args.rep, args.rounds,
                                setup=functools.partial(model_setup, shape, p=p, lengths=lengths),
                                flop_count=functools.partial(real_flops, lengths, h, d, causal), graphed=True)
            for r in point:
                r.update(kind="model", shape=shape_name, dropout=p, real_tokens=int(lengths.sum()))
                rows.append(r)
                print(json.dumps(r), flush=True)
            meta["autotune"] = autotune_picks()
            with open(base + ".json", "w") as f:  # after every point: a run cut off still leaves its numbers
                json.dump({**meta, "rows": rows}, f, indent=1)
    md = model_shapes_markdown(rows, meta)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)


def model_shapes_markdown(rows, meta) -> str:
    lines = markdown_header("Attention at the model training shapes", meta) + [
        "Median ms of triton.testing.do_bench (forward under no_grad; forward+backward = autograd.grad of q, k, v)"
        + (f", median of {meta['rounds']} interleaved rounds" if meta.get("rounds", 1) > 1 else "") + "; TFLOP/s "
        "of the real tokens only; 'x ours' = the provider's time / ours (> 1: ours is faster). sdpa_default: the "
        "backend PyTorch picks itself (what attn=sdpa runs). Graphed: the same forward+backward captured in a CUDA "
        "graph and replayed (do_bench median), the device's time alone; where the eager time is well above it, the "
        "host's launch path (Python, autograd, launches) is what the eager column measured.", ""]
    for shape_name, shape in MODEL_SHAPES.items():
        sel = [r for r in rows if r.get("shape") == shape_name]
        if not sel:
            continue
        tokens = sel[0]["real_tokens"]
        if shape["varlen"]:
            lines += [f"## {shape_name}: {shape['b']} sequences padded to {shape['n']} ({tokens:,} real tokens of "
                      f"{shape['b'] * shape['n']:,}: lengths uniform in {BERT_LENGTHS[0]}-{BERT_LENGTHS[1]}), "
                      f"{shape['h']} heads of {shape['d']}, non-causal", "",
                      "Ours on the packed real tokens (the models remove the padding once per forward); SDPA and Flex "
                      "on the padded batch with its key-padding mask, except sdpa_flash (FlashAttention-2), which "
                      "takes no mask and computes the padding like real tokens.", ""]
        else:
            lines += [f"## {shape_name}: batch {shape['b']} x {shape['n']}, {shape['h']} heads of {shape['d']}, "
                      f"{'causal' if shape['causal'] else 'non-causal'}", ""]
        lines += ["| provider | dropout | fwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | x ours fwd | x ours fwd+bwd | "
                  "fwd+bwd ms, graphed | x ours, graphed |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in sorted({r["dropout"] for r in sel}):
            ours = next((r for r in sel if r["dropout"] == p and r["provider"] == "ours" and "error" not in r), None)
            for r in (r for r in sel if r["dropout"] == p):
                if "error" in r:
                    why = r["error"].splitlines()[0][:100].replace("|", "/")
                    lines.append(f"| {r['provider']} | {p} | {why} | - | - | - | - | - | - |")
                    continue
                graphed = (f"{r['fwdbwd_graphed_ms']:.3f}" if "fwdbwd_graphed_ms" in r
                           else r.get("fwdbwd_graph_error", "-").splitlines()[0][:60].replace("|", "/"))
                lines.append(f"| {r['provider']} | {p} | {r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | "
                             f"{r['fwdbwd_tflops']:.0f} | {_ratio(ours, r, 'fwd_ms')} | {_ratio(ours, r, 'fwdbwd_ms')} | "
                             f"{graphed} | {_ratio(ours, r, 'fwdbwd_graphed_ms')} |")
        lines.append("")
    return "\n".join(lines)


def standard_fits(b, h, n):
    # scores in bf16 plus their float32 copy for the log-sum-exp, softmax output and grads: ~12 bytes/score.
    free = torch.cuda.mem_get_info()[0]
    return 12 * b * h * n * n < 0.8 * free


def autotune_picks():
    try:
        from kernels import flash
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for name, k in (("fwd", flash._fwd_tuned), ("fwd_ws", flash._fwd_ws_tuned), ("dkdv", flash._dkdv_tuned),
                    ("dq", flash._dq_tuned)):
        out[name] = {str(key): str(cfg) for key, cfg in getattr(k, "cache", {}).items()}
    return out


def _ratio(o, p, key):
    return f"{p[key] / o[key]:.2f}" if o and p and key in o and key in p else "-"


def markdown(rows, meta):
    lines = markdown_header("Attention benchmark", meta) + [
             "batch x seqlen = 16K tokens, nheads x headdim = 2048, bf16. Cells: TFLOP/s forward / forward+backward "
             "(4BHN^2D forward, halved causal, x3.5 fwd+bwd; median of do_bench" + (
                 f", median of {meta['rounds']} interleaved rounds" if meta.get("rounds", 1) > 1 else "") +
             "). 'x peer' = peer time / our time "
             "(> 1: we are faster), fwd, fwd+bwd. mem = peak extra MiB during fwd+bwd." + (
                 " graphed: the same ratio of forward+backward times replayed from CUDA graphs (the device's time "
                 "alone, without the host's launch path), against each peer in the order named."
                 if any("fwdbwd_graphed_ms" in r for r in rows) else ""), ""]
    keys = sorted({(r["hdim"], r["causal"]) for r in rows if r.get("kind") != "gpt2"})
    provs = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    peers = [p for p in ("sdpa_flash", "flex", "sdpa_cudnn", "standard") if p in provs]
    graphed_peers = [p for p in peers if any(r["provider"] == p and "fwdbwd_graphed_ms" in r for r in rows)]
    graphed = any(r["provider"] == "ours" and "fwdbwd_graphed_ms" in r for r in rows) and graphed_peers
    for d, causal in keys:
        lines += [f"## head dim {d}, {'causal' if causal else 'non-causal'}", ""]
        head = "| seqlen | " + " | ".join(provs) + " | " + " | ".join(f"x {p}" for p in peers) + \
            (f" | graphed x {' / '.join(graphed_peers)}" if graphed else "") + \
            " | mem ours | mem sdpa_flash | mem standard |"
        lines += [head, "|" + "---|" * (1 + len(provs) + len(peers) + bool(graphed) + 3)]
        for n in sorted({r["seqlen"] for r in rows if r["hdim"] == d and r["causal"] == causal}):
            by = {r["provider"]: r for r in rows if r["hdim"] == d and r["causal"] == causal and r["seqlen"] == n
                  and r.get("kind") != "gpt2"}
            cells = []
            for p in provs:
                r = by.get(p)
                cells.append("-" if r is None else f"{r.get('fwd_tflops', float('nan')):.0f} / "
                             f"{r.get('fwdbwd_tflops', float('nan')):.0f}")
            o = by.get("ours")
            ratios = [f"{_ratio(o, by.get(p), 'fwd_ms')}, {_ratio(o, by.get(p), 'fwdbwd_ms')}" for p in peers]
            if graphed:
                ratios.append(" / ".join(_ratio(o, by.get(p), "fwdbwd_graphed_ms") for p in graphed_peers))
            mem = [f"{by[p]['peak_extra_MiB']:.0f}" if p in by and "peak_extra_MiB" in by[p] else "-"
                   for p in ("ours", "sdpa_flash", "standard")]
            lines.append(f"| {n} | " + " | ".join(cells + ratios + mem) + " |")
        lines.append("")
    g = [r for r in rows if r.get("kind") == "gpt2"]
    if g:
        lines += ["## GPT-2 medium attention (seq 1024, hdim 64, 16 heads, batch 64, causal)", "",
                  "| provider | fwd+bwd ms | fwd ms |", "|---|---|---|"]
        lines += [f"| {r['provider']} | {r['fwdbwd_ms']:.2f} | {r['fwd_ms']:.2f} |" for r in g]
        lines += ["", "Paper (A100, Dao et al. 2022): 7.3 ms FlashAttention vs 41.7 ms standard.", ""]
    return "\n".join(lines)


def plot(rows, path):
    plt = pyplot()
    rows = [r for r in rows if r.get("kind") != "gpt2"]
    keys = sorted({(r["hdim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 7), squeeze=False)
    for j, (d, causal) in enumerate(keys):
        sel = [r for r in rows if r["hdim"] == d and r["causal"] == causal]
        ns = sorted({r["seqlen"] for r in sel})
        std = {r["seqlen"]: r for r in sel if r["provider"] == "standard"}
        for p in PROVIDERS:
            if p == "standard":
                continue
            pr = {r["seqlen"]: r for r in sel if r["provider"] == p}
            xs = [n for n in ns if n in pr and n in std and "fwdbwd_ms" in pr[n]]
            if xs:
                axes[0, j].plot(xs, [std[n]["fwdbwd_ms"] / pr[n]["fwdbwd_ms"] for n in xs], "o-", label=p)
            xs = [n for n in ns if n in pr and n in std and "peak_extra_MiB" in pr[n] and "peak_extra_MiB" in std[n]]
            if xs:
                axes[1, j].plot(xs, [std[n]["peak_extra_MiB"] / max(pr[n]["peak_extra_MiB"], 1e-3) for n in xs],
                                "o-", label=p)
        axes[0, j].set_title(f"hdim {d}, {'causal' if causal else 'non-causal'}")
        axes[0, j].set_ylabel("fwd+bwd speedup over standard")
        axes[1, j].set_ylabel("memory saved (standard / provider)")
        for i in range(2):
            axes[i, j].set_xscale("log", base=2)
            axes[i, j].set_xlabel("sequence length")
            axes[i, j].grid(True, alpha=0.3)
        axes[0, j].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def merge(args):
    parts = [json.load(open(f)) for f in args.merge]
    gpus = {p.get("gpu") for p in parts}
    if len(gpus) != 1:
        raise SystemExit(f"the parts ran on different GPUs ({sorted(map(str, gpus))}): ratios across them mean nothing")
    meta = {k: v for k, v in parts[0].items() if k not in ("rows", "autotune")}
    meta["parts"] = [{k: p.get(k) for k in ("command", "date", "seconds", "rounds")} for p in parts]
    rounds = {p.get("rounds", 1) for p in parts}
    meta["rounds"] = rounds.pop() if len(rounds) == 1 else 1  # the table's caption names rounds only if all share them
    meta["command"] = " ; ".join(p["command"] for p in parts) + " ; then " + run_metadata(device=False)["command"]
    meta["date"] = " / ".join(p["date"] for p in parts)
    meta["autotune"] = [p.get("autotune") for p in parts]
    rows = [r for p in parts for r in p["rows"]]
    base = os.path.join(args.out, args.tag)
    with open(base + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    ok = [r for r in rows if "error" not in r]
    with open(base + ".md", "w") as f:
        f.write(markdown(ok, meta))
    plot(ok, base + ".png")
    print(f"{len(rows)} rows from {len(parts)} runs -> {base}.{{json,csv,md,png}}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--providers", nargs="+", default=None, choices=sorted(set(PROVIDERS + MODEL_PROVIDERS)),
                    help=f"default: {' '.join(PROVIDERS)}; with --model-shapes {' '.join(MODEL_PROVIDERS)}")
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    ap.add_argument("--flex-seqlens", type=int, nargs="*", default=None,
                    help="run FlexAttention only at these lengths (it compiles per shape: ~15 s each)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2-medium shape row")
    ap.add_argument("--rep", type=int, default=60, help="do_bench repetition time in ms")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the providers of each shape in turn this many times (alternating order) and keep each "
                         "one's median round: ratios from the same minutes")
    ap.add_argument("--graphed", action="store_true",
                    help="also time each provider (the standard baseline aside) replayed from CUDA graphs: the "
                         "device's time without the host's (the short rows are host-bound on a slow host)")
    ap.add_argument("--graphed-upto", type=int, default=0, metavar="N",
                    help="--graphed at lengths up to N only (where the eager rows are the host's: one 1K row read "
                         "0.70x cuDNN eager and 0.95x in the next run, the same code replayed alike both times)")
    ap.add_argument("--out", default="results/attention", help="output folder (relative: from the repo root)")
    ap.add_argument("--tag", default="bench")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no benchmark: join the rows of these runs' <tag>.json (one GPU, e.g. one call per head dim) "
                         "into <tag>.json/.csv/.md/.png; each part's command and date are kept")
    ap.add_argument("--dropout", action="store_true",
                    help="only the fused-dropout cost at the GPT-2 small shape (ours and SDPA-flash, p 0 and 0.1)")
    ap.add_argument("--model-shapes", action="store_true",
                    help="only the GPT-2 small and BERT-large (varlen) training shapes, every provider, dropout 0 and "
                         "0.1 (<tag>.json, <tag>.md)")
    args = ap.parse_args()

    if not args.merge:
        require_gpu("bench_attention.py", "times CUDA kernels (--merge works anywhere)")
    args.out = str(repo_path(args.out))
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        merge(args)
        return
    meta = run_metadata()
    meta["rounds"] = args.rounds
    if args.dropout:
        dropout_cost(args, meta)
        return
    if args.model_shapes:
        model_shapes(args, meta)
        return
    args.providers = args.providers or PROVIDERS
    if "sdpa_default" in args.providers:
        ap.error("sdpa_default is a --model-shapes provider")
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    rows = []
    t0 = time.time()
    base = os.path.join(args.out, args.tag)
    fields = ["kind", "provider", "hdim", "seqlen", "batch", "heads", "causal", "fwd_ms", "fwdbwd_ms", "fwd_tflops",
              "fwdbwd_tflops", "fwd_graphed_ms", "fwdbwd_graphed_ms", "peak_extra_MiB", "error"]

    def save():  # after every row, so a run cut off at its time limit still leaves its numbers
        meta["seconds"] = time.time() - t0
        meta["autotune"] = autotune_picks()
        with open(base + ".json", "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in fields})

    def record(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
        save()

    for d in args.hdims:
        h = WIDTH // d
        for causal in causals:
            for n in args.seqlens:
                b = max(1, TOKENS // n)
                names = [p for p in args.providers if not (p == "standard" and not standard_fits(b, h, n))
                         and not (p == "flex" and args.flex_seqlens and n not in args.flex_seqlens)]
                # the standard baseline (up to ~15x slower, ~33 GB at 8K) stays out of the interleaved rounds
                solo = [p for p in names if p == "standard"]
                for group in ([p for p in names if p not in solo], solo):
                    if group:
                        for r in bench_point(group, b, h, n, d, causal, args.modes, not args.no_memory, args.rep,
                                             args.rounds if len(group) > 1 else 1,
                                             graphed=(args.graphed or n <= args.graphed_upto)
                                             and group is not solo):
                            record(r)
    if not args.no_gpt2:
        for p in ["ours", "standard", "sdpa_flash"]:
            if p in args.providers:
                r = bench_point([p], 64, 16, 1024, 64, True, ["fwd", "fwdbwd"], False, args.rep, 1)[0]
                r["kind"] = "gpt2"
                record(r)
    save()
    md = markdown([r for r in rows if "error" not in r], meta)
    with open(base + ".md", "w") as f:
        f.write(md)
    try:
        plot([r for r in rows if "error" not in r], base + ".png")
    except Exception as e:  # noqa: BLE001
        print("plot failed:", e)
    print(md)
    print(f"total {meta['seconds']:.0f} s")


if __name__ == "__main__":
    main()
