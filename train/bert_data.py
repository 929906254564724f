"""BERT pretraining data: documents -> WordPiece sentences -> MLPerf-style examples -> numpy arrays, and the
datamodules that batch them (prepared arrays, or MLPerf's original HDF5 records) for task=mlm.

Examples follow google-research/bert's create_pretraining_data.py as the MLPerf BERT reference runs it
(max_seq_length 512, max_predictions_per_seq 76, masked_lm_prob 0.15, short_seq_prob 0.1):
each document's sentences are gathered into chunks up to a target length (the full 509 content tokens, or
with probability short_seq_prob a random shorter target: short sequences keep their natural length, and a
document's end ends a chunk, so the padding is real); a chunk splits at a random sentence into A and B,
with probability 0.5 (always for one-sentence chunks) B is replaced by sentences of another random
document (nsp label 1); the pair is trimmed to max_seq_len - 3 by dropping tokens from the front or back
of the longer segment (counted); [CLS] A [SEP] B [SEP] with token types 0/1; then 15% of the tokens
(at least 1, at most max_predictions) are picked among the non-special ones: 80% -> [MASK], 10% a random
vocabulary id, 10% unchanged. Masking is static and repeated dupe_factor times with different masks.

A seeded fraction of documents is held out; the evaluation set (a fixed number of examples, MLPerf uses
10,000) is drawn from them only, with next-sentence negatives from held-out documents only.

Prepared layout (one folder per source and max_seq_len, `train/` and `val/` in it, read with mmap):
    input_ids.npy uint16 (all tokens, concatenated)    offsets.npy int64 (n + 1)
    type0_len.npy uint16 (len of [CLS] A [SEP])        nsp_labels.npy uint8
    mlm_positions.npy, mlm_ids.npy uint16 (n, P)       mlm_count.npy uint8
and meta.json (stamp of the inputs' contents + settings, counts, truncation, padding). Preparation is
parallel (multiprocessing: tokenizing and example creation in fixed-size document chunks, so the result
does not depend on the number of processes), cached by the stamp and idempotent.

Batches (dicts for train.task.MLMTask): input_ids, attention_mask, token_type_ids (B, W), mlm_positions,
mlm_labels (B, P; -100 in unused slots), nsp_labels (B,). W is max_seq_len by default (pad_to_longest
false): static shapes (no recompiles under torch.compile), and a padded baseline sees MLPerf's own
512-wide records; our models unpad once per forward, so the width costs them only the embedding gather.
pad_to_longest: true pads to the batch's longest sequence instead.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from train.data import REPO, ResumableDataModule, file_digest, own_process_group

VOCAB = REPO / "data" / "bert" / "vocab.txt"
EMBEDDED = REPO / "data" / "embedded" / "corpus.jsonl.gz"
CACHE = REPO / "data" / "cache" / "bert"
IGNORE = -100
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103  # bert-base-uncased ids (checked against the vocab file)
FORMAT_VERSION = 1  # bump when the example algorithm or the layout changes: it enters the stamp
PREPARE_CMD = {  # data=bert (embedded) and data=wikipedia also prepare on first use
    "embedded": "python scripts/prepare_bert.py",
    "corpus": "python scripts/prepare_bert.py --source corpus",
    "wikipedia": "python scripts/prepare_bert.py --source wikipedia",
}
ARRAYS = ("input_ids", "offsets", "type0_len", "nsp_labels", "mlm_positions", "mlm_ids", "mlm_count")


# ---- tokenizer -----------------------------------------------------------------------------------
_TOKENIZER: dict = {}


def check_vocab(vocab=VOCAB) -> Path:
    vocab = Path(vocab)
    if not vocab.exists():
        raise FileNotFoundError(f"WordPiece vocabulary {vocab} is missing; it is committed to the repo "
                                "(git checkout data/bert/vocab.txt), see data/bert/README.md for its source")
    return vocab


def wordpiece(vocab=VOCAB):
    """bert-base-uncased's tokenizer (HF tokenizers, lowercase, accents stripped) from the committed vocab."""
    key = str(vocab)
    if key not in _TOKENIZER:
        from tokenizers import BertWordPieceTokenizer

        tok = BertWordPieceTokenizer(str(check_vocab(vocab)), lowercase=True)
        ids = [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
        if ids != [PAD, UNK, CLS, SEP, MASK]:
            raise ValueError(f"{vocab} is not the bert-base-uncased vocabulary: special ids {ids}")
        _TOKENIZER[key] = tok
    return _TOKENIZER[key]


def split_sentences(text: str) -> list[str]:
    """Paragraphs (blank lines) -> sentences: a split after . ! ? (and closing quotes or brackets) that is
    followed by whitespace and an upper-case letter, digit, quote or bracket. Hard-wrapped lines are joined.
    (MLPerf used NLTK's punkt; it is not available offline, and this is close on edited prose.)"""
    import re

    out = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if para:
            out += [s for s in re.split(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[A-Z0-9])", para) if s]
    return out


# ---- example creation ----------------------------------------------------------------------------
def max_predictions_for(seq_len: int, masked_lm_prob: float = 0.15) -> int:
    """Prediction slots per sequence: floor(0.15 x seq_len), which gives MLPerf's 76 at 512."""
    return max(1, int(masked_lm_prob * seq_len))


@dataclass(frozen=True)
class Settings:
    """What the prepared examples depend on besides the text (all of it enters the cache stamp)."""

    max_seq_len: int = 512
    max_predictions: int = 76        # MLPerf: 76 at 512 (15% of 512 = 76.8)
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1      # fraction of chunks with a random shorter target length
    dupe_factor: int = 5             # masks per document pass (MLPerf: 10); the train split repeats this often
    val_fraction: float = 0.05       # documents held out for the evaluation set
    eval_samples: int = 10_000       # at most this many evaluation examples (MLPerf: 10,000)
    seed: int = 12345                # MLPerf's random_seed
    # At most this many training examples, a seeded random subset (None: all). A capped folder keeps the
    # length mix of the full one, small enough to carry to another machine for a throughput benchmark.
    max_train_examples: int | None = None

    def check(self):
        if self.max_seq_len < 8:
            raise ValueError(f"max_seq_len {self.max_seq_len} is too short for [CLS] A [SEP] B [SEP]")
        if self.max_seq_len > 65535 or not 1 <= self.max_predictions <= 255:
            raise ValueError("max_seq_len must fit uint16 and max_predictions uint8")
        if self.max_train_examples is not None and self.max_train_examples < 1:
            raise ValueError(f"max_train_examples must be at least 1, got {self.max_train_examples}")


def _examples_from_document(d: int, docs, rng, s: Settings, vocab_size: int, out: dict):
    """create_instances_from_document of google-research/bert, on (sentences of token arrays) documents."""
    document = docs[d]
    max_tokens = s.max_seq_len - 3
    target = max_tokens if rng.random() >= s.short_seq_prob else int(rng.integers(2, max_tokens + 1))
    chunk, length, i = [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = 1 if len(chunk) < 2 else int(rng.integers(1, len(chunk)))
            a = np.concatenate(chunk[:a_end])
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random, want = 1, max(1, target - len(a))
                other = d
                for _ in range(10):
                    other = int(rng.integers(len(docs)))
                    if other != d:
                        break
                if other == d:  # a one-document split: no negative to draw, keep the real continuation
                    is_random, b = 0, (np.concatenate(chunk[a_end:]) if a_end < len(chunk) else np.zeros(0, np.int64))
                else:
                    start, b_parts, got = int(rng.integers(len(docs[other]))), [], 0
                    for sent in docs[other][start:]:
                        b_parts.append(sent)
                        got += len(sent)
                        if got >= want:
                            break
                    b = np.concatenate(b_parts)
                    i -= len(chunk) - a_end  # the unused sentences start the next chunk
            else:
                is_random, b = 0, np.concatenate(chunk[a_end:])
            a, b = _truncate_pair(a, b, max_tokens, rng, out)
            if len(a) and len(b):
                _append_example(a, b, is_random, rng, s, vocab_size, out)
            else:
                out["dropped"] += 1
            chunk, length = [], 0
        i += 1


def _truncate_pair(a, b, max_tokens, rng, out):
    """Trim the longer segment (from its front or back at random, token by token, as the reference does)
    until the pair fits; counts the trimmed tokens."""
    over = len(a) + len(b) - max_tokens
    if over <= 0:
        return a, b
    out["truncated_examples"] += 1
    out["truncated_tokens"] += over
    cut = {"a": [0, 0], "b": [0, 0]}  # tokens removed from the front, the back
    la, lb = len(a), len(b)
    for front in rng.random(over) < 0.5:
        side = "a" if la > lb else "b"
        cut[side][0 if front else 1] += 1
        la, lb = (la - 1, lb) if side == "a" else (la, lb - 1)
    return a[cut["a"][0]:len(a) - cut["a"][1]], b[cut["b"][0]:len(b) - cut["b"][1]]


def _append_example(a, b, is_random, rng, s: Settings, vocab_size: int, out: dict):
    ids = np.concatenate([[CLS], a, [SEP], b, [SEP]]).astype(np.int64)
    candidates = np.concatenate([np.arange(1, len(a) + 1), np.arange(len(a) + 2, len(ids) - 1)])
    k = min(s.max_predictions, max(1, int(round(len(ids) * s.masked_lm_prob))), len(candidates))
    pos = np.sort(rng.permutation(candidates)[:k])
    labels = ids[pos].copy()
    r = rng.random(k)
    ids[pos[r < 0.8]] = MASK
    swap = r >= 0.9  # the reference draws the random word from the whole vocabulary
    ids[pos[swap]] = rng.integers(0, vocab_size, int(swap.sum()))
    out["ids"].append(ids)
    out["type0_len"].append(len(a) + 2)
    out["nsp"].append(is_random)
    out["pos"].append(pos)
    out["labels"].append(labels)


def _new_out():
    return {"ids": [], "type0_len": [], "nsp": [], "pos": [], "labels": [], "truncated_examples": 0,
            "truncated_tokens": 0, "dropped": 0}


# ---- multiprocessing workers (state inherited or passed through the pool initializer) -----------------
_W: dict = {}


def _init_worker(state):
    _W.update(state)


def _tokenize_chunk(texts):
    tok = wordpiece(_W["vocab"])
    docs = []
    for text in texts:
        sents = split_sentences(text)
        enc = tok.encode_batch(sents, add_special_tokens=False) if sents else []
        doc = [np.asarray(e.ids, np.uint16) for e in enc if e.ids]
        if doc:
            docs.append(doc)
    return docs


def _examples_chunk(task):
    split, dupe, start = task
    docs, s = _W["docs"][split], _W["settings"]
    rng = np.random.default_rng([s.seed, {"train": 0, "val": 1}[split], dupe, start])
    out = _new_out()
    for d in range(start, min(start + _W["chunk"], len(docs))):
        _examples_from_document(d, docs, rng, s, _W["vocab_size"], out)
    return _pack(out, s.max_predictions)


def _pack(out, P):
    n = len(out["ids"])
    pos = np.zeros((n, P), np.uint16)
    lab = np.zeros((n, P), np.uint16)
    for j, (p, l) in enumerate(zip(out["pos"], out["labels"])):
        pos[j, :len(p)], lab[j, :len(l)] = p, l
    lens = np.fromiter((len(x) for x in out["ids"]), np.int64, n)
    return {"input_ids": np.concatenate(out["ids"]).astype(np.uint16) if n else np.zeros(0, np.uint16),
            "lengths": lens, "type0_len": np.asarray(out["type0_len"], np.uint16),
            "nsp_labels": np.asarray(out["nsp"], np.uint8), "mlm_positions": pos, "mlm_ids": lab,
            "mlm_count": np.fromiter((len(p) for p in out["pos"]), np.uint8, n),
            "stats": {k: out[k] for k in ("truncated_examples", "truncated_tokens", "dropped")}}


def _pool(num_proc, state):
    import multiprocessing as mp

    # fork shares the documents without pickling; the parent never runs the tokenizer, so no
    # tokenizers thread pool is forked
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    return ctx.Pool(num_proc, initializer=_init_worker, initargs=(state,))


def _imap(fn, tasks, num_proc, state, desc):
    from tqdm.auto import tqdm

    if num_proc <= 1:
        _init_worker(state)
        return [fn(t) for t in tqdm(tasks, desc=desc)]
    with _pool(num_proc, state) as pool:
        return list(tqdm(pool.imap(fn, tasks), total=len(tasks), desc=desc))


# ---- preparation ---------------------------------------------------------------------------------
def make_stamp(inputs: str, settings: Settings, vocab=VOCAB) -> str:
    """Inputs' content digest + vocabulary digest + settings + format version; never a path."""
    import hashlib

    fields = asdict(settings)
    if fields["max_train_examples"] is None:  # uncapped folders keep the stamps they had before the cap existed
        del fields["max_train_examples"]
    key = json.dumps([inputs, file_digest([check_vocab(vocab)]), fields, FORMAT_VERSION], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def is_prepared(out_dir, stamp: str) -> bool:
    meta = Path(out_dir) / "meta.json"
    return meta.exists() and json.loads(meta.read_text()).get("stamp") == stamp


def prepare_examples(texts, out_dir, settings: Settings = Settings(), *, stamp: str, num_proc: int | None = None,
                     vocab=VOCAB, vocab_size: int = 30522, chunk_docs: int = 64, source: str = "") -> dict:
    """texts (a sequence of document strings, or an iterable of such lists) -> out_dir/{train,val}/*.npy
    + meta.json. Idempotent: a folder with the same stamp is left as it is."""
    from tqdm.auto import tqdm

    settings.check()
    out_dir = Path(out_dir)
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return json.loads((out_dir / "meta.json").read_text())
    if (out_dir / "meta.json").exists():  # a rebuild is not silent: runs that read the old examples no longer compare
        old = json.loads((out_dir / "meta.json").read_text())
        if source and old.get("source") and old["source"] != source:
            # another source's folder (e.g. data_dir pointed at a corpus folder with the embedded config):
            # rebuilding would replace examples that took a fetch and minutes to make
            raise ValueError(f"{out_dir} holds examples prepared from source {old['source']!r}, not {source!r}; "
                             f"read it with data.source={old['source']} (bench_bert.py: --data-source "
                             f"{old['source']}) or give another data_dir")
        changed = {k: (v, asdict(settings).get(k)) for k, v in old.get("settings", {}).items()
                   if asdict(settings).get(k) != v}
        print(f"{out_dir}: rebuilding, its examples (stamp {old.get('stamp')}) were made from other inputs or "
              f"settings{' ' + str(changed) if changed else ''}")
    num_proc = max(1, num_proc or (os.cpu_count() or 1))
    texts = list(texts)
    batches = [texts[i:i + 16] for i in range(0, len(texts), 16)]  # small: even work for the processes
    state = {"vocab": str(check_vocab(vocab))}
    docs = [d for part in _imap(_tokenize_chunk, batches, num_proc, state, "tokenizing") for d in part]
    if len(docs) < 2:
        raise ValueError(f"only {len(docs)} non-empty documents: next-sentence examples need at least 2")
    is_val = np.zeros(len(docs), bool)
    n_val = max(1, int(round(settings.val_fraction * len(docs)))) if settings.val_fraction > 0 else 0
    is_val[np.random.default_rng([settings.seed, 7]).permutation(len(docs))[:n_val]] = True
    split_docs = {"train": [d for d, v in zip(docs, is_val) if not v], "val": [d for d, v in zip(docs, is_val) if v]}
    state.update(docs=split_docs, settings=settings, chunk=chunk_docs, vocab_size=vocab_size)
    tasks = [("train", dupe, start) for dupe in range(settings.dupe_factor)
             for start in range(0, len(split_docs["train"]), chunk_docs)]
    tasks += [("val", 0, start) for start in range(0, len(split_docs["val"]), chunk_docs)]
    parts = _imap(_examples_chunk, tasks, num_proc, state, "creating examples")
    meta = {"stamp": stamp, "source": source, "settings": asdict(settings), "format_version": FORMAT_VERSION,
            "documents": len(docs), "val_documents": int(is_val.sum()),
            "sentences": sum(map(len, docs)), "wordpiece_tokens": int(sum(len(s) for d in docs for s in d))}
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for split in ("train", "val"):
        mine = [p for t, p in zip(tasks, parts) if t[0] == split]
        merged = {k: np.concatenate([p[k] for p in mine]) for k in mine[0] if k != "stats"} if mine else None
        if merged is None or len(merged["lengths"]) == 0:
            raise ValueError(f"the {split} split has no examples ({len(split_docs[split])} documents)")
        stats = {k: sum(p["stats"][k] for p in mine) for k in mine[0]["stats"]}
        cap = settings.eval_samples if split == "val" else settings.max_train_examples
        if cap is not None and len(merged["lengths"]) > cap:
            keep = np.sort(np.random.default_rng([settings.seed, 11 if split == "val" else 13])
                           .permutation(len(merged["lengths"]))[:cap])
            stats["examples_before_cap"] = len(merged["lengths"])
            merged = _select(merged, keep)
        offsets = np.concatenate([[0], np.cumsum(merged.pop("lengths"))]).astype(np.int64)
        (tmp / split).mkdir(parents=True, exist_ok=True)
        for name, arr in dict(merged, offsets=offsets).items():
            np.save(tmp / split / f"{name}.npy", arr)
        n, lengths = len(offsets) - 1, np.diff(offsets)
        meta[split] = {"examples": n, "tokens": int(offsets[-1]), "mean_length": float(lengths.mean()),
                       "padding_fraction": float(1 - lengths.mean() / settings.max_seq_len),
                       "full_length_fraction": float((lengths == settings.max_seq_len).mean()),
                       "nsp_random_fraction": float(merged["nsp_labels"].mean()),
                       "mean_predictions": float(merged["mlm_count"].mean()), **stats}
        if stats["truncated_examples"] or stats["dropped"]:
            print(f"{split}: trimmed {stats['truncated_tokens']} tokens from {stats['truncated_examples']} "
                  f"sentence pairs longer than {settings.max_seq_len - 3} content tokens; "
                  f"{stats['dropped']} pairs dropped (a segment empty after trimming)")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out_dir)
    tqdm.write(f"{out_dir}: {meta['train']['examples']} train / {meta['val']['examples']} eval examples, "
               f"padding fraction at width {settings.max_seq_len}: {meta['train']['padding_fraction']:.3f}")
    return meta


def _select(merged, keep):
    offsets = np.concatenate([[0], np.cumsum(merged["lengths"])])
    ids = np.concatenate([merged["input_ids"][offsets[i]:offsets[i + 1]] for i in keep])
    return {k: (ids if k == "input_ids" else v[keep]) for k, v in merged.items()}


def read_texts(source: str, hf_path: str | None = None, hf_name: str | None = None, hf_data_files=None,
               text_file=None):
    """(documents, stamp input) of a source: the committed corpus, a JSONL text file (the registry corpus of
    scripts/prepare_corpus.py), or a HF datasets dataset (Wikipedia by default; any local json/parquet
    stands in with hf_path="json"/"parquet" and hf_data_files)."""
    if source in ("embedded", "corpus"):
        import gzip

        path = Path(text_file or EMBEDDED)
        if not path.exists():
            how = ("it is committed to the repo (git checkout data/embedded/corpus.jsonl.gz)" if source == "embedded"
                   else f"fetch it with: {PREPARE_CMD[source]}")
            raise FileNotFoundError(f"text file {path} is missing; {how}")
        with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as f:
            texts = [json.loads(line)["text"] for line in f if line.strip()]
        return texts, f"{source}|{file_digest([path])}"
    if source == "wikipedia":
        import sys

        from datasets import load_dataset

        sys.path.insert(0, str(REPO / "scripts"))
        from prepare_corpus import source_key  # what a load_dataset call read: local file contents or hub revision

        kwargs = {"data_files": hf_data_files} if hf_data_files else {}
        path = hf_path or "wikimedia/wikipedia"
        name = hf_name if hf_name or hf_path else "20231101.en"
        ds = load_dataset(path, name, split="train", **kwargs) if name else load_dataset(path, split="train", **kwargs)
        if "text" not in ds.column_names:
            raise ValueError(f"dataset {path} has no 'text' column (columns: {ds.column_names})")
        return ds["text"], f"wikipedia|{name}|{source_key(path, kwargs, ds)}"
    raise ValueError(f"unknown source {source!r}; choose embedded, corpus or wikipedia")


def prepare(source: str, out_dir, settings: Settings = Settings(), num_proc: int | None = None, **read_kwargs) -> dict:
    texts, inputs = read_texts(source, **read_kwargs)
    return prepare_examples(texts, out_dir, settings, stamp=make_stamp(inputs, settings), num_proc=num_proc,
                            source=source)


# ---- reading -------------------------------------------------------------------------------------
class PreparedExamples(torch.utils.data.Dataset):
    """One split of a prepared folder; example i -> dict of unpadded numpy arrays. Checks the arrays
    against each other on open, so a damaged folder fails with what is wrong and how to rebuild it."""

    def __init__(self, folder, split: str, how: str = PREPARE_CMD["embedded"], vocab_size: int | None = None):
        self.folder = Path(folder) / split
        meta_path = Path(folder) / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"no prepared BERT data in {folder} (meta.json missing); prepare it with: {how}")
        self.meta = json.loads(meta_path.read_text())
        a = {}
        for name in ARRAYS:
            p = self.folder / f"{name}.npy"
            if not p.exists():
                raise FileNotFoundError(f"{p} is missing; prepare the data again with: {how}")
            try:
                a[name] = np.load(p, mmap_mode="r")
            except ValueError as e:
                raise ValueError(f"corrupted record file {p} ({e}); prepare the data again with: {how}") from e
        n, off = len(a["offsets"]) - 1, a["offsets"]
        lengths = np.diff(off)
        problems = []
        if n < 1 or off[0] != 0 or off[-1] != len(a["input_ids"]) or (lengths < 5).any():
            problems.append("offsets do not partition input_ids")
        if any(len(a[k]) != n for k in ARRAYS if k not in ("input_ids", "offsets")):
            problems.append("array lengths differ")
        if not problems:
            if ((a["type0_len"] < 2) | (a["type0_len"] >= lengths)).any():
                problems.append("segment lengths out of range")
            P = a["mlm_positions"].shape[1]
            if (a["mlm_count"] > P).any() or ((a["mlm_positions"] >= lengths[:, None])
                                               & (np.arange(P)[None] < a["mlm_count"][:, None])).any():
                problems.append("masked positions outside their sequence")
            if vocab_size and len(a["input_ids"]) and int(a["input_ids"].max()) >= vocab_size:
                problems.append(f"token ids >= vocab_size {vocab_size}")
        if problems:
            raise ValueError(f"corrupted prepared data in {self.folder}: {'; '.join(problems)}; "
                             f"prepare it again with: {how}")
        self.a, self.lengths, self.n = a, lengths, n
        self.max_seq_len = int(self.meta["settings"]["max_seq_len"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        a = self.a
        ids = np.asarray(a["input_ids"][a["offsets"][i]:a["offsets"][i + 1]], np.int64)
        types = (np.arange(len(ids)) >= int(a["type0_len"][i])).astype(np.int64)
        k = int(a["mlm_count"][i])
        return {"input_ids": ids, "token_type_ids": types, "mlm_positions": a["mlm_positions"][i, :k].astype(np.int64),
                "mlm_labels": a["mlm_ids"][i, :k].astype(np.int64), "nsp_labels": np.int64(a["nsp_labels"][i])}


MLPERF_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
               "next_sentence_labels")


class MLPerfHDF5Examples(torch.utils.data.Dataset):
    """MLPerf BERT's HDF5 records (NVIDIA's reference layout: one file holds arrays input_ids, input_mask,
    segment_ids (n, 512), masked_lm_positions, masked_lm_ids (n, 76), next_sentence_labels (n,)); files
    are a list, a folder (every *.hdf5 / *.h5 in it, sorted) or a glob. Unused prediction slots hold
    position 0 ([CLS] is never masked). Example i -> the same dict as PreparedExamples."""

    def __init__(self, files, vocab_size: int | None = None):
        import glob

        import h5py

        if isinstance(files, (str, os.PathLike)):
            p = Path(files)
            files = (sorted(str(f) for f in p.iterdir() if f.suffix in (".hdf5", ".h5")) if p.is_dir()
                     else sorted(glob.glob(str(files))))
        self.files = [str(f) for f in files]
        if not self.files:
            raise FileNotFoundError(f"no MLPerf HDF5 files at {files}; see the MLPerf BERT reference "
                                    "(mlcommons/training language_model) for how they are made")
        self.vocab_size, sizes = vocab_size, []
        for f in self.files:
            with h5py.File(f, "r") as h:
                missing = [k for k in MLPERF_KEYS if k not in h]
                if missing:
                    raise ValueError(f"corrupted MLPerf record file {f}: missing arrays {missing}")
                n = len(h["input_ids"])
                bad = [k for k in MLPERF_KEYS if len(h[k]) != n]
                if bad or h["input_mask"].shape != h["input_ids"].shape != h["segment_ids"].shape:
                    raise ValueError(f"corrupted MLPerf record file {f}: arrays {bad or MLPERF_KEYS[:3]} "
                                     f"disagree in shape with input_ids {h['input_ids'].shape}")
                self.max_seq_len = h["input_ids"].shape[1]
                sizes.append(n)
        self.cum = np.concatenate([[0], np.cumsum(sizes)])
        self._h = {}

    def __len__(self):
        return int(self.cum[-1])

    def __getitem__(self, i):
        f = int(np.searchsorted(self.cum, i, side="right") - 1)
        if f not in self._h:  # opened lazily, once per worker process
            import h5py

            self._h[f] = h5py.File(self.files[f], "r")
        h, j = self._h[f], i - int(self.cum[f])
        mask = np.asarray(h["input_mask"][j])
        n = int(mask.sum())
        where = f"record {j} of {self.files[f]}"
        if n < 2 or not mask[:n].all():
            raise ValueError(f"corrupted MLPerf {where}: input_mask is not a run of ones then zeros")
        ids = np.asarray(h["input_ids"][j][:n], np.int64)
        pos = np.asarray(h["masked_lm_positions"][j], np.int64)
        k = int(np.argmax(pos == 0)) if (pos == 0).any() else len(pos)
        pos, labels = pos[:k], np.asarray(h["masked_lm_ids"][j][:k], np.int64)
        if (pos >= n).any() or (self.vocab_size and (ids.max() >= self.vocab_size or labels.max(initial=0) >= self.vocab_size)):
            raise ValueError(f"corrupted MLPerf {where}: masked positions beyond its {n} tokens or ids beyond the vocabulary")
        return {"input_ids": ids, "token_type_ids": np.asarray(h["segment_ids"][j][:n], np.int64),
                "mlm_positions": pos, "mlm_labels": labels, "nsp_labels": np.int64(h["next_sentence_labels"][j])}


class Collate:
    """Unpadded examples -> one MLMTask batch, padded to `width` (or the batch's longest when width is None)."""

    def __init__(self, width: int | None, max_predictions: int):
        self.width, self.P = width, max_predictions

    def __call__(self, examples):
        w = self.width or max(len(e["input_ids"]) for e in examples)
        B = len(examples)
        ids, types = np.zeros((B, w), np.int64), np.zeros((B, w), np.int64)
        mask = np.zeros((B, w), bool)
        pos, labels = np.zeros((B, self.P), np.int64), np.full((B, self.P), IGNORE, np.int64)
        for b, e in enumerate(examples):
            n, k = len(e["input_ids"]), len(e["mlm_positions"])
            if n > w or k > self.P:
                raise ValueError(f"an example of {n} tokens / {k} predictions exceeds the batch width {w} / "
                                 f"max_predictions {self.P}")
            ids[b, :n], types[b, :n], mask[b, :n] = e["input_ids"], e["token_type_ids"], True
            pos[b, :k], labels[b, :k] = e["mlm_positions"], e["mlm_labels"]
        out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "mlm_positions": pos,
               "mlm_labels": labels, "nsp_labels": np.array([e["nsp_labels"] for e in examples], np.int64)}
        return {k: torch.from_numpy(v) for k, v in out.items()}


class Shuffled(torch.utils.data.Dataset):
    """Training stream: sample i = examples[perm_epoch[i mod n]], a seeded permutation per pass."""

    def __init__(self, examples, seed: int, length: int):
        self.examples, self.seed, self.length = examples, seed, length
        self._epoch, self._perm = -1, None

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        epoch, j = divmod(i, len(self.examples))
        if epoch != self._epoch:
            self._perm, self._epoch = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples)), epoch
        return self.examples[int(self._perm[j])]


def padding_fraction(lengths, width: int | None, batch_size: int, seed: int = 0, batches: int = 200) -> float:
    """Fraction of the padded batch that is padding: at a fixed width, 1 - mean length / width; padded to
    each batch's longest, estimated over `batches` random batches."""
    lengths = np.asarray(lengths)
    if width:
        return float(1 - lengths.mean() / width)
    rng = np.random.default_rng(seed)
    b = lengths[rng.integers(0, len(lengths), (batches, batch_size))]
    return float(1 - b.sum() / (b.max(1) * batch_size).sum())


class BertDataModule(ResumableDataModule):
    """MLM + NSP batches from prepared arrays (format=prepared: embedded, corpus, wikipedia) or MLPerf HDF5
    records (format=mlperf_hdf5: train_files, eval_files). Resumable like the others (sample i is a pure
    function of (seed, i)). `seq_len` is the model's position table (and the prepared sequence length):
    longer data fails here. max_predictions None: floor(0.15 x seq_len), MLPerf's 76 at 512."""

    def __init__(self, format: str = "prepared", source: str = "embedded", data_dir: str | None = None,
                 seq_len: int = 512, max_predictions: int | None = None, pad_to_longest: bool = False,
                 vocab_size: int = 30522, train_files=None, eval_files=None, batch_size: int = 8,
                 eval_batch_size: int | None = None, num_workers: int = 2, seed: int = 1234,
                 num_samples: int | None = None, prepare: dict | None = None, hf_path: str | None = None,
                 hf_name: str | None = None, hf_data_files=None, prepare_num_proc: int | None = None):
        super().__init__(batch_size, eval_batch_size, num_workers, seed, num_samples)
        if format not in ("prepared", "mlperf_hdf5"):
            raise ValueError(f"unknown format {format!r}; choose prepared or mlperf_hdf5")
        if format == "prepared" and source not in PREPARE_CMD:
            raise ValueError(f"unknown source {source!r}; choose from {sorted(PREPARE_CMD)}")
        self.format, self.source, self.data_dir = format, source, data_dir
        max_predictions = max_predictions or max_predictions_for(seq_len)
        self.max_seq_len, self.max_predictions, self.pad_to_longest = seq_len, max_predictions, pad_to_longest
        self.vocab_size, self.train_files, self.eval_files = vocab_size, train_files, eval_files
        self.settings = Settings(**{"max_seq_len": seq_len, "max_predictions": max_predictions, **(prepare or {})})
        self.read_kwargs = {k: v for k, v in dict(hf_path=hf_path, hf_name=hf_name, hf_data_files=hf_data_files).items()
                            if v is not None}
        self.prepare_num_proc = prepare_num_proc

    @property
    def how(self) -> str:
        """The command that prepares this data module's folder."""
        if self.source not in PREPARE_CMD:
            return ""
        return PREPARE_CMD[self.source] + (f" --max-seq-len {self.max_seq_len}" if self.max_seq_len != 512 else "")

    def prepare_data(self):
        # the committed corpus and HF datasets prepare on first use; the registry corpus is fetched explicitly
        if self.format == "prepared" and self.source in ("embedded", "wikipedia"):
            prepare(self.source, self.data_dir, self.settings, num_proc=self.prepare_num_proc, **self.read_kwargs)

    def setup(self, stage=None):
        if self.format == "prepared":
            self.train_set = PreparedExamples(self.data_dir, "train", self.how, self.vocab_size)
            self.val_set = PreparedExamples(self.data_dir, "val", self.how, self.vocab_size)
            data_len = self.train_set.max_seq_len
        else:
            if not self.train_files or not self.eval_files:
                raise ValueError("format=mlperf_hdf5 needs data.train_files and data.eval_files (MLPerf's records)")
            self.train_set = MLPerfHDF5Examples(self.train_files, self.vocab_size)
            self.val_set = MLPerfHDF5Examples(self.eval_files, self.vocab_size)
            data_len = self.train_set.max_seq_len
        if data_len > self.max_seq_len:
            raise ValueError(f"the data holds sequences up to {data_len} tokens but the model has {self.max_seq_len} "
                             f"positions; use model.max_positions={data_len} or prepare shorter data "
                             f"({PREPARE_CMD.get(self.source, PREPARE_CMD['embedded'])} --max-seq-len {self.max_seq_len})")
        lengths = getattr(self.train_set, "lengths", None)
        if lengths is not None:
            self.padding_fraction = padding_fraction(lengths, None if self.pad_to_longest else self.max_seq_len,
                                                     self.batch_size, self.seed)
            print(f"BERT data {self.data_dir}: {len(self.train_set)} train / {len(self.val_set)} eval examples, "
                  f"mean length {lengths.mean():.0f}, padding fraction "
                  f"{'(batch-longest)' if self.pad_to_longest else f'(width {self.max_seq_len})'} "
                  f"{self.padding_fraction:.3f}")

    def _collate(self):
        return Collate(None if self.pad_to_longest else self.max_seq_len, self.max_predictions)

    def _loader(self, ds, batch_size, sampler=None):
        return torch.utils.data.DataLoader(
            ds, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers, collate_fn=self._collate(),
            pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0, worker_init_fn=own_process_group)

    def train_dataloader(self):
        return self.train_loader(Shuffled(self.train_set, self.seed, self.num_samples or 10**12))

    def val_dataloader(self):
        return self.eval_loader(self.val_set)
