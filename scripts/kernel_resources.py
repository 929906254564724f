"""Registers and spill stack of the dense flash kernels per launch config, for sm_90, without a GPU.

Compiles each kernel with triton.compile for GPUTarget("cuda", 90, 32), pointers, strides and lengths
marked 16-divisible as the GPU launcher specializes them, and reads the cubin's resource usage with the
cuobjdump shipped in Triton's wheel. STACK > 0 means local-memory spills: the config pays extra memory
traffic in its inner loop. Advisory only: the autotuner times configs on the GPU and is the judge.

    python scripts/kernel_resources.py --head-dim 128 --causal
    python scripts/kernel_resources.py --head-dim 64 --causal --sass-dropout   # the SASS opcodes dropout adds
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from _common import repo_root, run_metadata

repo_root()
import kernels.flash as F  # noqa: E402

_TYPES = {"LSE": "*fp32", "DELTA": "*fp32", "DQA": "*fp32", "SEED": "*i64", "cu_seqlens_q": "*i32", "cu_seqlens_k": "*i32"}
_TENSORS = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ"}
_FLOATS = {"qk_scale", "sm_scale", "drop_scale"}
_DIVISIBLE = ("stride_", "seqlen", "TUNE_", "total_rows")  # as Triton specialises ints divisible by 16 at launch


H100_SMEM_PER_BLOCK = 232448  # bytes of shared memory one thread block may have on an H100 (227 KiB)


def tensordesc(dtype: str, block: list[int], layout) -> str:
    """The signature type of a host-built Gluon TMA descriptor argument (e.g. dtype "bf16", a block, its
    NVMMASharedLayout), for `resources`' types."""
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def compile_sm90(jitfn, consts: dict, warps: int, stages: int, types: dict | None = None, options: dict | None = None):
    """triton.compile of one launch config of a @triton.jit or @gluon.jit kernel for sm_90, arguments typed by
    their names (types: those the names do not tell, e.g. `tensordesc`), pointers and the _DIVISIBLE integers
    marked 16-divisible as a launch marks them; options: extra compile options (e.g. maxnreg)."""
    names = jitfn.arg_names
    # constexpr parameters left at their defaults (FUSED_DQ, DQ_TMA, REVERSE...) must be constants here too, as
    # the launcher makes them: typed as runtime ints, an `if` on one compiles both branches
    consts = {**{p.name: p.default for p in jitfn.params if p.is_constexpr and p.has_default}, **consts}
    sig = {}
    for a in names:
        if a in consts:
            sig[a] = "constexpr"
        elif types and a in types:
            sig[a] = types[a]
        elif a in _TYPES:
            sig[a] = _TYPES[a]
        else:
            sig[a] = "*bf16" if a in _TENSORS else ("fp32" if a in _FLOATS else "i32")
    # Integers the kernel keeps unspecialised (`do_not_specialize`) are never marked at launch either
    unspecialised = {p.name for p in jitfn.params if p.do_not_specialize}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if sig[a].startswith("*") or (a.startswith(_DIVISIBLE) and a not in unspecialised)}
    source = ASTSource
    if jitfn.is_gluon():  # Gluon kernels (results/attention/gluon_*/) compile from their own source type
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn=jitfn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages, **(options or {})})


def resources(jitfn, consts: dict, warps: int, stages: int, sass: bool = False, types: dict | None = None) -> dict:
    """{"regs", "stack", "smem" (bytes of shared memory, at most H100_SMEM_PER_BLOCK to launch)} of one launch config
    of a @triton.jit or @gluon.jit kernel (`compile_sm90`); with sass, also "ops": the cubin's SASS opcode counts
    (static: every instruction of the kernel once, whether in a loop or not)."""
    compiled = compile_sm90(jitfn, consts, warps, stages, types)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        listing = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout if sass else ""
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    ops = Counter(m_.group(1) for m_ in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", listing,
                                                   re.MULTILINE))
    return dict(regs=int(m.group(1)), stack=int(m.group(2)), smem=compiled.metadata.shared,
                **({"ops": ops} if sass else {}))


def dropout_sass(kind: str, jitfn, cfg, head_dim: int, causal: bool) -> list[str]:
    """Markdown rows: where the instructions that dropout adds to one kernel config go (SASS opcodes, static)."""
    m, n, w, s = cfg
    ops = {}
    for drop in (False, True):
        consts = dict(HEAD_DIM=head_dim, BLOCK_D=F._block_d(head_dim), BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=causal,
                      VARLEN=False, HAS_DROPOUT=drop)
        if "REVERSE" in jitfn.arg_names:
            consts["REVERSE"] = causal
        ops[drop] = resources(jitfn, consts, w, s, sass=True)["ops"]
    added = sorted(set(ops[True]) | set(ops[False]), key=lambda k: ops[False][k] - ops[True][k])
    rows = [f"| {kind} {cfg} | total | {sum(ops[False].values())} | {sum(ops[True].values())} | "
            f"+{sum(ops[True].values()) - sum(ops[False].values())} |"]
    rows += [f"| | {k} | {ops[False][k]} | {ops[True][k]} | +{ops[True][k] - ops[False][k]} |" for k in added[:10]]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dropout", action="store_true")
    ap.add_argument("--gqa", action="store_true",
                    help="dkdv / fused: the grouped-query form (a loop over the query heads of each key head); "
                         "without it, what every launch with as many key heads as query heads compiles")
    ap.add_argument("--kernels", nargs="+", default=["fwd", "dkdv", "dq"], choices=["fwd", "dkdv", "dq", "fused"],
                    help="fused: the dK/dV kernel that also adds dQ through the TMA reduce (kernels/flash.py _fused_bwd)")
    ap.add_argument("--extra", nargs="+", default=[], metavar="M,N,WARPS,STAGES",
                    help="configs to compile beside each kernel's tuning list (not in it: candidates to add)")
    ap.add_argument("--sass-dropout", action="store_true",
                    help="instead: the SASS opcodes dropout adds to each kernel's FLASH_AUTOTUNE=0 config (static counts)")
    args = ap.parse_args()
    d = args.head_dim
    jitfns = {"fwd": F._fwd_kernel, "dkdv": F._bwd_dkdv_kernel, "dq": F._bwd_dq_kernel, "fused": F._bwd_dkdv_kernel}
    kernels = {kind: (fn, F.tuning_shapes(kind, F._block_d(d))) for kind, fn in jitfns.items()}
    fallback = F.fallback_configs(F._block_d(d))
    meta = run_metadata(device=False)
    if args.sass_dropout:
        print(f"sm_90, head dim {d}, causal={args.causal}, triton {triton.__version__}, {meta['date']}, `{meta['command']}`")
        print("| kernel (BLOCK_M, BLOCK_N, warps, stages) | SASS opcode | no dropout | dropout | added |")
        print("|---|---|---:|---:|---:|")
        for kind in args.kernels:
            print("\n".join(dropout_sass(kind, kernels[kind][0], fallback[kind], d, args.causal)), flush=True)
        return
    print(f"sm_90, head dim {d}, causal={args.causal}, dropout={args.dropout}, gqa={args.gqa}, triton {triton.__version__}, "
          f"{meta['date']}, `{meta['command']}`")
    print("| kernel | (BLOCK_M, BLOCK_N, warps, stages) | registers | spill stack (bytes) | shared memory (KiB) | note |")
    print("|---|---|---:|---:|---:|---|")
    extra = [tuple(int(x) for x in e.split(",")) for e in args.extra]
    for kind in args.kernels:
        jitfn, shapes = kernels[kind]
        for cfg in dict.fromkeys([*shapes, *([fallback[kind]] if kind in fallback else []), *extra]):
            m, n, w, s = cfg
            consts = dict(HEAD_DIM=d, BLOCK_D=F._block_d(d), BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=args.causal,
                          VARLEN=False, HAS_DROPOUT=args.dropout)
            if kind in ("dkdv", "fused"):
                consts["GQA"] = args.gqa
            if kind == "fused":
                consts.update(FUSED_DQ=True, DQ_TMA=True)
            r = resources(jitfn, consts, w, s)
            note = ("FLASH_AUTOTUNE=0 fallback" if cfg == fallback.get(kind) else
                    "not in the tuning list" if cfg not in shapes else "")
            if r["smem"] > H100_SMEM_PER_BLOCK:
                note = (note + "; " if note else "") + "does not fit an H100's shared memory"
            print(f"| {kind} | {cfg} | {r['regs']} | {r['stack']} | {r['smem'] / 1024:.0f} | {note} |", flush=True)


if __name__ == "__main__":
    main()
