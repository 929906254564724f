"""A/B: the Gluon kernels with TMA descriptors built on the host (kernels/flash_gluon.py since session 25, passed by
value as __grid_constant__ CUtensorMaps) against the same kernels building their own in every program
(`tma.make_tensor_descriptor`, 4 per forward program and 7 per backward program, written to global scratch).

The device-descriptor module is the previous kernels/flash_gluon.py, loaded from a file (git show 50ad77f:
kernels/flash_gluon.py > outputs/devcalls/flash_gluon_devdesc.py). Same inputs, interleaved rounds (A B A B), outputs
checked bit-equal (forward O and LSE, backward dK and dV; dQ's reduce order varies).

    python results/attention/gluon_hostdesc/hostdesc_ab.py [path of the device-descriptor module]
"""
import importlib.util
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as host  # noqa: E402


def load(path):
    spec = importlib.util.spec_from_file_location("flash_gluon_devdesc", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(path="outputs/devcalls/flash_gluon_devdesc.py"):
    dev = load(path)
    F._ensure_tma_allocator()  # the device-descriptor kernels' scratch
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    cases = [(128, 1024, False), (128, 1024, True), (128, 2048, True), (128, 4096, False), (128, 4096, True),
             (128, 16384, False), (128, 16384, True), (256, 512, False), (256, 512, True), (256, 4096, False)]
    for d, n, causal in cases:
        b, h = 16384 // n, 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        scale = d ** -0.5
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        outs = {}

        def fwd(mod):
            o = torch.empty_like(q)
            lse = torch.empty(b, h, n, device="cuda")
            mod.gluon_forward(q, k, v, o, lse, scale * F.LOG2E, causal)
            return o, lse

        for name, mod in (("dev", dev), ("host", host)):
            outs[name] = fwd(mod)
        same_f = all(torch.equal(a, c) for a, c in zip(outs["dev"], outs["host"]))
        t = {"dev": [], "host": []}
        for _ in range(2):
            for name, mod in (("dev", dev), ("host", host)):
                t[name].append(do_bench(lambda: fwd(mod)))
        line = (f"hd {d} n {n} causal {causal} fwd: device-desc {min(t['dev']):.3f} ms "
                f"({flops / min(t['dev']) * 1e-9:.0f}) | host-desc {min(t['host']):.3f} ms "
                f"({flops / min(t['host']) * 1e-9:.0f}) | x{min(t['dev']) / min(t['host']):.3f}"
                f"{'' if same_f else ' | DIFFERS'}")
        if d == 128:
            o, lse = outs["host"]
            delta = F.bwd_preprocess(o, do)

            def bwd(mod):
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                mod.gluon_backward(do, q, k, v, lse, delta, dq, dk, dv, scale, causal)
                return dq, dk, dv

            gd, gh = bwd(dev), bwd(host)
            same_b = torch.equal(gd[1], gh[1]) and torch.equal(gd[2], gh[2])
            tb = {"dev": [], "host": []}
            for _ in range(2):
                for name, mod in (("dev", dev), ("host", host)):
                    tb[name].append(do_bench(lambda: bwd(mod)))
            fb = 2.5 * flops
            line += (f" || bwd: device-desc {min(tb['dev']):.3f} ms ({fb / min(tb['dev']) * 1e-9:.0f}) | host-desc "
                     f"{min(tb['host']):.3f} ms ({fb / min(tb['host']) * 1e-9:.0f}) | "
                     f"x{min(tb['dev']) / min(tb['host']):.3f}{'' if same_b else ' | DIFFERS'}")
        print(line, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
