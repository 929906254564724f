"""Long Range Arena (Tay et al., 2021): the five tasks' data, prepared once and read by one datamodule.

    listops     train/lra/listops.py     generated in the original format (basic_{train,val,test}.tsv)
    text        train/lra/text.py        byte-level; stand-in SpamAssassin ham vs spam, original IMDB via `datasets`
    retrieval   train/lra/retrieval.py   two byte-level documents; stand-in linux-doc links, original AAN tsv
    image       train/lra/image.py       32x32 grayscale pixels; stand-in Fashion-MNIST, original CIFAR-10
    pathfinder  train/lra/pathfinder.py  generated images.npy / labels.npy (shared with Path-X)

`python scripts/prepare_lra.py TASK --out DIR` writes a folder; `train.lra.datamodule.LRADataModule` reads
it. Prepared folders (text, retrieval, image) hold `{train,val,test}.npz` and a `meta.json` that names the
source, whether it is a stand-in, the counts and the stamp (what the folder was made from: content
digests and settings, never paths), so a second prepare with the same inputs is a no-op.

Variable-length token data is stored flat: `tokens` (all sequences concatenated) + `offsets` (n + 1),
`labels` (n); the two-document form (Retrieval) keeps its documents once each in `tokens`/`offsets` and
gives the pairs as row numbers `doc_1`, `doc_2` (n each): the linux-doc stand-in's pairs reuse 2.8K documents.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
SPLITS = ("train", "val", "test")
# Which sources are the original LRA data and which stand in for it (DATA.md: none of the originals
# can be fetched here).
STAND_INS = {"spamassassin": "IMDB", "linux-doc": "AAN", "fashion-mnist": "CIFAR-10", "fixture": "tiny test data"}


def stamp_of(*parts) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16]


def read_meta(out_dir) -> dict | None:
    p = Path(out_dir) / "meta.json"
    return json.loads(p.read_text()) if p.exists() else None


def is_prepared(out_dir, stamp: str) -> bool:
    m = read_meta(out_dir)
    return m is not None and m.get("stamp") == stamp


def write_meta(out_dir, meta: dict) -> dict:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(out_dir) / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, Path(out_dir) / "meta.json")
    return meta


def flatten(seqs) -> tuple[np.ndarray, np.ndarray]:
    """A list of 1-d arrays -> (tokens, offsets) with offsets[i]:offsets[i + 1] the i-th sequence."""
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    tokens = np.concatenate(seqs) if len(seqs) else np.zeros(0, np.uint8)
    return tokens, offsets


def save_split(path, labels, seqs, **extra):
    """One split as a flat .npz (written to a temporary name, then renamed: never half a file)."""
    tokens, offsets = flatten(seqs)
    arrays = {"tokens": tokens, "offsets": offsets, "labels": np.asarray(labels, dtype=np.int64), **extra}
    tmp = Path(str(path) + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def split_indices(n: int, seed: int, fractions=(0.8, 0.1, 0.1)) -> dict:
    """A seeded permutation of range(n) cut into train/val/test by `fractions`."""
    perm = np.random.default_rng(seed).permutation(n)
    n_val, n_test = int(round(fractions[1] * n)), int(round(fractions[2] * n))
    n_train = n - n_val - n_test
    return {"train": np.sort(perm[:n_train]), "val": np.sort(perm[n_train:n_train + n_val]),
            "test": np.sort(perm[n_train + n_val:])}


def check_caps(num_train: int | None = None, num_val: int | None = None, num_test: int | None = None) -> dict:
    """{split: cap} for the caps given (None = the whole split); a cap must be a positive integer."""
    caps = {s: n for s, n in zip(SPLITS, (num_train, num_val, num_test)) if n is not None}
    for s, n in caps.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"num_{s} must be a positive integer (examples kept in the {s} split), got {n!r}")
    return {s: int(n) for s, n in caps.items()}


def caps_stamp(caps: dict, seed: int) -> tuple:
    """What a capped folder adds to its stamp (nothing when uncapped: full folders keep their stamps), so
    a capped folder is never taken for a full one, nor for one with other caps."""
    return (("caps", sorted(caps.items()), seed),) if caps else ()


def cap_indices(idx: dict, caps: dict, seed: int) -> dict:
    """Each capped split's first `cap` indices after a seeded shuffle, in their original order: a fixed
    subset of the full split with its class and length mix (the sources are stored sorted by class, so
    the first `cap` in file order would be one class)."""
    out = dict(idx)
    for k, split in enumerate(SPLITS):
        if split in caps and caps[split] < len(idx[split]):
            i = np.asarray(idx[split])
            keep = np.random.default_rng([seed, 7, k]).permutation(len(i))[:caps[split]]
            out[split] = i[np.sort(keep)]
    return out


def to_bytes(text: str | bytes, max_bytes: int) -> np.ndarray:
    raw = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
    return np.frombuffer(raw[:max_bytes], dtype=np.uint8).copy()
