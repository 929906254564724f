"""Which forward+backward with dropout can be captured in a CUDA graph (session 40's A/B failed to capture one with
"operation would make the legacy stream depend on a capturing blocking stream"). One case a process, so that a failed
capture cannot leave the next case a broken context; all cases at once.

    python results/attention/graph_dropout/probe.py            # GPU: every case, one line each
    python results/attention/graph_dropout/probe.py CASE       # one case, with the traceback on failure

A case is PROVIDER-CALL-P-MASK: PROVIDER ours (the shipped scope: the Gluon kernels take dropout at head dim 64
non-causal from 1K), ours_jit (the @triton.jit kernels), sdpa; CALL backward (.backward(do) into the leaves' .grad)
or grad (torch.autograd.grad); P the dropout probability; MASK full or causal.
"""
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CASES = [f"{prov}-{call}-{p}-{mask}" for prov in ("ours", "ours_jit", "sdpa") for call in ("backward", "grad")
         for p in ("0.1", "0.0") for mask in ("full", "causal")]


def run_case(case: str) -> None:
    import torch
    import torch.nn.functional as TF

    import kernels.flash as F
    from _common import capture_graph

    prov, call, p, mask = case.split("-")
    causal = mask == "causal"
    p = float(p)
    if prov == "ours_jit":
        F.GLUON_KERNELS = False  # neither Gluon kernel, with or without dropout
    b, n, h, d = 16, 1024, 12, 64  # GPT-2 small's attention
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)

    def attend():
        if prov == "sdpa":
            return TF.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), dropout_p=p,
                                            is_causal=causal).transpose(1, 2)
        return F.flash_attn_func(q, k, v, dropout_p=p, causal=causal)

    def step():
        out = attend()
        if call == "backward":
            out.backward(do)
        else:
            torch.autograd.grad(out, (q, k, v), do)

    try:
        graph = capture_graph(step, (q, k, v))
        graph.replay()
        torch.cuda.synchronize()
        print(f"{case}: captured and replayed", flush=True)
    except Exception as e:  # noqa: BLE001 - the probe reports whatever a capture raises
        print(f"{case}: FAILED {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        traceback.print_exc()


def main():
    if len(sys.argv) > 1:
        run_case(sys.argv[1])
        return
    procs = {c: subprocess.Popen([sys.executable, __file__, c], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for c in CASES}
    for c, proc in procs.items():
        out, _ = proc.communicate()
        lines = out.splitlines()
        print(next((l for l in lines if l.startswith(c)), f"{c}: no result (exit {proc.returncode})"), flush=True)
        if "FAILED" in out or proc.returncode:
            print("    " + "\n    ".join(lines[-25:]), flush=True)


if __name__ == "__main__":
    main()
