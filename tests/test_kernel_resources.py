"""scripts/kernel_resources.py compiles a kernel for sm_90 on a machine without a GPU and reads its
register and spill counts; checked on small configs so the tool does not rot, and so that the CPU suite compiles
what the interpreter cannot check (the interpreter runs code a real compile refuses)."""
import json
import os
import subprocess
import sys

import pytest
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
needs_cuobjdump = pytest.mark.skipif(not os.path.exists(TOOL), reason="triton wheel without cuobjdump")


def compile_sm90(kernel: str, consts: str, warps: int, stages: int, setup: str = "import kernels.flash as F",
                 types: str = "None") -> dict:
    """resources(<kernel>, <consts>, ..., types=<types>) in a fresh process, kernel, consts and types being Python
    expressions evaluated after `setup` (which may use kernel_resources as R): compiling needs real @triton.jit /
    @gluon.jit functions, not the interpreter's stand-ins this suite runs with."""
    code = ("import json, sys; sys.path.insert(0, 'scripts'); import kernel_resources as R; " + setup + "; "
            f"r = R.resources({kernel}, {consts}, {warps}, {stages}, sass=True, types={types}); "
            "print(json.dumps({**r, 'ops': dict(r['ops'])}))")
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _compile_sm90(kernel: str, consts: dict, warps: int, stages: int) -> dict:
    """compile_sm90 of kernels.flash.<kernel>."""
    return compile_sm90(f"F.{kernel}", repr(consts), warps, stages)


@needs_cuobjdump
def test_resources_of_one_config():
    # With dropout: a global that is only annotated constexpr runs under the interpreter but does not compile.
    r = _compile_sm90("_fwd_kernel", dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=64, BLOCK_N=32, IS_CAUSAL=True,
                                          VARLEN=False, HAS_DROPOUT=True, REVERSE=False), 4, 2)
    assert 16 <= r["regs"] <= 255 and r["stack"] >= 0
    # shared memory: at least the K and V tiles of the two pipeline stages (32 x 64 bf16 each), at most an H100's
    assert 2 * 2 * 32 * 64 * 2 <= r["smem"] <= 232448
    assert r["ops"].get("EXIT", 0) >= 1 and r["ops"].get("HGMMA", 0) + r["ops"].get("HMMA", 0) > 0  # the dots


@needs_cuobjdump
def test_fused_backward_compiles_for_sm90_with_the_tma_reduce():
    """The fused backward's dQ goes through a TMA reduce, which the interpreter never compiles (it takes the
    element-wise atomics): compile it here, with dropout, varlen and a padded head dim."""
    r = _compile_sm90("_bwd_dkdv_kernel", dict(HEAD_DIM=24, BLOCK_D=32, BLOCK_M=64, BLOCK_N=64, IS_CAUSAL=True,
                                               VARLEN=True, HAS_DROPOUT=True, FUSED_DQ=True, DQ_TMA=True), 4, 3)
    assert any(op.startswith("UTMARED") for op in r["ops"])  # the bulk tensor reduce, not element-wise atomics


@needs_cuobjdump
def test_constexpr_defaults_are_compiled_as_constants():
    """`--kernels dkdv` left FUSED_DQ / DQ_TMA out of the constants, so they were typed as runtime ints and the
    compile failed on the TMA branch (session 18); the tool now takes every constexpr default as the launcher does."""
    r = _compile_sm90("_bwd_dkdv_kernel", dict(HEAD_DIM=32, BLOCK_D=32, BLOCK_M=32, BLOCK_N=32, IS_CAUSAL=False,
                                               VARLEN=False, HAS_DROPOUT=False), 4, 2)
    assert r["regs"] > 0 and not any(op.startswith("UTMARED") for op in r["ops"])  # the two-kernel form


@needs_cuobjdump
def test_dkdv_without_grouped_heads_has_no_runtime_head_loop():
    """Without GQA the dK/dV kernel's loop over grouped query heads has a constant single trip: the runtime-bounded
    loop cost 45 registers and 40 bytes of spills at GPT-2's shape (results/attention/kernel_resources/sm90_gqa_loop.md)."""
    consts = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=32, BLOCK_N=64, IS_CAUSAL=True, VARLEN=False, HAS_DROPOUT=True)
    grouped = _compile_sm90("_bwd_dkdv_kernel", dict(consts, GQA=True), 4, 4)
    single = _compile_sm90("_bwd_dkdv_kernel", dict(consts, GQA=False), 4, 4)
    assert single["stack"] == 0 and single["regs"] + 16 <= grouped["regs"], (single, grouped)


@needs_cuobjdump
def test_lse_alignment_reaches_the_compiled_dkdv_loop():
    """The LSE strides are `do_not_specialize` (packed batches must not recompile), so a launch compiles them
    without the 16-divisibility fact, and so must this tool; LSE_ALIGNED gives the fact back, which turns the dK/dV
    loop's 4-byte LSE / delta copies into 8-byte ones: fewer LDGSTS (results/attention/lse_align/). Equal counts
    would mean the tool marks the strides aligned itself (hiding what a launch compiles) or the hint is lost."""
    consts = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=32, BLOCK_N=128, IS_CAUSAL=False, VARLEN=False, HAS_DROPOUT=False,
                  GQA=False)
    plain = _compile_sm90("_bwd_dkdv_kernel", dict(consts, LSE_ALIGNED=False), 4, 3)
    aligned = _compile_sm90("_bwd_dkdv_kernel", dict(consts, LSE_ALIGNED=True), 4, 3)
    assert aligned["ops"]["LDGSTS"] < plain["ops"]["LDGSTS"], (aligned["ops"]["LDGSTS"], plain["ops"]["LDGSTS"])
