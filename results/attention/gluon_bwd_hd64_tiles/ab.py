"""Run in session 29 (ab_h100.txt): 128 x 64 took 0.83-0.86x the shipped 64 x 128 from 1K and 0.99-1.01x at GPT-2's
shape, inside the prediction below; not shipped. Prepared in session 28: other tiles for the Gluon backward at head dim 64, which
the split layouts of session 28 (`_tile_layout`: a 64-key tile split across the two warpgroups along its columns)
made compile without spills.

At head dim 64 the shipped tiles, 64 queries x 128 keys, give 0.95-0.99x the @triton.jit backward at 1K and
1.05-1.10x from 2K, while cuDNN's backward without dropout is ~10% faster still
(results/attention/launch_direct/hd64_bwd_h100.txt); 128 x 128 spills 296 bytes a thread. Compiled for sm_90 on the
CPU machine (compile_sm90.txt), 128 queries x 64 keys now fits without spills in 2 and 3 stages (183 / 216 KB), as do
64 x 64. Each program then owns half as many keys, so the grid doubles, while every program still reads all of Q and
dO and adds a dQ partial per query tile: twice the Q / dO reads and dQ reduce traffic of the shipped tiles.

Prediction (before any GPU run): 128 x 64 at 0.85-1.00x the shipped tiles, a gain if anywhere at 1K, where the
doubled grid helps most; 64 x 64 slower everywhere. Kept only if it beats the shipped tiles at GPT-2's shape
(the Gluon backward's way to GPT-2's flash >= sdpa, with dropout added to it later).

    python results/attention/gluon_bwd_hd64_tiles/ab.py   # GPU (sm_90)
"""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels.flash as F  # noqa: E402
import kernels.flash_gluon as G  # noqa: E402

CONFIGS = [(64, 128, 2, 2), (128, 64, 2, 2), (128, 64, 3, 2), (64, 64, 2, 2)]  # (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES)
SHIPPED = G.BWD_TILES[64]


def ms(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=60, return_mode="median")


def use_tiles(tiles) -> None:
    G.BWD_TILES[64] = tiles
    G.bwd_layouts.cache_clear()


def row(name, b, n, h, causal):
    d = 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    scale = d ** -0.5
    o, lse, seed = F._flash_fwd(q, k, v, scale, causal, 0.0, False, None, None, n, n)

    def bwd(gluon):
        return F._flash_bwd(do, q, k, v, o, lse, seed, scale, causal, 0.0, False, None, None, n, n, gluon=gluon)

    ref = bwd(False)
    cells = [f"triton {ms(lambda: bwd(False)):.3f}"]
    for tiles in CONFIGS:
        use_tiles(tiles)
        got = bwd(True)
        err = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, ref))
        again = bwd(True)
        rerun = torch.equal(again[1], got[1]) and torch.equal(again[2], got[2])
        cells.append(f"{tiles} {ms(lambda: bwd(True)):.3f} (err {err:.1e}{'' if rerun else ', dK/dV rerun differs'})")
    use_tiles(SHIPPED)
    print(f"{name:24s} | " + " | ".join(cells), flush=True)


def main():
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; head dim 64, bf16, no dropout; backward ms (do_bench "
          "median) of the @triton.jit backward and of the Gluon backward per (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES); "
          f"err: max |g - g_triton| / max |g_triton|; the @triton.jit side "
          f"{'autotuned' if F._autotuning() else 'at fixed configs (FLASH_AUTOTUNE=0)'}", flush=True)
    G.BWD_MIN_SEQLEN = dict.fromkeys(G.BWD_MIN_SEQLEN, 0)
    row("GPT-2 (16x1K, 12 heads)", 16, 1024, 12, True)
    for causal in (False, True):
        for n in (1024, 2048, 4096, 16384):
            row(f"{n} {'causal' if causal else 'full'} (32 heads)", 16384 // n, n, 32, causal)


if __name__ == "__main__":
    main()
