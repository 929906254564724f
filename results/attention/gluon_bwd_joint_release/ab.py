"""Session 46: head dim 128's backward with one partition-wide barrier fewer a tile (JOINT_RELEASE).

Gluon lowers each mbarrier arrive and wait of `_bwd_compute`'s 8-warp partition to a `bar.sync 0, 256` and the op:
five such barriers a tile in the sm_90 PTX at head dim 128 (before the Q/dO slot's wait, dS^T's hand to dQ's wgmma,
the slot's release, the dQ slot's wait, dQ's hand-off). JOINT_RELEASE releases the Q/dO slot right after dQ's
hand-off, so both arrives share one barrier: four a tile. The cost: the slot is released after dQ's shared-memory
stores rather than before them. The head-dim-128 backward is the one that trails cuDNN's (0.98x forward+backward).

Runs session 45's A/B (../gluon_bwd_early_release/ab.py) with two forms, the shipped kernel and JOINT_RELEASE:

    python results/attention/gluon_bwd_joint_release/ab.py check --head-dims 128
    python results/attention/gluon_bwd_joint_release/ab.py bench --head-dims 128
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_early_release"))
import ab as E  # noqa: E402

import kernels.flash_gluon as G  # noqa: E402


def forms(head_dim: int) -> dict:
    shipped = dict(STATS_AHEAD=head_dim in G.BWD_STATS_AHEAD_HEAD_DIMS,
                   EARLY_RELEASE=head_dim in G.BWD_EARLY_RELEASE_HEAD_DIMS, DQ_ATOMIC=False, JOINT_RELEASE=False)
    return {"shipped": shipped, "joint_release": dict(shipped, EARLY_RELEASE=False, JOINT_RELEASE=True)}


if __name__ == "__main__":
    E.forms = forms  # `E.backwards` builds the forms from it
    E.main()
