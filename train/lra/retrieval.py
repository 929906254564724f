"""LRA Retrieval: do two documents (4K bytes each, byte-level) belong together? Two-tower (dual encoder).

Original: AAN citation pairs (Radev et al., 2013) as LRA released them, lra_release/tsv_data/
new_aan_pairs.{train,eval,test}.tsv: no header, columns label, id1, id2, text1, text2 (LRA's
matching/input_pipeline.py reads them this way, label a float). `read_aan_tsv` loads them.

Stand-in (DATA.md): document-link prediction on the Linux kernel documentation (Debian linux-doc-6.1,
`Documentation/**/*.rst.gz`, GPL-2), the same question as AAN's (does paper A cite paper B?) on another
corpus: a positive pair is two documents one of which links to the other (`Documentation/x/y.rst`
mentions, Sphinx `:doc:` roles, relative or absolute, and `:ref:` roles to a label another document
defines, resolved to files that exist); each positive
(A, B) gets a negative (A, C) with C drawn from the documents linked to A in neither direction, so both
classes share their first documents and are exactly balanced. The two documents' order is random per pair.
The translations/ tree (other languages' copies of the English files) is left out. That link graph has
only ~1.5K edges (3.1K pairs), too few to train a 4-layer model, so the default pairs are coarser:
same section of the documentation (networking/, filesystems/, ...) or not, balanced, with the 2.8K
documents split 80/10/10 before pairing (64K / 4K / 4K pairs; no test document is seen in training).
`pairs="links"` gives the link task (pairs split 80/10/10, documents recurring across splits, as in AAN).
"""
from __future__ import annotations

import gzip
import posixpath
import re
from pathlib import Path

import numpy as np

from train.lra import (SPLITS, cap_indices, caps_stamp, check_caps, is_prepared, read_meta, save_split, split_indices,
                       stamp_of, to_bytes, write_meta)

MAX_BYTES = 4096
_ABS = re.compile(r"Documentation/([A-Za-z0-9_./+-]+?)\.rst")
_DOC = re.compile(r":doc:`(?:[^`<]*<)?([^`>]+)>?`")
_REF = re.compile(r":ref:`(?:[^`<]*<)?([^`>]+)>?`")
_LABEL = re.compile(r"^\.\. _([^:\n]+):\s*$", re.M)


def linux_doc_corpus(root) -> dict[str, str]:
    """{name: text} for every Documentation/**/*.rst(.gz) under root, name = path below Documentation/
    without the suffix (what links name)."""
    hits = sorted(Path(root).glob("**/Documentation"))
    if not hits:
        raise FileNotFoundError(f"no Documentation/ folder under {root}")
    base = hits[0]
    docs = {}
    for p in sorted(base.rglob("*.rst*")):
        rel = p.relative_to(base).as_posix()
        if rel.startswith("translations/") or not (rel.endswith(".rst") or rel.endswith(".rst.gz")):
            continue
        raw = gzip.open(p, "rb").read() if rel.endswith(".gz") else p.read_bytes()
        docs[rel[: rel.rindex(".rst")]] = raw.decode("utf-8", errors="replace")
    return docs


def labels_of(docs: dict[str, str]) -> dict[str, str]:
    """{Sphinx label: the document that defines it} (`.. _label:` lines; :ref: roles point at them)."""
    return {lab.strip().lower(): n for n, t in docs.items() for lab in _LABEL.findall(t)}


def links(name: str, text: str, names: set, labels: dict | None = None) -> set:
    """Documents `name` links to (absolute Documentation/ paths, :doc: roles, :ref: roles to labels
    that another document defines), self excluded."""
    out = set(m for m in _ABS.findall(text))
    for label in _REF.findall(text) if labels else ():
        if label.strip().lower() in labels:
            out.add(labels[label.strip().lower()])
    for target in _DOC.findall(text):
        target = target.strip()
        if target.startswith("/"):
            out.add(target.lstrip("/"))
        else:
            out.add(posixpath.normpath(posixpath.join(posixpath.dirname(name), target)))
    return {t for t in out if t in names and t != name}


def link_pairs(docs: dict[str, str], seed: int = 0) -> tuple[list, list, list]:
    """(first names, second names, labels): every linked pair once, plus one unlinked pair per linked one."""
    names = sorted(docs)
    name_set = set(names)
    linked = {n: set() for n in names}
    labels = labels_of(docs)
    for n in names:
        for t in links(n, docs[n], name_set, labels):
            linked[n].add(t)
            linked[t].add(n)
    pos = sorted({tuple(sorted((a, b))) for a in names for b in linked[a]})
    rng = np.random.default_rng(seed)
    a_s, b_s, ys = [], [], []
    for a, b in pos:
        if rng.integers(2):
            a, b = b, a
        # a negative partner for a: linked to a in neither direction (none: the pair is skipped)
        cands = [c for c in names if c != a and c not in linked[a]]
        if not cands:
            continue
        c = cands[int(rng.integers(len(cands)))]
        for (x, y), label in (((a, b), 1), ((a, c), 0)):
            if rng.integers(2):
                x, y = y, x
            a_s.append(x)
            b_s.append(y)
            ys.append(label)
    return a_s, b_s, ys


def section(name: str) -> str:
    """A document's section: its first folder below Documentation/ (networking, filesystems, ...)."""
    return name.split("/", 1)[0] if "/" in name else "."


def section_pairs(names: list[str], n: int, rng) -> tuple[list, list, list]:
    """n pairs of distinct documents, half from one section (label 1), half from two (label 0)."""
    by = {}
    for x in names:
        by.setdefault(section(x), []).append(x)
    multi = [k for k, v in by.items() if len(v) > 1]
    weights = np.array([len(by[k]) ** 2 for k in multi], float)  # a pair's section ~ its share of pairs
    a_s, b_s, ys = [], [], []
    for i in range(n):
        if i % 2 == 0:
            docs = by[multi[rng.choice(len(multi), p=weights / weights.sum())]]
            x, y = rng.choice(len(docs), 2, replace=False)
            a, b = docs[x], docs[y]
        else:
            while True:
                a, b = (names[int(j)] for j in rng.choice(len(names), 2, replace=False))
                if section(a) != section(b):
                    break
        a_s.append(a)
        b_s.append(b)
        ys.append(1 - i % 2)
    return a_s, b_s, ys


def prepare_linux_doc(root, out_dir, seed: int = 0, max_bytes: int = MAX_BYTES, pairs: str = "section",
                      num_train: int = 64_000, num_val: int = 4_000, num_test: int = 4_000) -> dict:
    """pairs="section" (default): same section of the documentation or not, documents split 80/10/10
    before pairing, so no test document was seen in training (the link graph of "links" has only ~1.5K
    edges: too few to train on); pairs="links": linked or not (link_pairs), pairs split 80/10/10.
    num_*: pairs drawn per split ("section"); the most pairs kept per split ("links")."""
    from train.data import file_digest

    caps = check_caps(num_train, num_val, num_test)

    files = sorted(p for p in Path(root).glob("**/Documentation/**/*.rst*") if p.is_file())
    stamp = stamp_of("retrieval-linux-doc-v2", file_digest(files) if files else "none", seed, max_bytes, pairs,
                     num_train, num_val, num_test)
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    docs = linux_doc_corpus(root)
    names = sorted(docs)
    table = [to_bytes(docs[n], max_bytes) for n in names]
    number = {n: i for i, n in enumerate(names)}
    meta = {"task": "retrieval", "source": "linux-doc", "stand_in_for": "AAN", "stamp": stamp, "seed": seed,
            "documents": len(docs), "pairs": pairs}
    if pairs == "links":
        a, b, y = link_pairs(docs, seed)
        return write_doc_pairs(out_dir, table, [number[n] for n in a], [number[n] for n in b], y,
                               cap_indices(split_indices(len(y), seed), caps, seed), max_bytes, meta)
    if pairs != "section":
        raise ValueError(f"unknown pairs {pairs!r}; choose 'section' or 'links'")
    doc_split = split_indices(len(names), seed)
    rng = np.random.default_rng([seed, 1])
    a, b, y, idx, start = [], [], [], {}, 0
    for split, n in (("train", num_train), ("val", num_val), ("test", num_test)):
        sa, sb, sy = section_pairs([names[i] for i in doc_split[split]], n, rng)
        a, b, y = a + sa, b + sb, y + sy
        idx[split] = np.arange(start, start + n)
        start += n
    return write_doc_pairs(out_dir, table, [number[n] for n in a], [number[n] for n in b], y, idx, max_bytes, meta)


def read_aan_tsv(path, max_bytes: int = MAX_BYTES) -> tuple[list, list, np.ndarray]:
    """One LRA AAN file -> (first texts, second texts, labels), texts as byte arrays."""
    t1, t2, ys = [], [], []
    with open(path, "rb") as f:
        for line in f:
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            cols = line.split(b"\t", 4)
            if len(cols) != 5:
                raise ValueError(f"{path}: expected 5 tab-separated columns (label, id1, id2, text1, text2), "
                                 f"got {len(cols)}")
            ys.append(int(float(cols[0])))
            t1.append(to_bytes(cols[3], max_bytes))
            t2.append(to_bytes(cols[4], max_bytes))
    return t1, t2, np.asarray(ys, dtype=np.int64)


AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


def prepare_aan(tsv_dir, out_dir, max_bytes: int = MAX_BYTES, seed: int = 0, num_train: int | None = None,
                num_val: int | None = None, num_test: int | None = None) -> dict:
    """num_*: keep at most that many pairs of a split (a subset chosen by `seed`)."""
    from train.data import file_digest

    caps = check_caps(num_train, num_val, num_test)

    paths = {s: Path(tsv_dir) / f for s, f in AAN_FILES.items()}
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"missing AAN files {missing} (LRA release: lra_release/tsv_data/)")
    stamp = stamp_of("retrieval-aan-v2", file_digest(paths.values()), max_bytes, *caps_stamp(caps, seed))
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    meta = {"task": "retrieval", "source": "aan", "stamp": stamp, "max_bytes": max_bytes,
            **({"caps": caps, "seed": seed} if caps else {})}
    for split, p in paths.items():
        t1, t2, y = read_aan_tsv(p, max_bytes)
        keep = cap_indices({split: np.arange(len(y))}, caps, seed)[split] if split in caps else None
        if keep is not None:
            t1, t2, y = [t1[k] for k in keep], [t2[k] for k in keep], y[keep]
        save_pair_split(Path(out_dir) / f"{split}.npz", [*t1, *t2], range(len(y)), range(len(y), 2 * len(y)), y)
        meta[f"{split}_examples"] = len(y)
        meta[f"{split}_majority"] = float(np.bincount(y, minlength=2).max() / max(1, len(y)))
    return write_meta(out_dir, meta)


def write_pairs(out_dir, first, second, labels, idx: dict, max_bytes: int, meta: dict) -> dict:
    """Pairs given as their two texts (byte arrays): each text its own row of the document table."""
    n = len(labels)
    return write_doc_pairs(out_dir, [*first, *second], range(n), range(n, 2 * n), labels, idx, max_bytes, meta)


def write_doc_pairs(out_dir, docs: list, first, second, labels, idx: dict, max_bytes: int, meta: dict) -> dict:
    """Pairs given as indices into one document table. Each split's .npz holds the documents its pairs use,
    once (`tokens`, `offsets`), and the pairs as rows of that table (`doc_1`, `doc_2`): the linux-doc
    stand-in's 72K pairs of 2.8K documents take ~12 MB this way instead of ~0.5 GB of copied text, small
    enough to carry to a machine without the source package."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    labels = np.asarray(labels, dtype=np.int64)
    first, second = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
    for split in SPLITS:
        i = np.asarray(idx[split], dtype=np.int64)
        meta[f"{split}_documents"] = save_pair_split(Path(out_dir) / f"{split}.npz", docs, first[i], second[i],
                                                     labels[i])
        meta[f"{split}_examples"] = int(len(i))
        meta[f"{split}_majority"] = float(np.bincount(labels[i], minlength=2).max() / max(1, len(i)))
    meta["max_bytes"] = max_bytes
    return write_meta(out_dir, meta)


def save_pair_split(path, docs: list, first, second, labels) -> int:
    """One split of pairs (docs[first[j]], docs[second[j]]) with labels[j]: the documents it uses once each in
    the flat table, the pairs as their rows (`doc_1`, `doc_2`). Returns how many documents it keeps."""
    first, second = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
    used, rows = np.unique(np.concatenate([first, second]), return_inverse=True)
    rows = rows.astype(np.int32)
    save_split(path, labels, [docs[k] for k in used], doc_1=rows[:len(first)], doc_2=rows[len(first):])
    return int(len(used))


def fixture(out_dir, n: int = 96, seed: int = 0, max_bytes: int = 512, num_train: int | None = None,
            num_val: int | None = None, num_test: int | None = None) -> dict:
    """Tiny learnable pairs for tests and smoke runs: same topic word in both documents or not."""
    caps = check_caps(num_train, num_val, num_test)
    rng = np.random.default_rng(seed)
    topics = ["memory", "network", "sound", "video", "power", "usb"]
    filler = ["the", "driver", "uses", "a", "buffer", "for", "each", "device", "and", "then"]
    first, second, ys = [], [], []
    for i in range(n):
        y = i % 2
        t1 = int(rng.integers(len(topics)))
        t2 = t1 if y else int((t1 + rng.integers(1, len(topics))) % len(topics))
        for t, out in ((t1, first), (t2, second)):
            w = list(rng.choice(filler, int(rng.integers(10, 40)))) + [topics[t]] * 3
            rng.shuffle(w)
            out.append(to_bytes(" ".join(w), max_bytes))
        ys.append(y)
    return write_pairs(out_dir, first, second, ys, cap_indices(split_indices(n, seed), caps, seed), max_bytes,
                       {"task": "retrieval", "source": "fixture",
                        "stamp": stamp_of("retrieval-fixture-v2", n, seed, *caps_stamp(caps, seed))})
