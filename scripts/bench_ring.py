"""Ring attention over N GPUs (context parallelism) against flash attention on one GPU, same total length.

    torchrun --standalone --nproc-per-node 2 scripts/bench_ring.py        # -> results/longctx/ring_attention.{json,md}
    torchrun --standalone --nproc-per-node 2 scripts/bench_ring.py --device cpu --seqlen 256 --out /tmp/ring_check

One sequence of `--seqlen` tokens (default 64K), batch 1, heads x head dim 16 x 64, bf16, split over the
ranks (kernels/ring.py; NCCL, one GPU per rank). Rows, for each mask (non-causal, causal): `ring`
(contiguous split), `ring-zigzag` (causal only: the balanced split), and `flash-1gpu`
(kernels.flash.flash_attn_func on the whole sequence on rank 0 alone while the others wait; "OOM" when it
does not fit). Per row: forward (under no_grad) and forward+backward (autograd.grad of q, k, v) times, the
median of `--rounds` rounds of `--iters` calls after `--warmup` calls; a ring time is the slowest rank's.
Fixed call counts on purpose: triton's do_bench picks its count from its own timing, which differs per rank,
and a rank that calls the ring once more than the others waits forever. TFLOP/s count the whole attention (4
b h n^2 d, halved when causal; x3.5 for forward+backward) over all GPUs. Peak memory per GPU:
torch.cuda.max_memory_allocated during one forward+backward, inputs included, the largest over the ranks.
The ring's outputs and gradients are gathered on rank 0 and compared with the one-GPU run (max abs
difference, bf16).

--device cpu runs the same code on gloo with the Triton kernels under TRITON_INTERPRET=1 (set here), as a
quick check of the script (under two minutes at 256 tokens on two cores); its times mean nothing and it records
no memory. Its defaults: fp32 (the interpreter has no bf16), 2 heads, one round of one call, no warmup.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time

from _common import command_line, markdown_header, rel, repo_path, repo_root, run_metadata

repo_root()

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def flops(b, h, n, d, causal, mode):
    f = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, args, distributed: bool) -> list[float]:
    """ms per call of fn for each round (fixed counts: every rank makes the same calls)."""
    import torch.distributed as dist

    for _ in range(args.warmup):
        fn()
    rounds = []
    for _ in range(args.rounds):
        sync(args.device)
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        sync(args.device)
        rounds.append((time.perf_counter() - t0) * 1e3 / args.iters)
    return rounds


def peak_gib(fn, device):
    """Peak allocated GiB during one call (inputs included); None on the CPU."""
    import torch

    if device != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated() / 2**30


def full_inputs(args, dtype, device):
    """q, k, v, dO of the whole sequence, identical on every rank (one seeded generator)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(args.seed)
    b, n, h, hk, d = args.batch, args.seqlen, args.heads, args.kv_heads or args.heads, args.head_dim
    return [torch.randn(b, n, nh, d, device=device, dtype=dtype, generator=gen) for nh in (h, hk, hk, h)]


def measure(fn_fwd, q, k, v, do, args, distributed):
    """fwd / fwd+bwd times (ms per round) and peak memory; returns (row fields, out, grads)."""
    import torch

    def fwd():
        with torch.no_grad():
            fn_fwd(q, k, v)

    def fwdbwd():
        return torch.autograd.grad(fn_fwd(q, k, v), (q, k, v), do)

    row = {"fwd_rounds_ms": timed(fwd, args, distributed), "fwdbwd_rounds_ms": timed(fwdbwd, args, distributed)}
    row["peak_GiB"] = peak_gib(fwdbwd, args.device)
    out = fn_fwd(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), do)
    return row, out.detach(), grads


def ring_row(name, causal, zigzag, args, dtype, rank, world):
    """Time the ring on this rank's chunk; rank 0 gets the row (slowest rank's times, largest peak) and
    the gathered output and gradients (on the CPU); the others get (None, None)."""
    import torch
    import torch.distributed as dist

    from kernels.ring import ring_attn_func, shard_sequence, unshard_sequence

    full = full_inputs(args, dtype, args.device)
    q, k, v, do = [shard_sequence(x, rank, world, zigzag).contiguous() for x in full]
    del full
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    row, out, grads = measure(lambda q, k, v: ring_attn_func(q, k, v, causal=causal, zigzag=zigzag), q, k, v, do,
                              args, distributed=True)
    # Per-rank medians to rank 0: the ring's time is its slowest rank's.
    stats = torch.tensor([statistics.median(row["fwd_rounds_ms"]), statistics.median(row["fwdbwd_rounds_ms"]),
                          row["peak_GiB"] or 0.0], dtype=torch.float64, device=args.device)
    every = [torch.empty_like(stats) for _ in range(world)]
    dist.all_gather(every, stats)
    gathered = []
    for t in (out, *grads):  # the ring's result on the whole sequence, for the check against one GPU
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        gathered.append(unshard_sequence(parts, zigzag).cpu() if rank == 0 else None)
        del parts
    del q, k, v, do, out, grads
    if args.device == "cuda":
        torch.cuda.empty_cache()
    if rank != 0:
        return None, None
    every = torch.stack(every).cpu()
    row.update(provider=name, causal=causal, gpus=world, fwd_ms=float(every[:, 0].max()),
               fwdbwd_ms=float(every[:, 1].max()), per_rank_fwd_ms=every[:, 0].tolist(),
               per_rank_fwdbwd_ms=every[:, 1].tolist())
    row["peak_GiB"] = float(every[:, 2].max()) if args.device == "cuda" else None
    row["per_rank_peak_GiB"] = every[:, 2].tolist() if args.device == "cuda" else None
    return row, gathered


def single_row(causal, args, dtype):
    """flash_attn_func on the whole sequence, this process alone (rank 0). Returns (row, [out, dq, dk, dv])."""
    import torch

    from kernels.flash import flash_attn_func

    row = {"provider": "flash-1gpu", "causal": causal, "gpus": 1}
    try:
        q, k, v, do = full_inputs(args, dtype, args.device)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        fields, out, grads = measure(lambda q, k, v: flash_attn_func(q, k, v, causal=causal), q, k, v, do, args,
                                     distributed=False)
    except torch.cuda.OutOfMemoryError:
        return dict(row, error="OOM"), None
    row.update(fields, fwd_ms=statistics.median(fields["fwd_rounds_ms"]),
               fwdbwd_ms=statistics.median(fields["fwdbwd_rounds_ms"]))
    result = [t.cpu() for t in (out, *grads)]
    del q, k, v, do, out, grads
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return row, result


def compare(ring, single) -> dict:
    return {name: float((a.float() - b.float()).abs().max()) for name, a, b in zip(("out", "dq", "dk", "dv"), ring,
                                                                                      single)}


def markdown(rows, meta) -> str:
    a = meta["args"]
    lines = markdown_header("Ring attention (context parallelism) vs one GPU", meta)
    lines += [f"One sequence of {a['seqlen']} tokens, batch {a['batch']}, heads x head dim {a['heads']} x "
              f"{a['head_dim']}{', kv heads %d' % a['kv_heads'] if a['kv_heads'] else ''}, {a['dtype']}; "
              f"{meta['world_size']} ranks ({meta['backend']}). Times: median of {a['rounds']} rounds of "
              f"{a['iters']} calls, a ring's time is its slowest rank's; TFLOP/s: the whole attention over all "
              "GPUs; peak: max allocated per GPU during forward+backward, inputs included (largest rank). "
              "`vs 1 GPU`: the one-GPU time divided by this row's. `max diff`: largest abs difference of "
              "out / dq / dk / dv from the one-GPU run.", "",
              "| mask | provider | GPUs | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | vs 1 GPU fwd | "
              "vs 1 GPU fwd+bwd | peak GiB/GPU | max diff out / dq / dk / dv |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        mask = "causal" if r["causal"] else "non-causal"
        if "error" in r:
            lines.append(f"| {mask} | {r['provider']} | {r['gpus']} | {r['error']} | | | | | | | |")
            continue
        one = next((s for s in rows if s["provider"] == "flash-1gpu" and s["causal"] == r["causal"]
                    and "error" not in s), None)
        shape = a["batch"], a["heads"], a["seqlen"], a["head_dim"], r["causal"]
        tf = [flops(*shape, m) / r[f"{m}_ms"] * 1e-9 for m in ("fwd", "fwdbwd")]
        vs = [f"{one[f'{m}_ms'] / r[f'{m}_ms']:.2f}x" if one else "-" for m in ("fwd", "fwdbwd")]
        peak = f"{r['peak_GiB']:.2f}" if r.get("peak_GiB") is not None else "-"
        diff = " / ".join(f"{r['max_abs_diff'][n]:.2g}" for n in ("out", "dq", "dk", "dv")) \
            if r.get("max_abs_diff") else "-"
        lines.append(f"| {mask} | {r['provider']} | {r['gpus']} | {r['fwd_ms']:.2f} | {r['fwdbwd_ms']:.2f} | "
                     f"{tf[0]:.0f} | {tf[1]:.0f} | {vs[0]} | {vs[1]} | {peak} | {diff} |")
    ring = [r for r in rows if r["provider"].startswith("ring") and "per_rank_fwdbwd_ms" in r]
    if ring:
        lines += ["", "Per-rank forward+backward ms (each rank's own median; the ring couples them, so the "
                  "imbalance of the contiguous causal split shows as waiting, not as different times):", ""]
        for r in ring:
            lines.append(f"- {'causal' if r['causal'] else 'non-causal'} {r['provider']}: "
                         + ", ".join(f"{t:.2f}" for t in r["per_rank_fwdbwd_ms"]))
    return "\n".join(lines) + "\n"


def torchrun_command(world: int) -> str:
    """The command as launched: command_line() records `python scripts/...`; the ranks came from torchrun."""
    return re.sub(r"(^|\s)python ", rf"\1torchrun --standalone --nproc-per-node {world} ", command_line(), count=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=65536, help="total tokens, split over the ranks")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=None, help="default 16 (2 with --device cpu)")
    ap.add_argument("--kv-heads", type=int, default=None, help="GQA: key/value heads (default: --heads)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=list(DTYPES), default=None, help="default bf16 (fp32 with --device cpu)")
    ap.add_argument("--masks", nargs="+", choices=["full", "causal"], default=["full", "causal"])
    ap.add_argument("--no-zigzag", action="store_true", help="skip the zigzag rows")
    ap.add_argument("--no-single", action="store_true", help="skip the one-GPU rows (and the check)")
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (0 with --device cpu)")
    ap.add_argument("--iters", type=int, default=None, help="calls per round; default 5 (1 with --device cpu)")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --device cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", default="results/longctx", help="output folder (relative to the repo root)")
    ap.add_argument("--tag", default="ring_attention")
    args = ap.parse_args()
    cpu = args.device == "cpu"
    args.heads = args.heads or (2 if cpu else 16)
    args.warmup = args.warmup if args.warmup is not None else (0 if cpu else 3)
    args.iters = args.iters or (1 if cpu else 5)
    args.rounds = args.rounds or (1 if cpu else 3)
    args.dtype = args.dtype or ("fp32" if cpu else "bf16")
    if cpu and args.dtype == "bf16":
        ap.error("--device cpu runs the Triton interpreter, which has no bfloat16 (numpy): use fp32 or fp16")
    if cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if not cpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("gloo" if cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, DTYPES[args.dtype])
    meta = run_metadata()
    meta.update(command=torchrun_command(world), world_size=world, backend=dist.get_backend(), args=vars(args))
    if not cpu:
        meta["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())][:world]
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    rows = []
    for mask in args.masks:
        causal = mask == "causal"
        layouts = [("ring", False)] + ([("ring-zigzag", True)] if causal and not args.no_zigzag else [])
        gathered = {}
        for name, zigzag in layouts:
            row, result = ring_row(name, causal, zigzag, args, dtype, rank, world)
            if rank == 0:
                rows.append(row)
                gathered[name] = result
                print(f"{mask} {name}: fwd {row['fwd_ms']:.2f} ms, fwd+bwd {row['fwdbwd_ms']:.2f} ms, "
                      f"peak {row['peak_GiB']} GiB", flush=True)
        if not args.no_single:
            if rank == 0:
                row, single = single_row(causal, args, dtype)
                rows.append(row)
                done = row.get("error") or f"fwd {row['fwd_ms']:.2f} ms, fwd+bwd {row['fwdbwd_ms']:.2f} ms"
                print(f"{mask} flash-1gpu: {done}", flush=True)
                if single is not None:
                    for r in rows:
                        if r["provider"] in gathered and r["causal"] == causal:
                            r["max_abs_diff"] = compare(gathered[r["provider"]], single)
                            print(f"  {r['provider']} vs flash-1gpu max abs diff: {r['max_abs_diff']}", flush=True)
            dist.barrier()  # the other ranks wait for the one-GPU run
    if rank == 0:
        out = repo_path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / f"{args.tag}.md").write_text(markdown(rows, meta))
        print(f"wrote {rel(out / args.tag)}.{{json,md}}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
