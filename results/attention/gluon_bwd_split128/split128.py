"""Session 37's experiment: the split Gluon backward (kernels/flash_gluon.py `_bwd_split_kernel`, shipped at head dim
64) at head dim 128, where `_bwd_kernel` runs. The compute warpgroups are separate partitions, each tile's whole dQ is
computed by one of them in turns, DQ_COLS columns at a time (a whole 64 x 128 float32 dQ is 64 more registers a
thread beside dK and dV's 128), one K/V buffer, one key block a program (or persistent: PERSISTENT).

    python results/attention/gluon_bwd_split128/split128.py compile   # sm_90 registers / spills / smem (CPU)
    python results/attention/gluon_bwd_split128/split128.py check     # GPU: against float64 and the shipped kernel
    python results/attention/gluon_bwd_split128/split128.py bench     # GPU: against the shipped kernel and cuDNN
"""
import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402

HEAD_DIM = 128
# (STAGES of the Q / dO ring, DQ_STAGES, DQ_COLS, PERSISTENT)
CONFIGS = [(2, 2, 64, False), (2, 1, 64, False), (2, 2, 128, False), (2, 2, 64, True)]


def split_backward(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, config=CONFIGS[0],
                   programs=None) -> None:
    """As kernels.flash_gluon.gluon_backward (same arguments and checks), with `_bwd_split_kernel` at head dim 128."""
    stages, dq_stages, dq_cols, persistent = config
    batch, seqlen, nheads, head_dim = q.shape
    block_m, block_n = G.BWD_TILES[head_dim][:2]
    dqa = torch.zeros(batch, seqlen, nheads, head_dim, dtype=torch.float32, device=q.device)
    paired = causal and persistent
    grid = G._grid(seqlen // block_n, batch * nheads, paired, persistent, programs, q.device)
    lay = G.bwd_layouts(head_dim, G._GL_DTYPES[q.dtype], True)
    queries = lambda t: G.head_tiles(t, block_m, lay["q_layout"])  # noqa: E731
    keys = lambda t: G.head_tiles(t, block_n, lay["kv_layout"])  # noqa: E731
    halves = lambda t: G.head_tiles(t, lay["dkv_rows"], lay["dkv_layout"])  # noqa: E731
    G.launch(G._bwd_split_kernel, grid,
             (queries(q), queries(do), keys(k), keys(v), halves(dk), halves(dv),
              G.head_tiles(dqa, block_m, lay["dqa_layout"]), lse, delta, seqlen, nheads, batch * nheads,
              softmax_scale * G.LOG2E, softmax_scale, G.launch_head_group(seqlen, causal)),
             dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                  KV_BUFFERS=1, IS_CAUSAL=causal, PAIRED=paired, ds_layout=lay["ds_layout"],
                  CONSUMER_REGS=G.CONSUMER_REGS, DQ_COLS=dq_cols, num_warps=4))
    torch.mul(dqa, softmax_scale, out=dq)


def compile_report():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R

    def report(head_dim, stages, dq_stages, dq_cols, kv_buffers, causal, paired):
        block_m, block_n = G.BWD_TILES[head_dim][:2]
        lay = G.bwd_layouts(head_dim, gl.bfloat16, True)
        desc = lambda r, l, t="bf16": R.tensordesc(t, [r, head_dim], lay[l])  # noqa: E731
        types = dict(q_desc=desc(block_m, "q_layout"), do_desc=desc(block_m, "q_layout"),
                     k_desc=desc(block_n, "kv_layout"), v_desc=desc(block_n, "kv_layout"),
                     dk_desc=desc(64, "dkv_layout"), dv_desc=desc(64, "dkv_layout"),
                     dqa_desc=desc(block_m, "dqa_layout", "fp32"))
        consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                      KV_BUFFERS=kv_buffers, IS_CAUSAL=causal, PAIRED=paired, ds_layout=lay["ds_layout"],
                      CONSUMER_REGS=G.CONSUMER_REGS, DQ_COLS=dq_cols)
        r = R.resources(G._bwd_split_kernel, consts, 4, stages, sass=True, types=types)
        print(f"head dim {head_dim} (STAGES, DQ_STAGES, DQ_COLS, KV_BUFFERS) {(stages, dq_stages, dq_cols, kv_buffers)} "
              f"causal {causal:d}: {r['regs']} registers, {r['stack']} bytes of spill stack, {r['smem']} bytes of "
              f"shared memory, {r['ops'].get('BAR', 0)} BAR, {r['ops'].get('HGMMA', 0)} HGMMA (static)", flush=True)

    for causal in (False, True):  # the shipped head-dim-64 launch, for comparison
        report(64, *G.BWD_TILES[64][2:], 64, G.BWD_SPLIT_KV_BUFFERS, causal, causal)
    for (stages, dq_stages, dq_cols, persistent), causal in itertools.product(CONFIGS, (False, True)):
        report(HEAD_DIM, stages, dq_stages, dq_cols, 1, causal, causal and persistent)


def _inputs(batch, seqlen, nheads, causal, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, seqlen, nheads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    scale = HEAD_DIM ** -0.5
    o, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen, device="cuda")
    G.gluon_forward(q, k, v, o, lse, scale * G.LOG2E, causal)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    return q, k, v, do, lse, delta, scale


def _run(fn, args, causal, **kw):
    q, k, v, do, lse, delta, scale = args
    grads = [torch.full_like(q, float("nan")) for _ in range(3)]
    fn(do, q, k, v, lse, delta, *grads, scale, causal, **kw)
    return grads


def _reference(args, causal):
    q, k, v, do, _, _, scale = args
    q64, k64, v64 = (x.double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v64
    return [g.transpose(1, 2) for g in torch.autograd.grad(out, (q64, k64, v64), do.double().transpose(1, 2))]


def check():
    """Each config against float64 and the shipped kernel (`_bwd_kernel` at head dim 128): 384 and 1K tokens, causal
    and not, the default grid and 7 programs (each then runs many key blocks)."""
    bad = 0
    for cfg, seqlen, causal, programs in itertools.product(CONFIGS, (384, 1024), (False, True), (None, 7)):
        args = _inputs(2, seqlen, 4, causal)
        ref = _reference(args, causal)
        shipped = _run(G.gluon_backward, args, causal, programs=programs)
        grads = _run(split_backward, args, causal, config=cfg, programs=programs)
        err = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
        base = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(shipped, ref)]
        same = all(torch.equal(a, b) for a, b in zip(grads[1:], shipped[1:]))
        ok = all(e <= 2 * b + 1e-3 for e, b in zip(err, base)) and max(err) < 2e-2
        bad += not ok
        print(f"config {cfg} seqlen {seqlen} causal {causal:d} programs {programs}: rel err dq/dk/dv "
              f"{err[0]:.2e} {err[1]:.2e} {err[2]:.2e} (shipped {base[0]:.2e} {base[1]:.2e} {base[2]:.2e}); dK/dV "
              f"bit-identical to the shipped kernel's: {same}; {'ok' if ok else 'BAD'}", flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(seqlens, rounds):
    """Each config against the shipped kernel and cuDNN's backward, in alternating rounds."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"backward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, 16 heads, head dim 128, bf16")
    for seqlen, causal in itertools.product(seqlens, (False, True)):
        args = _inputs(16384 // seqlen, seqlen, 16, causal)
        q, k, v, do, *_ = args
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = do.transpose(1, 2)
        fns = {"shipped": lambda: _run(G.gluon_backward, args, causal),
               "cudnn": lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)}
        for cfg in CONFIGS:
            fns[f"split{cfg}"] = lambda cfg=cfg: _run(split_backward, args, causal, config=cfg)
        times = {n: [] for n in fns}
        for _ in range(rounds):
            for n, f in fns.items():
                times[n].append(triton.testing.do_bench(f, rep=60))
        base = statistics.median(times["shipped"])
        print(f"seqlen {seqlen} causal {causal:d}: " + " ".join(
            f"{n} {statistics.median(t):.3f} ({base / statistics.median(t):.3f}x)" for n, t in times.items()),
            flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    {"compile": compile_report, "check": check, "bench": lambda: bench(a.seqlens, a.rounds)}[a.mode]()
