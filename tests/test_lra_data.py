"""LRA data: ListOps in LRA's format with every label equal to its expression's value (checked by an
independent evaluator), the original-format loaders on small files written here, and the datamodule's
batches."""
import csv
import pickle

import numpy as np
import pytest

from train.lra import image, listops, retrieval, text
from train.lra.datamodule import LRADataModule


def _value(s: str) -> int:
    """Independent evaluator: parse LRA's parenthesised string recursively (no shared code)."""
    toks = s.replace("(", " ").replace(")", " ").split()
    pos = 0

    def node():
        nonlocal pos
        t = toks[pos]
        pos += 1
        if t.isdigit():
            return int(t)
        args = []
        while toks[pos] != "]":
            args.append(node())
        pos += 1
        a = sorted(args)
        return {"[MIN": a[0], "[MAX": a[-1], "[SM": sum(a) % 10,
                "[MED": (a[len(a) // 2] if len(a) % 2 else (a[len(a) // 2 - 1] + a[len(a) // 2]) // 2)}[t]

    return node()


def test_listops_files_labels_and_lengths(tmp_path):
    listops.generate(tmp_path, num_train=40, num_val=8, num_test=8, seed=3, workers=2, chunk_size=16)
    seen = set()
    for split, n in (("train", 40), ("val", 8), ("test", 8)):
        with open(tmp_path / f"basic_{split}.tsv") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        assert rows[0] == ["Source", "Target"] and len(rows) == n + 1
        for src, tgt in rows[1:]:
            assert _value(src) == int(tgt)
            assert 500 < listops.length_of(src) < 2000
            assert src.startswith("( ") and set(src.split()) <= set(listops.VOCAB) | {"(", ")"}
            seen.add(src)
    assert len(seen) == 56  # no duplicates across the splits
    m = listops.generate(tmp_path, num_train=40, num_val=8, num_test=8, seed=3, workers=2, chunk_size=16)
    assert m["seed"] == 3  # second call: up to date, same meta


def test_listops_worker_count_does_not_change_the_data(tmp_path):
    listops.generate(tmp_path / "a", 12, 2, 2, seed=5, workers=1, chunk_size=4)
    listops.generate(tmp_path / "b", 12, 2, 2, seed=5, workers=3, chunk_size=4)
    assert (tmp_path / "a/basic_train.tsv").read_text() == (tmp_path / "b/basic_train.tsv").read_text()


def test_listops_tokens_and_stack_evaluator():
    s = "( ( ( ( [MED 2 ) 9 ) ( ( [SM 5 ) 7 ] ) ) ] )"
    ids = listops.tokenize(s)
    assert [listops.VOCAB[i] for i in ids] == ["[MED", "2", "9", "[SM", "5", "7", "]", "]"]
    assert listops.evaluate(ids) == _value(s) == 2


def test_spamassassin_reader_drops_headers_and_duplicates(tmp_path):
    base = tmp_path / "package/spam-assassin/data"
    for g, body in (("easy-ham-1", b"see you at the meeting tomorrow"), ("spam-1", b"BUY NOW cheap offer!!!"),
                    ("spam-2", b"BUY NOW cheap offer!!!")):
        (base / g).mkdir(parents=True)
        (base / g / "00001.abc.txt").write_bytes(b"From: x@y\r\nSubject: hi\r\n\r\n" + body)
        (base / g / "00001.abc.json").write_text("{}")
    texts, labels = text.spamassassin_examples(tmp_path)
    assert texts == [b"see you at the meeting tomorrow", b"BUY NOW cheap offer!!!"] and labels == [0, 1]


def test_imdb_through_datasets_on_a_local_stand_in(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    src = tmp_path / "imdb"
    src.mkdir()
    for split, n in (("train", 20), ("test", 6)):
        with open(src / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows([(f"review {i} " + "good " * i, i % 2) for i in range(n)])
    meta = text.prepare_hf(tmp_path / "out", path=str(src), seed=0)
    assert (meta["train_examples"], meta["val_examples"], meta["test_examples"]) == (18, 2, 6)
    z = np.load(tmp_path / "out/test.npz")
    assert bytes(z["tokens"][z["offsets"][1]:z["offsets"][2]]).startswith(b"review 1 good")


def test_aan_tsv_reader(tmp_path):
    for f in retrieval.AAN_FILES.values():
        (tmp_path / f).write_bytes(b"1.0\tP1\tP2\tfirst paper text\tsecond\n0.0\tP3\tP4\tthird\tfourth doc\n")
    meta = retrieval.prepare_aan(tmp_path, tmp_path / "out")
    assert meta["train_examples"] == 2 and meta["source"] == "aan"
    dm = LRADataModule("retrieval", tmp_path / "out", seq_len=8, batch_size=2)
    dm.setup()
    item = dm.splits["train"][0]
    assert item["labels"] == 1 and item["input_ids"][0] == 257  # [CLS]
    assert bytes((item["input_ids"][1:] - 1).tolist()) == b"first p" and item["attention_mask"].all()
    assert bytes((item["input_ids_2"][1:7] - 1).tolist()) == b"second" and not item["attention_mask_2"][-1]


def test_linux_doc_links_resolve(tmp_path):
    docs = {"a/x": "see Documentation/b/y.rst and :doc:`z` and :ref:`Label <lab>`", "a/z": "", "b/y": "",
            "c/w": ".. _lab:\n\nTitle", "d/v": "unlinked"}
    assert retrieval.links("a/x", docs["a/x"], set(docs), retrieval.labels_of(docs)) == {"b/y", "a/z", "c/w"}
    a, b, y = retrieval.link_pairs(docs, seed=0)
    assert sum(y) == 3 and len(y) == 6
    assert all(("a/x" in (p, q)) == bool(lab) or "d/v" in (p, q) for p, q, lab in zip(a, b, y))


def test_fashion_mnist_idx_and_cifar_python(tmp_path):
    import gzip

    imgs = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(b"\0\0\x08\x03" + b"".join(int(d).to_bytes(4, "big") for d in imgs.shape) + imgs.tobytes())
    x = image.read_idx(tmp_path / "train-images-idx3-ubyte.gz")
    assert (x == imgs).all() and (image.pad_to(x)[:, 2:30, 2:30] == imgs).all()
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    rgb = np.zeros((2, 3, 32, 32), np.uint8)
    rgb[1, 0] = 255  # pure red
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(cifar / name, "wb") as f:
            pickle.dump({b"data": rgb.reshape(2, -1), b"labels": [3, 7]}, f)
    tx, ty, vx, vy = image.read_cifar_python(cifar)
    assert tx.shape == (10, 32, 32) and vy.tolist() == [3, 7] and tx[1, 0, 0] == 76 and tx[0].max() == 0


@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image"])
def test_datamodule_batches_and_resume(tmp_path, task):
    from train.lra.datamodule import auto_prepare

    auto_prepare(task, tmp_path, **({"num_train": 16, "num_val": 4, "num_test": 4} if task == "listops" else {}))
    seq_len = 1025 if task == "image" else 64
    dm = LRADataModule(task, tmp_path, seq_len=seq_len, batch_size=4, num_workers=0, seed=1, num_samples=40)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, seq_len) and batch["labels"].shape == (4,)
    assert ("attention_mask" in batch) == (task != "image")
    first = [dm.train_dataloader().dataset[i]["labels"].item() for i in range(12)]
    dm.samples_seen = 8
    resumed = [b["labels"].tolist() for b in dm.train_dataloader()][0]
    assert resumed == first[8:12]
