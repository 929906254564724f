"""Tokenizer, text -> memmap pipeline (split, idempotence, contents), samplers, clear data errors."""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from train.data import (EOT_ID, EvalWindows, ResumableSampler, TrainWindows, decode, encode, load_tokens,
                        split_documents, tokenize_to_memmaps)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

TEXTS = [f"Document {i}: the quick brown fox jumps over {i} lazy dogs.\nSecond line, café ☕." for i in range(40)]


def test_tokenizer_matches_gpt2():
    assert encode("Hello world") == [15496, 995]
    assert encode(" Hello") == [18435]
    s = "It's 2026 — naïve café, tabs\tand  spaces."
    assert decode(encode(s)) == s


def _dataset(texts=TEXTS):
    from datasets import Dataset

    return Dataset.from_dict({"text": texts})


def test_memmap_contents_decode_back_and_split_is_fixed(tmp_path):
    meta = tokenize_to_memmaps(_dataset(), tmp_path / "a", val_fraction=0.1, seed=7, stamp="t")
    assert meta["documents"] == 40 and meta["val_documents"] == 4
    train, val = load_tokens(tmp_path / "a", "train"), load_tokens(tmp_path / "a", "val")
    assert train.dtype == np.uint16 and len(train) == meta["train_tokens"] and len(val) == meta["val_tokens"]
    is_val = split_documents(40, 0.1, 7)
    for split, toks, mask in (("train", train, ~is_val), ("val", val, is_val)):
        docs = decode(toks).split("<|endoftext|>")
        assert docs[-1] == ""  # every document ends with EOT
        assert docs[:-1] == [t for t, m in zip(TEXTS, mask) if m], split
    assert int(train[-1]) == EOT_ID
    # the same seed gives the same split, another seed another one
    tokenize_to_memmaps(_dataset(), tmp_path / "b", val_fraction=0.1, seed=7, stamp="t")
    assert np.array_equal(load_tokens(tmp_path / "b", "val"), val)
    assert not np.array_equal(split_documents(40, 0.1, 8), is_val)
    assert split_documents(1000, 0.005, 2357).sum() == 5


def test_pipeline_is_idempotent_and_parallel_map_agrees(tmp_path):
    tokenize_to_memmaps(_dataset(), tmp_path, val_fraction=0.1, seed=1, stamp="t")
    before = os.stat(tmp_path / "train.bin").st_mtime_ns
    tokenize_to_memmaps(_dataset(), tmp_path, val_fraction=0.1, seed=1, stamp="t")
    assert os.stat(tmp_path / "train.bin").st_mtime_ns == before  # second run: nothing rewritten
    tokenize_to_memmaps(_dataset(), tmp_path / "p", val_fraction=0.1, seed=1, stamp="t", num_proc=2, batch_size=8)
    assert np.array_equal(load_tokens(tmp_path, "train"), load_tokens(tmp_path / "p", "train"))
    # a changed input (another stamp) is rebuilt
    tokenize_to_memmaps(_dataset(TEXTS[:20]), tmp_path, val_fraction=0.1, seed=1, stamp="t2")
    assert json.loads((tmp_path / "meta.json").read_text())["documents"] == 20


def test_openwebtext_path_with_a_local_dataset_standing_in(tmp_path):
    from prepare_corpus import prepare_openwebtext

    src = tmp_path / "owt.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    meta = prepare_openwebtext(tmp_path / "out", num_proc=1, val_fraction=0.05, seed=3,
                               path="json", data_files=str(src))
    assert meta["documents"] == 40 and meta["val_documents"] == 2
    assert decode(load_tokens(tmp_path / "out", "train")).count("<|endoftext|>") == 38


def test_missing_or_empty_data_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/prepare_corpus.py"):
        load_tokens(tmp_path, "train", "corpus")
    with pytest.raises(FileNotFoundError, match="--source openwebtext"):
        load_tokens(tmp_path, "train", "openwebtext")
    (tmp_path / "train.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.*prepare_corpus"):
        load_tokens(tmp_path, "train", "corpus")


def test_train_windows_cover_each_pass_and_are_deterministic():
    toks = np.arange(1001, dtype=np.uint16)
    ds = TrainWindows(toks, seq_len=10, seed=5, length=300)
    assert ds.n_windows == 100
    first = sorted(int(ds[i][0]) for i in range(100))
    assert first == list(range(0, 1000, 10))  # one pass visits every window once
    assert len(ds[0]) == 11 and int(ds[0][-1]) == int(ds[0][0]) + 10
    again = TrainWindows(toks, seq_len=10, seed=5, length=300)
    assert all(int(again[i][0]) == int(ds[i][0]) for i in (250, 3, 120))
    assert [int(ds[i][0]) for i in range(100)] != [int(ds[i][0]) for i in range(100, 200)]  # reshuffled
    ev = EvalWindows(toks, seq_len=10)
    assert len(ev) == 100 and int(ev[99][-1]) == 1000


def test_resumable_sampler():
    assert list(ResumableSampler(10, start=6)) == [6, 7, 8, 9]
    assert list(ResumableSampler(10, start=2, rank=1, world_size=2)) == [3, 5, 7, 9]
    assert len(ResumableSampler(10, start=2, rank=1, world_size=2)) == 5  # the whole epoch: Lightning counts on


def test_cleaning_helpers(tmp_path):
    from prepare_corpus import brown, clean, spam_assassin

    assert clean("a \r\n\r\n\r\n\r\nb  \n") == "a\n\nb"
    d = tmp_path / "package" / "spam-assassin" / "data" / "easy-ham-1"
    d.mkdir(parents=True)
    body = "Hello list,\n\n<p>This is the &amp; body text.</p> " + "words " * 50
    (d / "0001.txt").write_text("From: a@b\nSubject: hi\nX-Spam: no\n\n" + body)
    (d / "0001.json").write_text("{}")
    docs = list(spam_assassin(tmp_path))
    assert len(docs) == 1 and "Subject" not in docs[0][1] and "<p>" not in docs[0][1] and "& body" in docs[0][1]
    b = tmp_path / "package" / "ca01"
    b.write_text("The/at Fulton/np-tl County/nn-tl said/vbd ./.")
    assert list(brown(tmp_path)) == [("brown", "The Fulton County said.")]
