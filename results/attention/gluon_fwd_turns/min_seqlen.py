"""Where the head-dim-64 causal Gluon forward should start (flash_gluon.MIN_SEQLEN[64, True], 2K before session 39)
now that its key tiles run in descending order (FWD_KEYS_DOWN): at 512-2K tokens, the table's shape (16K tokens a
batch, 32 heads) and GPT-2 small's (16 x 1K, 12 heads), three forwards, each the public path with the choice forced
by MIN_SEQLEN:
    triton  the autotuned @triton.jit forward (what runs below MIN_SEQLEN)
    up      the Gluon forward, key tiles ascending (KEYS_DOWN off)
    down    the Gluon forward as shipped (KEYS_DOWN on)
timed alone (kernels.flash._flash_fwd) and in the autograd forward+backward (flash_attn_func, then .backward; the
backward is the same in each), eager (do_bench: host included) and replayed from a CUDA graph (the device alone),
three alternating rounds, median.

    python results/attention/gluon_fwd_turns/min_seqlen.py   # GPU (sm_90), FLASH_AUTOTUNE unset
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

KEY = (64, True)
FORMS = {"triton": dict(min_seqlen=1 << 30, keys_down=True), "up": dict(min_seqlen=0, keys_down=False),
         "down": dict(min_seqlen=0, keys_down=True)}


def under(form: str, fn):
    """fn with MIN_SEQLEN[64, True] and FWD_KEYS_DOWN set as `form` says while it runs (eager calls; a graph keeps
    the kernels chosen when it was captured)."""
    def call():
        saved_min, saved_down = G.MIN_SEQLEN[KEY], set(G.FWD_KEYS_DOWN)
        G.MIN_SEQLEN[KEY] = FORMS[form]["min_seqlen"]
        G.FWD_KEYS_DOWN = {KEY} if FORMS[form]["keys_down"] else set()
        try:
            return fn()
        finally:
            G.MIN_SEQLEN[KEY], G.FWD_KEYS_DOWN = saved_min, saved_down
    return call


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; shipped MIN_SEQLEN[64, True] "
          f"{G.MIN_SEQLEN[KEY]}, FWD_KEYS_DOWN {sorted(G.FWD_KEYS_DOWN)}", flush=True)
    for b, n, h in [(32, 512, 32), (16, 1024, 32), (8, 2048, 32), (16, 1024, 12)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        scale = 64 ** -0.5
        fwd = lambda: F._flash_fwd(q, k, v, scale, True, 0.0, False, None, None, n, n)  # noqa: E731
        fwdbwd = lambda: F.flash_attn_func(q, k, v, causal=True).backward(do)  # noqa: E731
        for what, step in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            med, times = eager_and_graphed({form: under(form, step) for form in FORMS}, (q, k, v))
            print(json.dumps(dict(batch=b, seqlen=n, heads=h, what=what, ms={k_: round(v_, 4) for k_, v_ in med.items()},
                                  down_vs_triton={mode: round(med[f"triton_{mode}"] / med[f"down_{mode}"], 3)
                                                  for mode in ("eager", "graphed")},
                                  down_vs_up={mode: round(med[f"up_{mode}"] / med[f"down_{mode}"], 3)
                                              for mode in ("eager", "graphed")},
                                  rounds_ms=times)), flush=True)


if __name__ == "__main__":
    main()
