"""Session 46's forward experiment (README.md here): head dim 256's forward with SERIAL rounds, so that cuDNN's
128-key tiles fit the registers. In the shipped round a consumer issues S(j + 1) before P(j) V(j) is done, so O (128
registers a thread at head dim 256), S(j + 1) and P(j) are live together; with 128-key tiles that spills 216 bytes.
SERIAL issues S(j), runs its softmax, then issues P(j) V(j) and waits for it: at most O and one tile's S or P live
(64 / 104 bytes of spill at 128 keys, outside the key loop but for ~3 reloads a round), and the overlap is the two
consumers' turns alone, two a key tile.

Forms at head dim 256 (the launcher's tiles there: 128 queries, 64 keys, a 2-slot ring, K_AHEAD):
- shipped;
- serial64: SERIAL on the shipped tiles (the same arithmetic in the same order: bit-identical);
- serial128: SERIAL with 128-key tiles and one K and one V slot (196,960 bytes of shared memory);
- pipelined128: the shipped round with 128-key tiles (spills 216 bytes; what SERIAL saves).

    python results/attention/gluon_fwd_serial/ab.py compile   # sm_90 registers / spills / shared memory (CPU)
    python results/attention/gluon_fwd_serial/ab.py check     # GPU: against float64 and the shipped form
    python results/attention/gluon_fwd_serial/ab.py bench     # GPU: the forward alone, every form and cuDNN's
"""
import argparse
import importlib.util
import itertools
from pathlib import Path

spec = importlib.util.spec_from_file_location("fwd_turns_ab", Path(__file__).resolve().parents[1] / "gluon_fwd_turns"
                                              / "ab.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # puts the checkout on sys.path; its inputs, float64 reference and runner

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402
from ab_common import alternating_rounds  # noqa: E402

HEAD_DIM = 256
# name -> (FWD_TILES[256] for the call, the constexprs on top of the launcher's own)
FORMS = {"shipped": (G.FWD_TILES[HEAD_DIM], dict(SERIAL=False)),
         "serial64": (G.FWD_TILES[HEAD_DIM], dict(SERIAL=True)),
         "serial128": ((128, 128, 1, 1), dict(SERIAL=True)),
         "pipelined128": ((128, 128, 1, 1), dict(SERIAL=False))}


def forward(name: str):
    """G.gluon_forward (same arguments) as form `name` launches it."""
    tiles, flags = FORMS[name]
    launch = T.forward_with(flags)

    def call(*args, **kw):
        saved = G.FWD_TILES
        G.FWD_TILES = {**saved, HEAD_DIM: tiles}
        try:
            return launch(*args, **kw)
        finally:
            G.FWD_TILES = saved
    return call


def compile_report():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_resources as R
    from triton.experimental.gluon import language as gl

    for (name, ((block_m, block_n, stages, q_buffers), flags)), causal in itertools.product(FORMS.items(),
                                                                                           (False, True)):
        q_layout = G._shared_layout(block_m // 2, HEAD_DIM, gl.bfloat16)
        kv_layout = G._shared_layout(block_n, HEAD_DIM, gl.bfloat16)
        types = dict(q_desc=R.tensordesc("bf16", [block_m // 2, HEAD_DIM], q_layout),
                     o_desc=R.tensordesc("bf16", [block_m // 2, HEAD_DIM], q_layout),
                     k_desc=R.tensordesc("bf16", [block_n, HEAD_DIM], kv_layout),
                     v_desc=R.tensordesc("bf16", [block_n, HEAD_DIM], kv_layout), LSE="*fp32")
        consts = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, Q_BUFFERS=q_buffers,
                      IS_CAUSAL=causal, PAIRED=False, CONSUMER_REGS=G.CONSUMER_REGS,
                      **dict(G.fwd_forms(HEAD_DIM, causal), **flags))
        r = R.resources(G._fwd_kernel, consts, 4, stages, sass=True, types=types)
        ops = r["ops"]
        print(f"causal {causal:d} {name:12s}: {r['regs']} registers, {r['stack']} bytes of spill stack, {r['smem']} "
              f"bytes of shared memory; static SASS {sum(ops.values())}, LDL {ops.get('LDL', 0)}, HGMMA "
              f"{ops.get('HGMMA', 0)}", flush=True)


def check():
    """1K and 2K tokens, both masks, the default grid and 7 programs (each runs many items, so the ring and the
    turns run on across them): every form within 2x the shipped form's error against float64; serial64 also
    bit-identical to it."""
    bad = 0
    for seqlen, causal, programs in itertools.product((1024, 2048), (False, True), (None, 7)):
        q, k, v = T._inputs(2, seqlen, 4, HEAD_DIM)
        ref_o, ref_lse = T._reference(q, k, v, causal)
        base_o, base_lse = T._run(forward("shipped"), q, k, v, causal, programs=programs)
        base_err = ((base_o.double() - ref_o).abs().max() / ref_o.abs().max()).item()
        line = []
        for name in FORMS:
            if name == "shipped":
                continue
            o, lse = T._run(forward(name), q, k, v, causal, programs=programs)
            err = ((o.double() - ref_o).abs().max() / ref_o.abs().max()).item()
            lse_err = (lse.double() - ref_lse).abs().max().item()
            same = torch.equal(o, base_o) and torch.equal(lse, base_lse)
            ok = err <= 2 * base_err + 1e-3 and err < 2e-2 and lse_err < 1e-2 and (same or name != "serial64")
            bad += not ok
            line.append(f"{name} err {err:.2e} lse {lse_err:.1e} bit-identical {same} {'ok' if ok else 'BAD'}")
        print(f"head dim {HEAD_DIM} seqlen {seqlen} causal {causal:d} programs {programs}: shipped err "
              f"{base_err:.2e}; " + "; ".join(line), flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench(seqlens, rounds):
    """The forward alone, every form and cuDNN's, in alternating rounds (the order flips each round); 16K tokens a
    batch, 8 heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"forward ms, median of {rounds} alternating rounds of do_bench; 16K tokens, 8 heads of {HEAD_DIM}, bf16")
    for seqlen, causal in itertools.product(seqlens, (False, True)):
        q, k, v = T._inputs(16384 // seqlen, seqlen, 2048 // HEAD_DIM, HEAD_DIM)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        scale = HEAD_DIM ** -0.5 * G.LOG2E

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        fns = {name: (lambda f=forward(name): f(q, k, v, o, lse, scale, causal)) for name in FORMS}
        fns["cudnn"] = cudnn
        print(f"head dim {HEAD_DIM} seqlen {seqlen} causal {causal:d}: {alternating_rounds(fns, rounds)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "check", "bench"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    {"compile": compile_report, "check": check, "bench": lambda: bench(a.seqlens, a.rounds)}[a.mode]()
