"""scripts/kernel_resources.py compiles a kernel for sm_90 on a machine without a GPU and reads its
register and spill counts; checked on one small config so the tool does not rot."""
import json
import os
import subprocess
import sys

import pytest
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


@pytest.mark.skipif(not os.path.exists(TOOL), reason="triton wheel without cuobjdump")
def test_resources_of_one_config():
    # With dropout: the interpreter runs code a real compile refuses (a global that is only annotated
    # constexpr), so the CPU suite compiles the dropout path too.
    code = (
        "import json, sys; sys.path.insert(0, 'scripts'); import kernel_resources as R, kernels.flash as F; "
        "c = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=64, BLOCK_N=32, IS_CAUSAL=True, VARLEN=False, "
        "HAS_DROPOUT=True, REVERSE=False); r = R.resources(F._fwd_kernel, c, 4, 2, sass=True); "
        "print(json.dumps({**r, 'ops': dict(r['ops'])}))"
    )
    # Compiling needs real @triton.jit functions, not the interpreter's stand-ins.
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert 16 <= r["regs"] <= 255 and r["stack"] >= 0
    assert r["ops"].get("EXIT", 0) >= 1 and r["ops"].get("HGMMA", 0) + r["ops"].get("HMMA", 0) > 0  # the dots
