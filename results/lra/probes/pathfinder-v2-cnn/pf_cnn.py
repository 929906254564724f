"""Learnability probe (not shipped): a small CNN on Pathfinder images, GPU, fixed wall budget.
python pf_cnn.py DIR SECONDS -> prints val/test accuracy per epoch."""
import sys, time, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
d, budget = sys.argv[1], float(sys.argv[2])
x = torch.from_numpy(np.load(f"{d}/images.npy")); y = torch.from_numpy(np.load(f"{d}/labels.npy")).long()
n = len(x); a, b = int(0.8 * n), int(0.9 * n)
dev = "cuda"
x = x.to(dev); y = y.to(dev)
def blk(i, o, s): return [nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
net = nn.Sequential(*blk(1, 32, 1), *blk(32, 32, 1), *blk(32, 64, 1), *blk(64, 64, 2), *blk(64, 128, 1),
                    *blk(128, 128, 2), *blk(128, 128, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 2)).to(dev)
net = net.to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(net.parameters(), 1e-3, weight_decay=1e-4)
def prep(xb): return (xb.float().unsqueeze(1) / 255.0 - 0.2).contiguous(memory_format=torch.channels_last)
def acc(lo, hi):
    net.eval(); c = 0
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        for i in range(lo, hi, 2048):
            c += (net(prep(x[i:min(hi, i + 2048)])).argmax(1) == y[i:min(hi, i + 2048)]).sum().item()
    net.train(); return c / (hi - lo)
t0 = time.time(); ep = 0
print(f"n={n} label mean {y.float().mean().item():.3f}", flush=True)
while time.time() - t0 < budget:
    perm = torch.randperm(a, device=dev); tl = 0; k = 0
    for i in range(0, a - 255, 256):
        idx = perm[i:i + 256]
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(net(prep(x[idx])), y[idx])
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); tl += loss.item() if k % 50 == 0 else 0; k += 1
    ep += 1
    print(f"epoch {ep} {time.time()-t0:.0f}s train loss~{loss.item():.3f} val {acc(a, b):.3f}", flush=True)
print(f"final test {acc(b, n):.3f}")
