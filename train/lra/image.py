"""LRA Image: 32x32 grayscale images classified from their 1,024 pixels as tokens (values 0-255).

Original: CIFAR-10 in grayscale (LRA's image/input_pipeline.py: tf.image.rgb_to_grayscale, train[:90%]
/ train[90%:] / test). Two loaders for users who have it: the CIFAR-10 python release
(cifar-10-batches-py/: data_batch_1..5, test_batch pickles), and `datasets` (`uoft-cs/cifar10`, or any
source with an image column and a label column). Grayscale: ITU-R 601 luma, 0.299 R + 0.587 G +
0.114 B, rounded (TensorFlow's weights).

Stand-in (DATA.md): Fashion-MNIST from Debian dataset-fashion-mnist (/usr/share/datasets/fashion-mnist/
*-ubyte.gz, MIT), 28x28 zero-padded by 2 on each side to 32x32, 10 classes, split like LRA's CIFAR:
the first 90% of train / the last 10% / test (54K / 6K / 10K).
"""
from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

from train.lra import cap_indices, caps_stamp, check_caps, is_prepared, read_meta, stamp_of, write_meta

SIZE = 32


def read_idx(path) -> np.ndarray:
    """An IDX file (the MNIST format), gzipped or not -> uint8 array of its shape."""
    raw = (gzip.open if str(path).endswith(".gz") else open)(path, "rb").read()
    if raw[:2] != b"\0\0" or raw[2] != 8:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape).copy()


def pad_to(images: np.ndarray, size: int = SIZE) -> np.ndarray:
    """(N, h, w) -> (N, size, size), zero-padded evenly (28 -> 32: 2 pixels each side)."""
    n, h, w = images.shape
    top, left = (size - h) // 2, (size - w) // 2
    out = np.zeros((n, size, size), dtype=np.uint8)
    out[:, top:top + h, left:left + w] = images
    return out


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB -> (...) uint8 luma."""
    y = rgb.astype(np.float32) @ np.array([0.2989, 0.5870, 0.1140], np.float32)
    return np.clip(np.rint(y), 0, 255).astype(np.uint8)


def lra_split(train_x, train_y, test_x, test_y) -> dict:
    """LRA's split: train[:90%], train[90%:], test."""
    cut = int(0.9 * len(train_x))
    return {"train": (train_x[:cut], train_y[:cut]), "val": (train_x[cut:], train_y[cut:]),
            "test": (test_x, test_y)}


def cap_splits(splits: dict, caps: dict, seed: int) -> dict:
    """{split: (x, y)} with each capped split cut to a seeded subset (train.lra.cap_indices)."""
    idx = cap_indices({s: np.arange(len(y)) for s, (x, y) in splits.items()}, caps, seed)
    return {s: (x[idx[s]], np.asarray(y)[idx[s]]) for s, (x, y) in splits.items()}


def write_images(out_dir, splits: dict, meta: dict, caps: dict | None = None, seed: int = 0) -> dict:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if caps:
        splits = cap_splits(splits, caps, seed)
        meta = dict(meta, caps=caps, seed=seed)
    for split, (x, y) in splits.items():
        x = np.ascontiguousarray(x, dtype=np.uint8)
        if x.shape[1:] != (SIZE, SIZE):
            raise ValueError(f"{split} images have shape {x.shape[1:]}, expected ({SIZE}, {SIZE})")
        tmp = Path(out_dir) / f"{split}.tmp.npz"
        np.savez(tmp, images=x, labels=np.asarray(y, dtype=np.int64))
        tmp.replace(Path(out_dir) / f"{split}.npz")
        meta[f"{split}_examples"] = int(len(y))
    return write_meta(out_dir, meta)


def prepare_fashion_mnist(root, out_dir, seed: int = 0, num_train: int | None = None, num_val: int | None = None,
                          num_test: int | None = None) -> dict:
    """num_*: keep at most that many images of a split (a subset of the full split, chosen by `seed`)."""
    from train.data import file_digest

    caps = check_caps(num_train, num_val, num_test)

    def find(stem):
        hits = sorted(Path(root).glob(f"**/{stem}*ubyte*"))
        if not hits:
            raise FileNotFoundError(f"no {stem}-ubyte(.gz) under {root}")
        return hits[0]

    files = [find(s) for s in ("train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1")]
    stamp = stamp_of("image-fashion-mnist-v1", file_digest(files), *caps_stamp(caps, seed))
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    tx, ty, vx, vy = (read_idx(f) for f in files)
    return write_images(out_dir, lra_split(pad_to(tx), ty, pad_to(vx), vy),
                        {"task": "image", "source": "fashion-mnist", "stand_in_for": "CIFAR-10", "stamp": stamp},
                        caps, seed)


def read_cifar_python(folder) -> tuple:
    """The CIFAR-10 python release (data_batch_1..5, test_batch) -> grayscale (x, y, test_x, test_y)."""
    def load(name):
        with open(Path(folder) / name, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, SIZE, SIZE).transpose(0, 2, 3, 1)
        return grayscale(x), np.asarray(d[b"labels"], dtype=np.int64)

    parts = [load(f"data_batch_{i}") for i in range(1, 6)]
    tx, ty = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return (tx, ty, *load("test_batch"))


def read_cifar_hf(path: str = "uoft-cs/cifar10") -> tuple:
    """CIFAR-10 through `datasets` (the first image-typed column, the label column) -> grayscale arrays."""
    from datasets import load_dataset

    out = []
    for split in ("train", "test"):
        ds = load_dataset(path, split=split)
        img = next(c for c in ds.column_names if c in ("img", "image"))
        lab = next(c for c in ds.column_names if c in ("label", "labels"))
        x = np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in ds[img]])
        out += [grayscale(x), np.asarray(ds[lab], dtype=np.int64)]
    return tuple(out)


def prepare_cifar(out_dir, python_dir=None, hf_path: str = "uoft-cs/cifar10", seed: int = 0,
                  num_train: int | None = None, num_val: int | None = None, num_test: int | None = None) -> dict:
    caps = check_caps(num_train, num_val, num_test)
    if python_dir is not None:
        from train.data import file_digest

        files = sorted(Path(python_dir).glob("*_batch*"))
        stamp = stamp_of("image-cifar-python-v1", file_digest(files), *caps_stamp(caps, seed))
    else:
        stamp = stamp_of("image-cifar-hf-v1", hf_path, *caps_stamp(caps, seed))
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    arrays = read_cifar_python(python_dir) if python_dir is not None else read_cifar_hf(hf_path)
    return write_images(out_dir, lra_split(*arrays), {"task": "image", "source": "cifar10", "stamp": stamp},
                        caps, seed)


def fixture(out_dir, n: int = 96, seed: int = 0, num_train: int | None = None, num_val: int | None = None,
            num_test: int | None = None) -> dict:
    """Tiny learnable images for tests and smoke runs: a bright bar, horizontal (0) or vertical (1)."""
    caps = check_caps(num_train, num_val, num_test)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, (n, SIZE, SIZE)).astype(np.uint8)
    y = np.arange(n) % 2
    for i in range(n):
        k = int(rng.integers(4, SIZE - 4))
        if y[i]:
            x[i, :, k] = 255
        else:
            x[i, k, :] = 255
    cut1, cut2 = int(0.8 * n), int(0.9 * n)
    return write_images(out_dir, {"train": (x[:cut1], y[:cut1]), "val": (x[cut1:cut2], y[cut1:cut2]),
                                  "test": (x[cut2:], y[cut2:])},
                        {"task": "image", "source": "fixture",
                         "stamp": stamp_of("image-fixture", n, seed, *caps_stamp(caps, seed))}, caps, seed)
