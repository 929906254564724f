"""pytest plugin: every test of the process runs with `kernels.flash._dkdv_tile` swapped for probe.py's
`natural_tile` (swapped before anything compiles, as ab.py's worker does), so the kernel tests check the natural
orientation without editing kernels/flash.py:

    PYTHONPATH=results/attention/dkdv_natural TRITON_INTERPRET=1 python -m pytest -q -p natural_patch \
        tests/test_flash.py tests/test_blocksparse.py tests/test_flash_gpt2.py tests/test_padding.py    # CPU
    PYTHONPATH=results/attention/dkdv_natural FLASH_AUTOTUNE=0 python -m pytest -q -p natural_patch -m gpu \
        tests/test_flash.py tests/test_blocksparse.py                                                  # GPU
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.getcwd())

import kernels.flash as F  # noqa: E402
import probe  # noqa: E402

F.__dict__["_dkdv_tile"] = probe.natural_tile
