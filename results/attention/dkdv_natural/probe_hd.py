"""Compile-only (sm_90, on the CPU machine): does the natural orientation spill at the other head dims?

probe.py measured head dim 64, where the natural tile is spill-free at 64-128-query tiles. The change (then a patch)
rewrites `_dkdv_tile` for every head dim (and for kernels/blocksparse.py through `bwd_dkdv_block_step`), so this compiles
`_bwd_dkdv_kernel` at head dims 32, 128 and 256 over the dK/dV candidates the autotuner keeps there
(`tuning_shapes("dkdv", d)` after `_prune`'s rule) and the FLASH_AUTOTUNE=0 config, both orientations, causal,
dropout off and on: registers, spill bytes and static SASS instruction count (every instruction once).

    python results/attention/dkdv_natural/probe_hd.py > results/attention/dkdv_natural/probe_hd.txt

Measured before the change shipped (session 31; see README.md): there "shipped" is the keys-as-rows form
everywhere. From that commit on, `_dkdv_tile` picks the form by tile shape, so "shipped" here means that.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton  # noqa: E402

import kernels.flash as F  # noqa: E402

HEAD_DIMS = (32, 128, 256)


def candidates(d: int) -> list[tuple[int, int, int, int]]:
    """The dK/dV configs the autotuner tries at head dim d with the session-30 patch (which added (128, 64, 8, 2)), as
    `_prune` keeps them, then the fixed one."""
    shapes = [s for s in F.tuning_shapes("dkdv", d) + [(128, 64, 8, 2)] if d <= 128 or s[0] * s[1] <= 64 * 64]
    fixed = F.fallback_configs(d)["dkdv"]
    return shapes + ([fixed] if fixed not in shapes else [])


def one(variant: str, d: int, dropout: bool) -> dict:
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    from kernel_resources import resources

    if variant == "natural":
        import probe

        F.__dict__["_dkdv_tile"] = probe.natural_tile
    out = {}
    for m, n, w, s in candidates(d):
        c = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=True, VARLEN=False, HAS_DROPOUT=dropout,
                 GQA=False)
        try:
            r = resources(F._bwd_dkdv_kernel, c, w, s, sass=True)
        except Exception as e:  # noqa: BLE001  (a tile that does not compile, e.g. out of shared memory)
            out[str((m, n, w, s))] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"}
            continue
        out[str((m, n, w, s))] = dict(total=sum(r["ops"].values()), regs=r["regs"], stack=r["stack"], smem=r["smem"])
    return out


def table():
    env = dict(os.environ, TRITON_INTERPRET="0")
    print("# Command: python results/attention/dkdv_natural/probe_hd.py (CPU machine, compile-only for sm_90)")
    print(f"sm_90, triton {triton.__version__}, `_bwd_dkdv_kernel`, causal, MHA; cells: regs / spill bytes / static "
          "SASS instructions")
    for d in HEAD_DIMS:
        runs = {}
        for variant in ("shipped", "natural"):
            for dropout in (False, True):
                res = subprocess.run([sys.executable, __file__, variant, str(d), str(int(dropout))],
                                     capture_output=True, text=True, env=env)
                line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
                runs[variant, dropout] = json.loads(line[0][7:]) if line else {"error": res.stderr[-200:]}
        print(f"\n## head dim {d}\n")
        print("| config | shipped | natural | shipped, dropout | natural, dropout |")
        print("|---|---|---|---|---|")
        for cfg in map(str, candidates(d)):
            cells = []
            for key in (("shipped", False), ("natural", False), ("shipped", True), ("natural", True)):
                x = runs[key].get(cfg, runs[key])
                cells.append(x["error"][:60] if "error" in x else f"{x['regs']} / {x['stack']} / {x['total']}")
            print(f"| {cfg} | " + " | ".join(cells) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("shipped", "natural"):
        print("RESULT " + json.dumps(one(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1")), flush=True)
    else:
        table()
