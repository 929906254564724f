"""pytest plugin for the GPU tests with integrate.patch applied: FLASH_AUTOTUNE=0's dK/dV config at head dims up to
64 becomes (64, 64, 4, 3), a tile with as many queries as keys, so the dense kernel tests run the queries-as-rows
form of `_dkdv_tile` (the shipped fixed (16, 64, 4, 4) takes the keys-as-rows form):

    PYTHONPATH=results/attention/dkdv_natural FLASH_AUTOTUNE=0 python -m pytest -q -p fixed_natural -m gpu \
        tests/test_flash.py tests/test_blocksparse.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())

import kernels.flash as F  # noqa: E402

F._DEFAULT["dkdv"] = (64, 64, 4, 3)
