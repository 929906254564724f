"""pytest plugin for the GPU tests with split_m.patch applied: FLASH_AUTOTUNE=0's forward at head dims up to 64 becomes
(128, 128, 4, 3) as two query half-tiles (SPLIT_M), so the dense forward tests run `_fwd_halves` on the GPU (the
fixed configs never pick it otherwise). Head dims above 64 keep their own fixed forward, without SPLIT_M.

    PYTHONPATH=results/attention/fwd_split_m FLASH_AUTOTUNE=0 python -m pytest -q -p force_split_m -m gpu \
        tests/test_flash.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())

import kernels.flash as F  # noqa: E402

F._DEFAULT["fwd"] = (128, 128, 4, 3)
_launch = F._launch


def _launch_split(kind, raw, tuned, grid_of, args, consts, dtypes=()):
    if kind == "fwd" and consts["BLOCK_D"] <= 64 and not F._interpreting() and (tuned is None or not F._autotuning()):
        F._KIND_CONSTS["fwd"] = {"SPLIT_M": True}
        try:
            return _launch(kind, raw, tuned, grid_of, args, consts, dtypes)
        finally:
            F._KIND_CONSTS.pop("fwd", None)
    return _launch(kind, raw, tuned, grid_of, args, consts, dtypes)


F._launch = _launch_split
