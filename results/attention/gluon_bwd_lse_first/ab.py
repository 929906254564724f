"""Session 46's backward experiment (README.md here): head dim 128's `_bwd_kernel` with LSE_i read from shared memory
before the tile's first wgmma are issued (LSE_FIRST) and delta_i read before dP^T's wgmma is waited for
(DELTA_EARLY), instead of each right where it is used (STATS_AT_USE, shipped at 128).

In session 37's ncu run at head dim 128 (../gluon_bwd_profile/, sass_ours_hd128.csv.gz) the most-sampled instruction
of the compute warps is the FFMA that subtracts LSE from S^T: 21.8K samples, nearly all "short scoreboard", i.e.
waiting for LSE's shared-memory load. That load is issued after S^T's wait, while dP^T's wgmma still reads V and dO_i
from shared memory.

Runs session 45's A/B (../gluon_bwd_early_release/ab.py) with these forms:

    python results/attention/gluon_bwd_lse_first/ab.py compile --head-dims 128   # sm_90 registers / spills (CPU)
    python results/attention/gluon_bwd_lse_first/ab.py check --head-dims 128     # GPU
    python results/attention/gluon_bwd_lse_first/ab.py bench --head-dims 128     # GPU
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_early_release"))
import ab as E  # noqa: E402


def forms(head_dim: int) -> dict:
    """Every form names both flags, so the launcher's own choice does not leak in."""
    off = dict(LSE_FIRST=False, DELTA_EARLY=False)
    return {"shipped": off, "lse_first": dict(off, LSE_FIRST=True), "delta_early": dict(off, DELTA_EARLY=True),
            "both": dict(LSE_FIRST=True, DELTA_EARLY=True)}


if __name__ == "__main__":
    E.forms = forms  # `E.backwards` and `E.compile_report` build the forms from it
    E.main()
