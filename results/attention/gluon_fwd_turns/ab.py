"""Session 38's forward experiment (README.md here): the Gluon forward (kernels/flash_gluon.py `_fwd_kernel`) with
EXP_TURNS, the two consumers' turns ordering their softmax exponentials instead of their wgmma issues (cuDNN's
order, read from its SASS: ../gluon_bwd_profile/README.md, the forward section), and DEFER_O_WAIT, the wait for O's
store to leave its Q buffer moved from the item's end to after the next item's first S (head dim 64: two Q buffers;
measured at ea13121, not kept).

    python results/attention/gluon_fwd_turns/ab.py compile   # sm_90 registers / spills / SASS, every form (CPU)
    python results/attention/gluon_fwd_turns/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_fwd_turns/ab.py bench     # GPU: the forward alone, every form and cuDNN's
"""
import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import alternating_rounds, launch_with  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402


def forms(head_dim: int) -> dict:
    """name -> the constexprs it sets ("shipped": the form shipped before this experiment). DEFER_O_WAIT's forms
    ("defer", "turns_defer", head dim 64 only) were measured with the kernel of ea13121, and TURN_SKIP's
    ("skip_masked" = TURN_SKIP 1, "skip_first" = 2, both with EXP_TURNS; device_causal.sh) with 06629ba's; both
    were removed after their runs."""
    # every form names both flags: the launcher's own choice (FWD_EXP_TURNS, FWD_KEYS_DOWN) must not leak into them
    return {"shipped": dict(EXP_TURNS=False, KEYS_DOWN=False), "turns": dict(EXP_TURNS=True, KEYS_DOWN=False),
            # the third step (prepared in session 38): the key tiles in descending order, with and without turns
            # (since session 39's fourth step the loop's tiles are unmasked at compile time with KEYS_DOWN; the
            # branching form, and PEEL_MASK, which chose between them, are at 7ae0298)
            "keys_down": dict(EXP_TURNS=False, KEYS_DOWN=True), "keys_down_turns": dict(EXP_TURNS=True, KEYS_DOWN=True)}


def forward_with(flags: dict):
    """G.gluon_forward (same arguments) with `_fwd_kernel` launched with these constexprs. A "TILES" entry is not a
    constexpr but the call's FWD_TILES[head dim] (BLOCK_M, BLOCK_N, STAGES, Q_BUFFERS), descriptors included."""
    flags = dict(flags)
    tiles = flags.pop("TILES", None)
    launch = launch_with(G.gluon_forward, (G._fwd_kernel,), flags)
    if tiles is None:
        return launch

    def call(q, *args, **kw):
        saved = G.FWD_TILES
        G.FWD_TILES = {**saved, q.shape[-1]: tiles}
        try:
            return launch(q, *args, **kw)
        finally:
            G.FWD_TILES = saved
    return call


def compile_report(head_dims=(64,), forms_of=forms):
    """Each form of forms_of(head dim) compiled for sm_90 as the launcher would launch it (the persistent grid's
    causal pairs where `fwd_persistent` holds at 4K): registers, spill stack, shared memory, static SASS."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R
    from triton.experimental.gluon import language as gl

    for head_dim, causal in itertools.product(head_dims, (False, True)):
        for name, flags in forms_of(head_dim).items():
            flags = dict(flags)
            block_m, block_n, stages, q_buffers = flags.pop("TILES", G.FWD_TILES[head_dim])  # see forward_with
            q_layout = G._shared_layout(block_m // 2, head_dim, gl.bfloat16)
            kv_layout = G._shared_layout(block_n, head_dim, gl.bfloat16)
            types = dict(q_desc=R.tensordesc("bf16", [block_m // 2, head_dim], q_layout),
                         o_desc=R.tensordesc("bf16", [block_m // 2, head_dim], q_layout),
                         k_desc=R.tensordesc("bf16", [block_n, head_dim], kv_layout),
                         v_desc=R.tensordesc("bf16", [block_n, head_dim], kv_layout), LSE="*fp32")
            consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, Q_BUFFERS=q_buffers,
                          IS_CAUSAL=causal, PAIRED=causal and G.fwd_persistent(head_dim, 4096, causal),
                          CONSUMER_REGS=G.CONSUMER_REGS, **flags)
            r = R.resources(G._fwd_kernel, consts, 4, stages, sass=True, types=types)
            ops = r["ops"]
            print(f"head dim {head_dim} causal {causal:d} {name:12s}: {r['regs']} registers, {r['stack']} bytes of "
                  f"spill stack, {r['smem']} bytes of shared memory; static SASS {sum(ops.values())} instructions, "
                  f"BAR {ops.get('BAR', 0)} SYNCS {ops.get('SYNCS', 0)} MUFU {ops.get('MUFU', 0)} "
                  f"HGMMA {ops.get('HGMMA', 0)}", flush=True)


def _inputs(batch, seqlen, nheads, head_dim, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(3)]


def _run(fn, q, k, v, causal, **kw):
    o = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    fn(q, k, v, o, lse, q.shape[-1] ** -0.5 * G.LOG2E, causal, **kw)
    return o, lse


def _reference(q, k, v, causal):
    """float64 O (batch, seqlen, heads, head dim) and base-2 LSE (batch, heads, seqlen)."""
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ vd).transpose(1, 2), lse * G.LOG2E


def check(head_dims=(64, 128), forms_of=forms, exact=lambda name, flags: not flags.get("KEYS_DOWN")):
    """Head dims 64 and 128, 1K and 2K tokens, both masks, the default grid, 7 programs (each then runs many
    items, so the deferred wait crosses items) and, causal, one query tile a program (the grid past 8K tokens):
    every form of forms_of(head dim) within 2x the "shipped" form's error against float64, and its O and LSE
    bit-identical to the shipped form's where exact(name, flags) (the same arithmetic in the same order; by default
    every form but KEYS_DOWN's)."""
    bad = 0
    for head_dim, seqlen, causal, programs in itertools.product(head_dims, (1024, 2048), (False, True),
                                                                (None, 7, "per-tile")):
        if programs == "per-tile" and not causal:
            continue
        # "per-tile": one query tile a program, as past PERSISTENT_CAUSAL_UP_TO (KEYS_DOWN's other path)
        per_tile, programs = programs == "per-tile", (None if programs == "per-tile" else programs)
        saved = G.PERSISTENT_CAUSAL_UP_TO
        G.PERSISTENT_CAUSAL_UP_TO = 0 if per_tile else saved
        try:
            q, k, v = _inputs(2, seqlen, 4, head_dim)
            ref_o, ref_lse = _reference(q, k, v, causal)
            fs = forms_of(head_dim)
            base_o, base_lse = _run(forward_with(fs["shipped"]), q, k, v, causal, programs=programs)
            base_err = ((base_o.double() - ref_o).abs().max() / ref_o.abs().max()).item()
            line = []
            for name, flags in fs.items():
                if name == "shipped":
                    continue
                o, lse = _run(forward_with(flags), q, k, v, causal, programs=programs)
                err = ((o.double() - ref_o).abs().max() / ref_o.abs().max()).item()
                lse_err = (lse.double() - ref_lse).abs().max().item()
                same = torch.equal(o, base_o) and torch.equal(lse, base_lse)
                # descending keys sum in another order: not bit-identical, only as close to float64
                ok = err <= 2 * base_err + 1e-3 and err < 2e-2 and lse_err < 1e-2 and (same or not exact(name, flags))
                bad += not ok
                line.append(f"{name} err {err:.2e} lse {lse_err:.1e} bit-identical {same} {'ok' if ok else 'BAD'}")
        finally:
            G.PERSISTENT_CAUSAL_UP_TO = saved
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d} programs {'per tile' if per_tile else programs}: "
              f"shipped err {base_err:.2e}; " + "; ".join(line), flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(head_dims, seqlens, rounds, masks=(False, True), forms_of=forms):
    """The forward alone, every form of forms_of(head dim) and cuDNN's, in alternating rounds (the order flips each
    round); 16K tokens a batch, heads x head dim = 2048."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"forward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, heads x head dim 2048, bf16")
    for head_dim, seqlen, causal in itertools.product(head_dims, seqlens, masks):
        q, k, v = _inputs(16384 // seqlen, seqlen, 2048 // head_dim, head_dim)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        scale = head_dim ** -0.5 * G.LOG2E

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        fns = {name: (lambda f=forward_with(flags): f(q, k, v, o, lse, scale, causal))
               for name, flags in forms_of(head_dim).items()}
        fns["cudnn"] = cudnn
        print(f"head dim {head_dim} seqlen {seqlen} causal {causal:d}: {alternating_rounds(fns, rounds)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--causal-only", action="store_true")
    a = ap.parse_args()
    masks = (True,) if a.causal_only else (False, True)
    {"compile": compile_report, "check": lambda: check(a.head_dims),
     "bench": lambda: bench(a.head_dims, a.seqlens, a.rounds, masks)}[a.mode]()
