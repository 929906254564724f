"""Head dim 256, 512 tokens: forward+backward through flash_attn_func (autograd, the path the attention table times
eagerly) with the Gluon backward from 512 causal (shipped) against from 1K (the @triton.jit backward at 512), five
alternating rounds, eager (host included) and replayed from a CUDA graph. 32 x 512 tokens, 8 heads, bf16. The eager
calls accumulate into q, k and v's .grad (three adds the graphed replays, which clear .grad, do not run), the same in
both forms.

    python results/attention/gluon_bwd_early_release/eager_512.py   # GPU (sm_90)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_common import eager_and_graphed, with_setting  # noqa: E402  (puts the checkout on sys.path)

import torch  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402
from kernels.flash import flash_attn_func  # noqa: E402


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    for causal in (True, False):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(32, 512, 8, 256, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                   for _ in range(3))
        do = torch.randn_like(q)

        def step():
            flash_attn_func(q, k, v, causal=causal).backward(do)
        from_1k = {**G.BWD_MIN_SEQLEN, (256, True): 1024, (256, False): 1024}
        fns = {"shipped": step, "bwd_from_1k": with_setting(G, "BWD_MIN_SEQLEN", from_1k, step)}
        med, times = eager_and_graphed(fns, (q, k, v), rounds=5)
        print(json.dumps(dict(causal=causal, ms={n: round(t, 4) for n, t in med.items()},
                              shipped_speedup_eager=round(med["bwd_from_1k_eager"] / med["shipped_eager"], 3),
                              rounds_ms=times)), flush=True)


if __name__ == "__main__":
    main()
