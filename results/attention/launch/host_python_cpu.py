import os, time, cProfile, pstats
os.environ["TRITON_INTERPRET"] = "1"
import torch
import kernels.flash as F
F._launch = lambda *a, **k: None               # no kernels: only our Python around them
import kernels.launch
F.launch = lambda *a, **k: None                 # bwd_preprocess's launch
q, k, v = (torch.randn(1, 128, 4, 64, requires_grad=True) for _ in range(3))
def step():
    F.flash_attn_func(q, k, v).sum().backward()
def fwd():
    with torch.no_grad():
        F.flash_attn_func(q, k, v)
for f, name in ((fwd, "fwd"), (step, "fwd+bwd")):
    for _ in range(50): f()
    t = time.perf_counter()
    for _ in range(2000): f()
    print(name, (time.perf_counter() - t) / 2000 * 1e6, "us")
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): step()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
