"""Host time of kernels.flash._ws_layout_problem on the six tensors a Gluon backward checks, this tree's version
against the version at a given commit (before its shape and strides were fetched once per tensor), alternating,
9 rounds; both must give the same answers.

    python results/attention/host_python/layout_check_cpu.py [COMMIT]   # default 3f45201
"""
import os
import re
import subprocess
import sys
import timeit

import torch


def _function(source: str):
    match = re.search(r"def _ws_layout_problem\(.*?\n    return None\n", source, re.S)
    namespace = {"torch": torch}
    exec(match.group(0).replace(" -> str | None", ""), namespace)
    return namespace["_ws_layout_problem"]


def main():
    commit = sys.argv[1] if len(sys.argv) > 1 else "3f45201"
    before = _function(subprocess.run(["git", "show", f"{commit}:kernels/flash.py"], capture_output=True, text=True,
                                      check=True).stdout)
    now = _function(open(os.path.join(os.getcwd(), "kernels/flash.py")).read())
    checked = [torch.randn(1, 1024, 1, 64, dtype=torch.bfloat16) for _ in range(6)]
    others = [torch.randn(2, 64, 3, 4, 64).unbind(2)[1], torch.randn(2, 4, 64, 64).transpose(1, 2),
              torch.randn(2, 128, 4, 64)[:, :64], torch.randn(0, 64, 4, 64)]
    for t in checked + others:
        assert before(t, False) == now(t, False), t.shape
    times = {"before": [], "now": []}
    for _ in range(9):
        for name, fn in (("before", before), ("now", now)):
            best = min(timeit.repeat(lambda: [fn(t, False) for t in checked], number=2000, repeat=3))
            times[name].append(best / 2000 * 1e6)
    print(f"torch {torch.__version__}; _ws_layout_problem on six (1, 1024, 1, 64) tensors, us a backward "
          f"(median of 9 rounds, each the best of 3 x 2000)")
    for name, t in times.items():
        print(f"{name:7s} {sorted(t)[4]:6.2f}   ({'at ' + commit if name == 'before' else 'this tree'})")


if __name__ == "__main__":
    main()
