"""Ring attention (kernels/ring.py) across processes: each rank's output and q/k/v gradients against
attention over the whole sequence.

CPU processes talk over gloo (spawned with torch.multiprocessing, one spawn per world size and block
computation, every case of the spawn run inside it). The fast cases run the blocks in plain PyTorch
(TORCH_BLOCKS) in float64 and float32; one small set runs the Triton kernel under the interpreter; the
`gpu` test runs it with NCCL on two GPUs. Tolerance as in tests/test_flash.py (STYLE.md, point 4): the
error vs a float64 reference may be at most 2x (output) / 3x (gradients) the error of plain PyTorch
attention in the same dtype on the same inputs, plus a floor.
"""
import json
import os
import socket
import tempfile
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kernels.ring import (FLASH_BLOCKS, TORCH_BLOCKS, merge_partial, ring_attn_func, ring_attn_reference,
                          ring_forward, shard_sequence, unshard_sequence)
from kernels.standard import standard_attention

FLOOR = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------------
# Process harness: spawn `world` ranks, run a module-level function on each, collect per-rank JSON.
# ---------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, backend, fn, args, out_dir):
    if backend == "nccl":
        os.environ.setdefault("FLASH_AUTOTUNE", "0")  # one fixed config: no tuning of every shape
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def spawn(fn, world, *args, backend="gloo") -> list:
    """fn(rank, world, *args) on `world` processes; returns each rank's (JSON-able) result."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world, _free_port(), backend, fn, args, out_dir), nprocs=world, join=True)
        results = []
        for r in range(world):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                results.append(json.load(f))
    return results


# ---------------------------------------------------------------------------------------------------
# One case on one rank: errors of the ring and of plain PyTorch vs the float64 reference, on this rank's rows.
# ---------------------------------------------------------------------------------------------------


def _maxerr(a, ref):
    return (a.double() - ref).abs().max().item()


def run_cases(rank, world, cases, ops_name, device):
    ops = {"torch": TORCH_BLOCKS, "flash": FLASH_BLOCKS}[ops_name]
    # Subgroups: every rank must create every group, in the same order.
    halves = [dist.new_group(list(range(world))[i::2]) for i in range(2)] if world >= 4 else None
    results = {}
    for case in cases:
        name, batch, seqlen, nheads, nheads_k, headdim, causal, zigzag, dtype_name, sub = case
        dtype = DTYPES[dtype_name]
        group, grank, gworld = None, rank, world
        if sub:  # ring over ranks {0, 2, ...} or {1, 3, ...}: group ranks differ from global ranks
            group, grank, gworld = halves[rank % 2], rank // 2, world // 2
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()) + 1000 * (rank % 2 if sub else 0))
        full = [torch.randn(batch, seqlen, h, headdim, generator=g, dtype=torch.float64).to(device)
                for h in (nheads, nheads_k, nheads_k, nheads)]
        q64, k64, v64 = [x.requires_grad_() for x in full[:3]]
        do64 = full[3]
        ref = standard_attention(q64, k64, v64, causal=causal)
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do64)
        ref_lse = standard_attention(q64, k64, v64, causal=causal, return_lse=True)[1]
        qx, kx, vx = [x.detach().to(dtype).requires_grad_() for x in (q64, k64, v64)]
        base, base_lse = standard_attention(qx, kx, vx, causal=causal, return_lse=True)
        base_grads = torch.autograd.grad(base, (qx, kx, vx), do64.to(dtype))

        def mine(x):
            return shard_sequence(x, grank, gworld, zigzag)

        def mine_lse(x):
            return shard_sequence(x.detach(), grank, gworld, zigzag, dim=2)

        q, k, v = [mine(x.detach()).contiguous().requires_grad_() for x in (qx, kx, vx)]
        out = ring_attn_func(q, k, v, causal=causal, group=group, zigzag=zigzag, block_ops=ops)
        grads = torch.autograd.grad(out, (q, k, v), mine(do64.to(dtype)))
        with torch.no_grad():
            _, lse = ring_forward(q, k, v, 1.0 / headdim**0.5, causal, zigzag, group, ops)
        assert out.dtype == dtype and out.shape == q.shape
        res = {"out": [_maxerr(out, mine(ref)), _maxerr(mine(base), mine(ref))],
               "lse": [_maxerr(lse, mine_lse(ref_lse)), _maxerr(mine_lse(base_lse), mine_lse(ref_lse))]}
        for n, gr, rg, bg in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
            res[n] = [_maxerr(gr, mine(rg)), _maxerr(mine(bg), mine(rg))]
        res["nan"] = bool(torch.isnan(out).any() or any(torch.isnan(x).any() for x in grads))
        results[name] = res
    return results


def check(results, name, dtype_name):
    floor = FLOOR[DTYPES[dtype_name]]
    for rank, per_rank in enumerate(results):
        r = per_rank[name]
        assert not r["nan"], (rank, name)
        for o in ("out", "lse"):
            assert r[o][0] <= 2 * r[o][1] + floor, (rank, o, r[o])
        for g in ("dq", "dk", "dv"):
            assert r[g][0] <= 3 * r[g][1] + floor, (rank, g, r[g])


def _case(world, dtype, causal, zigzag, b=2, h=4, hk=2, d=16, per_rank=12, sub=False):
    n = per_rank * world
    name = f"w{world}-{dtype}-{'causal' if causal else 'full'}{'-zigzag' if zigzag else ''}{'-sub' if sub else ''}"
    return (name, b, n, h, hk, d, causal, zigzag, dtype, sub)


# (name, batch, total seqlen, nheads, nheads_k, headdim, causal, zigzag, dtype, subgroups): GQA throughout.
CASES = {
    2: [_case(2, dt, c, z) for dt in ("float64", "float32") for c in (False, True) for z in (False, True)],
    4: [_case(4, dt, c, z) for dt in ("float64", "float32") for c, z in ((False, False), (True, False), (True, True))]
    + [_case(4, "float32", True, True, sub=True), _case(4, "float64", False, False, sub=True)],
}


@pytest.fixture(scope="module")
def torch_results():
    return {w: spawn(run_cases, w, CASES[w], "torch", "cpu") for w in CASES}


@pytest.mark.parametrize("case", CASES[2] + CASES[4], ids=lambda c: c[0])
def test_ring_matches_full_attention(torch_results, case):
    world = 4 if case[0].startswith("w4") else 2
    check(torch_results[world], case[0], case[8])


# The Triton kernel under the interpreter: a 37-token chunk per rank (ragged tiles), GQA, MQA, float16.
FLASH_CASES = [("w2-flash-full", 1, 74, 2, 1, 16, False, False, "float32", False),
               ("w2-flash-causal", 1, 64, 2, 2, 16, True, False, "float32", False),
               ("w2-flash-causal-zigzag", 1, 64, 2, 1, 16, True, True, "float32", False),
               ("w2-flash-causal-zigzag-fp16", 1, 64, 2, 1, 32, True, True, "float16", False)]


@pytest.fixture(scope="module")
def flash_results():
    return spawn(run_cases, 2, FLASH_CASES, "flash", "cpu")


@pytest.mark.parametrize("case", FLASH_CASES, ids=lambda c: c[0])
def test_ring_flash_kernel(flash_results, case):
    check(flash_results, case[0], case[8])


# bf16 on two GPUs over NCCL, the kernel's launch path (FLASH_AUTOTUNE=0), 2K tokens per rank.
GPU_CASES = [(f"w2-gpu-{c}{'-zigzag' if z else ''}", 1, 4096, 8, 2, 64, c == "causal", z, "bfloat16", False)
             for c, z in (("full", False), ("causal", False), ("causal", True))]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c[0])
def test_ring_nccl(case):
    check(spawn(run_cases, 2, [case], "flash", "cuda", backend="nccl"), case[0], case[8])


# ---------------------------------------------------------------------------------------------------
# Single process: the merge, the sharding helpers, a group of one rank, input errors.
# ---------------------------------------------------------------------------------------------------


def test_merge_partial_equals_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = torch.cat([k, k * 0.5], 1), torch.cat([v, -v], 1)  # 18 keys in blocks of 5, 5, 8
    mask = torch.rand(2, 3, 9, 18, generator=g) < 0.5
    mask[0, 0, 1] = False  # a row that sees no key at all
    mask[1, 2, 4, :10] = False  # a row that sees nothing in the first two blocks
    ref, ref_lse = standard_attention(q, k, v, mask=mask, return_lse=True)
    out = torch.zeros_like(q)
    lse = torch.full(ref_lse.shape, float("-inf"), dtype=torch.float64)
    for lo, hi in ((0, 5), (5, 10), (10, 18)):
        o_b, lse_b = standard_attention(q, k[:, lo:hi], v[:, lo:hi], mask=mask[..., lo:hi], return_lse=True)
        merge_partial(out, lse, o_b, lse_b)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    empty = torch.isinf(ref_lse)
    assert empty.any() and torch.equal(torch.isinf(lse), empty) and (out[0, 1, 0] == 0).all()
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=1e-12, rtol=0)


def test_merge_partial_first_block_is_copied_exactly():
    q, k, v = (torch.randn(1, 7, 2, 8) for _ in range(3))
    o_b, lse_b = standard_attention(q, k, v, return_lse=True)
    out, lse = torch.zeros_like(o_b), torch.full_like(lse_b, float("-inf"))
    merge_partial(out[:, 2:], lse[:, :, 2:], o_b[:, 2:], lse_b[:, :, 2:])  # views update in place
    assert torch.equal(out[:, 2:], o_b[:, 2:]) and torch.equal(lse[:, :, 2:], lse_b[:, :, 2:])
    assert (out[:, :2] == 0).all() and torch.isinf(lse[:, :, :2]).all()


@pytest.mark.parametrize("zigzag", [False, True])
def test_shard_roundtrip_and_divisibility(zigzag):
    x = torch.arange(2 * 24 * 3).view(2, 24, 3)
    shards = [shard_sequence(x, r, 3, zigzag) for r in range(3)]
    assert torch.equal(unshard_sequence(shards, zigzag), x)
    if zigzag:  # rank 0 holds the first and the last of 6 chunks
        assert torch.equal(shards[0], torch.cat([x[:, :4], x[:, 20:]], 1))
    with pytest.raises(ValueError, match="not divisible"):
        shard_sequence(x, 0, 5, zigzag)


@pytest.fixture
def world_of_one():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_world_of_one_is_flash_attn_func(world_of_one):
    from kernels.flash import flash_attn_func

    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    assert torch.equal(ring_attn_func(q, k, v, causal=True), flash_attn_func(q, k, v, causal=True))
    out = ring_attn_func(q, k, v, causal=True, zigzag=True, block_ops=TORCH_BLOCKS)  # the loop, no transfers
    torch.testing.assert_close(out, ring_attn_reference(q, k, v, 0, 1, causal=True), atol=1e-6, rtol=0)


def test_input_errors():
    q, k, v = (torch.randn(1, 16, 2, 16) for _ in range(3))
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attn_func(q, k, v, block_ops=TORCH_BLOCKS)
    with pytest.raises(NotImplementedError, match="dropout"):
        ring_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(TypeError, match="one dtype"):
        ring_attn_func(q, k.double(), v)
    with pytest.raises(ValueError, match="same batch, length"):
        ring_attn_func(q, k[:, :8], v[:, :8])
    with pytest.raises(ValueError, match="even local length"):
        ring_attn_func(q[:, :15], k[:, :15], v[:, :15], zigzag=True, block_ops=TORCH_BLOCKS)
    with pytest.raises(TypeError, match="dtype"):  # the flash kernel's own check: no float64
        ring_attn_func(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="rank 4|chunk"):
        ring_attn_func(q[0], k[0], v[0])


def test_bench_ring_cpu(tmp_path):
    """scripts/bench_ring.py in its CPU mode under torchrun (2 ranks, gloo, the interpreter): it runs,
    the ring agrees with the one-process run, and the files record the torchrun command."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "scripts/bench_ring.py", "--device", "cpu", "--seqlen", "64", "--head-dim", "16", "--masks", "causal",
           "--out", str(tmp_path), "--tag", "ring"]
    p = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((tmp_path / "ring.json").read_text())
    assert [r["provider"] for r in data["rows"]] == ["ring", "ring-zigzag", "flash-1gpu"]
    for r in data["rows"][:2]:
        assert max(r["max_abs_diff"].values()) < 1e-5, r
        assert len(r["per_rank_fwdbwd_ms"]) == 2
    assert data["meta"]["command"].startswith("torchrun --standalone --nproc-per-node 2 scripts/bench_ring.py")
    md = (tmp_path / "ring.md").read_text()
    assert "| causal | ring-zigzag | 2 |" in md and "vs 1 GPU" in md
