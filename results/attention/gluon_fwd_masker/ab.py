"""Session 40's MASKER experiment (README.md here): the Gluon forward's dropout masks drawn by a fourth partition
(`_masker`, 4 warps) into a shared-memory ring instead of by each consumer in its softmax, against the shipped form
(masks drawn in the consumers) and the autotuned @triton.jit forward, dropout 0.1, head dim 64.

    python results/attention/gluon_fwd_masker/ab.py check   # GPU: MASKER's O and LSE bit-identical to the shipped form
    python results/attention/gluon_fwd_masker/ab.py bench   # GPU: forward alone, FLASH_AUTOTUNE unset
"""
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, launch_with  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

P = 0.1
# registers (consumers, masker) without spills in the sm_90 compile: non-causal 208 / 88, causal 240 / 80
REGS = {False: dict(CONSUMER_REGS=208, MASKER_REGS=88), True: dict(CONSUMER_REGS=240, MASKER_REGS=80)}


def forced(gluon: bool, fn):
    """fn with the Gluon forward taking dropout at every length (gluon) or never while it runs."""
    def call(*a, **kw):
        saved = G.FWD_DROPOUT_MIN_SEQLEN
        G.FWD_DROPOUT_MIN_SEQLEN = {(64, False): 0, (64, True): 0} if gluon else {}
        try:
            return fn(*a, **kw)
        finally:
            G.FWD_DROPOUT_MIN_SEQLEN = saved
    return call


def masker(fn, causal):
    return launch_with(fn, (G._fwd_kernel,), dict(MASKER=True, **REGS[causal]))


def check():
    bad = 0
    for causal, n, programs in itertools.product((False, True), (512, 1024, 2048), (None, 7)):
        q, k, v = (torch.randn(2, n, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, lse = torch.empty_like(q), torch.empty(2, 4, n, device="cuda")
        o2, lse2 = torch.empty_like(q), torch.empty(2, 4, n, device="cuda")
        seed = torch.tensor([12345], dtype=torch.int64, device="cuda")
        G.gluon_forward(q, k, v, o, lse, 0.125 * G.LOG2E, causal, programs=programs, dropout_p=P, seed=seed)
        masker(G.gluon_forward, causal)(q, k, v, o2, lse2, 0.125 * G.LOG2E, causal, programs=programs, dropout_p=P,
                                        seed=seed)
        torch.cuda.synchronize()
        same = torch.equal(o, o2) and torch.equal(lse, lse2)
        bad += not same
        print(f"causal {causal:d} seqlen {n} programs {programs}: bit-identical {same}", flush=True)
    print("all ok" if not bad else f"{bad} BAD")


def bench():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; dropout {P}, head dim 64, bf16", flush=True)
    for b, n, h, causal in [(16, 1024, 12, True), (16, 1024, 32, True), (8, 2048, 32, True), (4, 4096, 32, True),
                            (16, 1024, 32, False), (4, 4096, 32, False)]:
        q, k, v = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        def fwd():
            with torch.no_grad():
                F._flash_fwd(q, k, v, 64 ** -0.5, causal, P, False, None, None, n, n)

        med, times = eager_and_graphed({"triton": forced(False, fwd), "gluon": forced(True, fwd),
                                        "masker": forced(True, masker(fwd, causal))}, ())
        print(json.dumps(dict(batch=b, seqlen=n, heads=h, causal=causal, ms={k_: round(v_, 4) for k_, v_ in med.items()},
                              masker_vs_gluon={m: round(med[f"gluon_{m}"] / med[f"masker_{m}"], 3)
                                               for m in ("eager", "graphed")},
                              masker_vs_triton={m: round(med[f"triton_{m}"] / med[f"masker_{m}"], 3)
                                                for m in ("eager", "graphed")},
                              rounds_ms=times)), flush=True)


if __name__ == "__main__":
    check() if sys.argv[1] == "check" else bench()
