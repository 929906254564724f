"""ListOps (Nangia & Bowman, 2018) as LRA generates it, written in LRA's own file format.

The LRA generator (google-research/long-range-arena, lra_benchmarks/data/listops.py): operators MIN, MAX,
MED (integer median: int(np.median)), SM (sum mod 10) over digits 0-9; a node below depth max_depth is a
digit with probability 0.75 (VALUE_P = 0.25 is the operator probability), else an operator with
randint(2, max_args) children; at max_depth always a digit. A tree's length counts operators, digits
and closing brackets (2 per operator + 1 per digit); kept when min_length < length < max_length;
duplicates dropped; 96K / 2K / 2K. Output: `basic_{train,val,test}.tsv`, header `Source<TAB>Target`,
Source the nested-tuple print of the tree, e.g. `( ( ( [MAX 2 ) 9 ) ] )` for [MAX 2 9 ].

Generation here is parallel and deterministic: candidates come from chunk c's own generator seeded
with (seed, c), chunks are merged in order and deduplicated in that order, so the files depend on the
seed and sizes only, not on the number of workers. A candidate whose length passes max_length is
abandoned as soon as it does (it would be rejected anyway).

Tokens for the model: the parentheses carry no information beyond the operators and `]` (each
operator's span is already delimited by `[OP ... ]`), so they are dropped, which keeps sequences within
the 2,000 tokens LRA pads to. (LRA's own pipeline tokenized with tfds' Tokenizer, which also drops `(`,
`)`, `[` and `]`; we keep `]`, without which the expression is ambiguous.)
"""
from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np

from train.lra import SPLITS, check_caps, is_prepared, read_meta, stamp_of, write_meta

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUE_P = 0.25  # probability of an operator below max_depth (LRA's name for it)
# Model vocabulary: 0 padding, digits 1-10, operators, ], and a [CLS] id for CLS pooling.
VOCAB = ["<pad>", *"0123456789", *OPERATORS, END, "<cls>"]
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
PAD, CLS = 0, TOKEN_ID["<cls>"]
VOCAB_SIZE = len(VOCAB)
DEFAULTS = dict(num_train=96_000, num_val=2_000, num_test=2_000, max_depth=10, max_args=10,
                min_length=500, max_length=2000)


class _TooLong(Exception):
    pass


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: list) -> tuple[str, int]:
    """One (sub)tree -> (its string in LRA's format, its value). budget[0] counts the length left."""
    if depth < max_depth and rng.random() <= VALUE_P:
        budget[0] -= 2
        n = rng.randint(2, max_args)
        children = [_tree(rng, depth + 1, max_depth, max_args, budget) for _ in range(n)]
        op = rng.choice(OPERATORS)
        s = f"( {op} {children[0][0]} )"
        for c, _ in children[1:]:
            s = f"( {s} {c} )"
        return f"( {s} {END} )", apply(op, [v for _, v in children])
    budget[0] -= 1
    if budget[0] <= 0:
        raise _TooLong
    d = rng.randint(0, 9)
    return str(d), d


def apply(op: str, values: list[int]) -> int:
    if op == MIN:
        return min(values)
    if op == MAX:
        return max(values)
    if op == MED:
        return int(np.median(values))
    if op == SUM_MOD:
        return sum(values) % 10
    raise ValueError(f"unknown operator {op!r}")


def length_of(source: str) -> int:
    """LRA's length: operators + digits + closing brackets (the tokens without parentheses)."""
    return len(tokenize(source))


def _chunk(args) -> list[tuple[str, int]]:
    seed, chunk, want, max_depth, max_args, min_length, max_length = args
    rng = random.Random(f"{seed}-{chunk}")
    out = []
    while len(out) < want:
        budget = [max_length]
        try:
            s, v = _tree(rng, 1, max_depth, max_args, budget)
        except _TooLong:
            continue
        if min_length < max_length - budget[0] < max_length:
            out.append((s, v))
    return out


def generate(out_dir, num_train=96_000, num_val=2_000, num_test=2_000, seed=0, workers=None, max_depth=10,
             max_args=10, min_length=500, max_length=2000, chunk_size=500) -> dict:
    """Write out_dir/basic_{train,val,test}.tsv (LRA's format) and meta.json; a no-op when up to date."""
    out_dir = Path(out_dir)
    check_caps(num_train, num_val, num_test)
    sizes = {"train": num_train, "val": num_val, "test": num_test}
    settings = dict(seed=seed, max_depth=max_depth, max_args=max_args, min_length=min_length,
                    max_length=max_length, chunk_size=chunk_size, **{f"num_{k}": v for k, v in sizes.items()})
    stamp = stamp_of("listops-v1", sorted(settings.items()))
    if is_prepared(out_dir, stamp) and all((out_dir / f"basic_{s}.tsv").exists() for s in SPLITS):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return read_meta(out_dir)
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    total = sum(sizes.values())
    seen, rows = set(), []
    chunk = 0
    workers = workers or min(32, __import__("os").cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool, tqdm(total=total, desc="listops trees", unit="tree") as bar:
        while len(rows) < total:
            # over-generate a little: duplicates are rare at these lengths
            n_chunks = max(1, -(-int((total - len(rows)) * 1.02) // chunk_size))
            jobs = [(seed, c, chunk_size, max_depth, max_args, min_length, max_length)
                    for c in range(chunk, chunk + n_chunks)]
            chunk += n_chunks
            for got in pool.map(_chunk, jobs):
                for s, v in got:
                    if s not in seen and len(rows) < total:
                        seen.add(s)
                        rows.append((s, v))
                        bar.update(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = 0
    for split in SPLITS:
        write_tsv(out_dir / f"basic_{split}.tsv", rows[start:start + sizes[split]])
        start += sizes[split]
    return write_meta(out_dir, {"task": "listops", "source": "generated", "stamp": stamp, **settings,
                                "label_counts": np.bincount([v for _, v in rows], minlength=10).tolist()})


def write_tsv(path, rows):
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["Source", "Target"])
        w.writerows(rows)
    tmp.replace(path)


def read_tsv(path) -> tuple[list[str], np.ndarray]:
    """An LRA ListOps file (ours or the original lra_release/listops-1000/basic_*.tsv)."""
    with open(path, newline="") as f:
        r = csv.reader(f, delimiter="\t")
        header = next(r)
        if [h.strip() for h in header[:2]] != ["Source", "Target"]:
            raise ValueError(f"{path}: expected the header 'Source<TAB>Target', got {header}")
        sources, targets = [], []
        for row in r:
            sources.append(row[0])
            targets.append(int(row[1]))
    return sources, np.asarray(targets, dtype=np.int64)


_DROP = str.maketrans({"(": " ", ")": " "})


def tokenize(source: str) -> np.ndarray:
    """A Source string -> model token ids (parentheses dropped), uint8."""
    try:
        return np.fromiter((TOKEN_ID[t] for t in source.translate(_DROP).split()), dtype=np.uint8)
    except KeyError as e:
        raise ValueError(f"unknown ListOps token {e.args[0]!r}; the vocabulary is {VOCAB}") from None


def _tokenize_many(sources):
    return [tokenize(s) for s in sources]


def load_split(data_dir, split: str, workers: int | None = None) -> dict:
    """basic_{split}.tsv -> {tokens, offsets, labels}, tokenized once into data_dir/tokens/ (keyed by
    the file's content digest)."""
    from train.data import file_digest
    from train.lra import save_split

    path = Path(data_dir) / f"basic_{split}.tsv"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; generate it with: python scripts/prepare_lra.py "
                                f"listops --out {data_dir}   (or put LRA's listops-1000 files there)")
    digest = file_digest([path])
    cache = Path(data_dir) / "tokens" / f"{split}-{digest}.npz"
    if not cache.exists():
        sources, labels = read_tsv(path)
        chunks = [sources[i:i + 2000] for i in range(0, len(sources), 2000)]
        if len(chunks) > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(workers or min(16, len(chunks))) as pool:
                seqs = [s for part in pool.map(_tokenize_many, chunks) for s in part]
        else:
            seqs = _tokenize_many(sources)
        cache.parent.mkdir(parents=True, exist_ok=True)
        save_split(cache, labels, seqs)
    with np.load(cache) as z:
        return {k: z[k] for k in z.files}


def evaluate(tokens) -> int:
    """The value of a token sequence ([OP ... ] prefix form, ids or strings), by a stack machine."""
    stack: list = []
    for t in tokens:
        t = VOCAB[t] if not isinstance(t, str) else t
        if t in OPERATORS:
            stack.append([t])
        elif t == END:
            op, *vals = stack.pop()
            v = apply(op, vals)
            if not stack:
                return v
            stack[-1].append(v)
        elif t.isdigit():
            if not stack:
                return int(t)
            stack[-1].append(int(t))
    raise ValueError("unterminated expression")
