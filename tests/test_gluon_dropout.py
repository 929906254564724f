"""kernels/gluon_dropout.py: the dropout mask drawn inside Gluon kernels in a wgmma accumulator's layout.

On the CPU: it compiles for sm_90 and its final layout change moves no data (no shared memory, no shuffles), which
is the point of drawing the Philox calls where their scores are. On an sm_90 GPU: the mask equals
kernels.flash.dropout_keep_mask's, element for element, for several seeds, rates and tile shapes.
"""

import pytest
import torch

import kernels.flash as F
from tests.test_flash_gluon import gluon_gpu
from tests.test_kernel_resources import compile_sm90, needs_cuobjdump


@needs_cuobjdump
@pytest.mark.parametrize("rows, cols", [(64, 128), (64, 64)])
def test_keep_rows_moves_no_data(rows, cols):
    r = compile_sm90("D._keep_rows_kernel", f"dict(ROWS={rows}, COLS={cols})", rows // 16, 1,
                     "import kernels.gluon_dropout as D",
                     "dict(OUT='*i8', SEED='*i64', seqlen='i32', thresh='i32')")
    assert r["smem"] == 0 and r["stack"] == 0, r
    assert not any(op.startswith(("SHFL", "STS", "LDS")) for op in r["ops"]), r["ops"]
    # 7 Philox rounds of (rows / 2) x (cols / 4) calls over rows * 2 threads: two IMAD.HI and two IMAD a round
    calls_per_thread = (rows // 2) * (cols // 4) // (rows * 2)
    assert r["ops"].get("IMAD", 0) >= 4 * 7 * calls_per_thread, r["ops"]


def test_dropout_keep_mask_checks_its_arguments():
    from kernels.gluon_dropout import dropout_keep_mask

    with pytest.raises(ValueError, match="one int64 on the GPU"):
        dropout_keep_mask(torch.zeros(1, dtype=torch.int64), 1, 1, 128, 0.1)
    with pytest.raises(ValueError, match="one int64 on the GPU"):
        dropout_keep_mask(torch.zeros(2, dtype=torch.int32), 1, 1, 128, 0.1)


@pytest.mark.gpu
@gluon_gpu
@pytest.mark.parametrize("rows, cols", [(64, 128), (64, 64)])
@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.0])
def test_gpu_keep_rows_equals_the_triton_kernels_mask(rows, cols, dropout_p):
    from kernels.gluon_dropout import dropout_keep_mask

    for s in (0, 1, 2**61 + 12345):
        seed = torch.tensor([s], dtype=torch.int64, device="cuda")
        ours = dropout_keep_mask(seed, 2, 3, 256, dropout_p, rows, cols)
        ref = F.dropout_keep_mask(seed, 2, 3, 256, 256, dropout_p)
        assert torch.equal(ours, ref), (s, (ours != ref).sum().item())
    keep = ours.float().mean().item()
    assert abs(keep - (1 - dropout_p)) < 0.01, keep  # the rate itself, so an all-True mask cannot pass at p > 0


@pytest.mark.gpu
@gluon_gpu
def test_gpu_dropout_keep_mask_rejects_untiled_lengths():
    from kernels.gluon_dropout import dropout_keep_mask

    with pytest.raises(ValueError, match="multiple of the 64 x 128 tile"):
        dropout_keep_mask(torch.zeros(1, dtype=torch.int64, device="cuda"), 1, 1, 192, 0.1)
