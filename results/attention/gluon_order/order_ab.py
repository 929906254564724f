"""A/B of the Gluon kernels' program order (kernels/flash_gluon.py `_tile_order`, FWD_HEAD_GROUP / BWD_HEAD_GROUP).

The 2-D grid (tiles, batch x heads) runs one head's tiles after another; under the causal mask the GPU's last wave
then holds tiles of the last heads of every length. HEAD_GROUP = G deals G heads' tiles in turn, longest first, so
the last wave holds the shortest tiles, while G heads' K and V (forward) or Q and dO (backward) share L2. G = 0 is the
2-D grid; G = all interleaves every head. Head dim 128, bf16, 16K tokens a batch, 16 heads; each order's outputs are
checked bit-equal to G = 0's (dK, dV for the backward; dQ's reduce order varies anyway).

    python results/attention/gluon_order/order_ab.py     # GPU (sm_90): ms per order, against cuDNN

Runs at 64542db only: the order it measures was not kept, and later kernels have no HEAD_GROUP (README.md).
"""
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

GROUPS = [0, 2, 4, 8, 16, 1 << 20]


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for causal, seqlen in ((True, 2048), (True, 4096), (True, 8192), (True, 16384), (False, 4096), (False, 16384)):
        batch, nheads, d = 16384 // seqlen, 16, 128
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(batch, seqlen, nheads, d, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(4))
        scale = d ** -0.5
        flops = 4 * batch * nheads * seqlen * seqlen * d / (2 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            cudnn_f = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            cudnn_b = do_bench(lambda: torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2), retain_graph=True))
        cells_f, cells_b, ref = [], [], None
        for grp in GROUPS:
            G.FWD_HEAD_GROUP = {False: grp, True: grp}
            G.BWD_HEAD_GROUP = {False: grp, True: grp}
            o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, seqlen, seqlen)
            grads = F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, seqlen, seqlen)
            if ref is None:
                ref = (o, lse, grads)
            same = (torch.equal(o, ref[0]) and torch.equal(lse, ref[1]) and torch.equal(grads[1], ref[2][1])
                    and torch.equal(grads[2], ref[2][2]))
            f = do_bench(lambda: F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, seqlen, seqlen))
            b = do_bench(lambda: F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None,
                                              seqlen, seqlen))
            name = "all" if grp == GROUPS[-1] else grp
            cells_f.append(f"G={name} {f:.3f} ({flops / f * 1e-9:.0f}, x{cudnn_f / f:.2f} cuDNN)"
                           + ("" if same else " DIFFERS"))
            cells_b.append(f"G={name} {b:.3f} ({2.5 * flops / b * 1e-9:.0f}, x{cudnn_b / b:.2f} cuDNN)")
        print(f"n {seqlen} causal {causal} fwd ms (TF/s): cuDNN {cudnn_f:.3f} | " + " | ".join(cells_f), flush=True)
        print(f"n {seqlen} causal {causal} bwd ms (TF/s): cuDNN {cudnn_b:.3f} | " + " | ".join(cells_b), flush=True)


if __name__ == "__main__":
    main()
