"""Deeper Q / dO and dQ rings for the Gluon backward: head dim 64 (session 33, shipped in 34), head dim 128 (below).

The loader fetches each query tile's LSE and delta with ordinary loads (one warp, waiting on each) before the TMA
copies of Q_i and dO_i, and at head dim 64 a tile's compute is short: five 128 x 64 x 64 matmuls, ~0.7 us on an H100.
With a 2-deep ring the loader has about one tile's time to refill a slot, about as long as those loads' and the TMA
copy's latency. At head dim 64 there is shared memory for more: (64, 128, 3, 2) takes 133 KB, (64, 128, 4, 2)
150 KB, (64, 128, 4, 4) 183 KB, all without spills (compile_sm90.txt); (64, 128, 2, 2), shipped until session 34,
takes 116 KB. The first config listed is always the one shipped now (flash_gluon.BWD_TILES).

Checks each config's gradients against the shipped one's (dK and dV bit for bit: the same arithmetic per program;
dQ to 1e-2 relative: its TMA reduce adds in a varying order), then times the backward (`gluon_backward`, with its
dQ buffer's zeroing and scaling, the same for every config), 16K tokens a batch, 2048 / head dim heads, three rounds in
alternating order.

    FLASH_AUTOTUNE=0 python results/attention/gluon_bwd_stages/ab.py   # GPU (sm_90), ~2-3 minutes
    python results/attention/gluon_bwd_stages/ab.py compile  # CPU: sm_90 registers, spills, shared memory

Head dim 128 (prepared in session 41, run in session 42: no gain, README.md): `ab.py 128` / `ab.py compile 128`.
There the shipped (64, 128, 2, 2) takes 214 KB; a 3-deep Q/dO ring fits only with a 1-deep dQ ring, (64, 128, 3, 1)
at 215 KB, and at head dim 64 the deeper Q/dO ring was what gained (the dQ ring's depth did not matter). Both compile
with the shipped 56 bytes of spill (sm_90, non-causal). 16K tokens a batch, 16 heads.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

HEAD_DIM = 128 if "128" in sys.argv[1:] else 64
SHIPPED = G.BWD_TILES[HEAD_DIM]
OTHERS = {64: [(64, 128, 2, 2), (64, 128, 4, 2), (64, 128, 3, 3), (64, 128, 4, 4)],
          128: [(64, 128, 3, 1), (64, 128, 2, 1)]}
CONFIGS = [SHIPPED] + [t for t in OTHERS[HEAD_DIM] if t != SHIPPED]


def compile_report():
    from test_flash_gluon import bwd_compile_sm90

    for tiles in CONFIGS:
        for causal in (False, True):
            r = bwd_compile_sm90(HEAD_DIM, causal, tiles)
            print(json.dumps(dict(tiles=tiles, causal=causal, regs=r["regs"], stack=r["stack"], smem=r["smem"])),
                  flush=True)


def grads(tiles, q, k, v, do, lse, delta, scale, causal):
    G.BWD_TILES[HEAD_DIM] = tiles
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    G.gluon_backward(do, q, k, v, lse, delta, dq, dk, dv, scale, causal)
    return dq, dk, dv


def main():
    from triton.testing import do_bench

    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; configs (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES)",
          flush=True)
    failures = 0
    try:
        for causal in (False, True):
            for seqlen in (1024, 2048, 4096, 8192, 16384):
                batch, nheads, head_dim = 16384 // seqlen, 2048 // HEAD_DIM, HEAD_DIM
                q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                               for _ in range(4))
                scale = head_dim ** -0.5
                o, lse, _ = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, None, None)
                delta = F.bwd_preprocess(o, do)
                ref = grads(SHIPPED, q, k, v, do, lse, delta, scale, causal)
                checks = {}
                for tiles in CONFIGS[1:]:
                    got = grads(tiles, q, k, v, do, lse, delta, scale, causal)
                    dq_err = ((got[0].float() - ref[0].float()).abs().max() / ref[0].float().abs().max()).item()
                    ok = torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2]) and dq_err <= 1e-2
                    checks[str(tiles)] = dict(dkdv_bitwise=ok, dq_rel_err=dq_err)
                    failures += not ok
                times = {t: [] for t in CONFIGS}
                for r in range(3):
                    for tiles in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
                        times[tiles].append(do_bench(lambda: grads(tiles, q, k, v, do, lse, delta, scale, causal),
                                                     rep=40))
                med = {t: sorted(ts)[1] for t, ts in times.items()}
                print(json.dumps(dict(causal=causal, seqlen=seqlen, checks=checks,
                                      ms={str(t): round(m, 4) for t, m in med.items()},
                                      vs_shipped={str(t): round(med[SHIPPED] / m, 3) for t, m in med.items()},
                                      rounds_ms={str(t): [round(x, 4) for x in ts] for t, ts in times.items()})),
                      flush=True)
    finally:
        G.BWD_TILES[HEAD_DIM] = SHIPPED
    print(f"ab: {failures} config/shape check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    compile_report() if "compile" in sys.argv[1:] else main()
