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
    batch = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert batch["input_ids"].shape == (4, seq_len) and batch["labels"].shape == (4,)
    assert ("attention_mask" in batch) == (task != "image")
    first = [dm.train_dataloader().dataset[i]["labels"].item() for i in range(12)]
    dm.samples_seen = 8
    resumed = [b["labels"].tolist() for b in dm.train_dataloader()][0]
    assert resumed == first[8:12]


# ------------------------------------------------------------------------------ capped folders (--num-*)

def _fake_spamassassin(root, n_ham=30, n_spam=20):
    base = root / "package/spam-assassin/data"
    for g, n, word in (("easy-ham-1", n_ham, b"meeting"), ("spam-1", n_spam, b"offer")):
        (base / g).mkdir(parents=True)
        for i in range(n):
            (base / g / f"{i:05d}.txt").write_bytes(b"From: x@y\n\n" + word + b" number %d " % i + b"x" * (20 + i))
    return root


def _split_texts(folder, split):
    z = np.load(folder / f"{split}.npz")
    o = z["offsets"]
    return [bytes(z["tokens"][o[i]:o[i + 1]]) for i in range(len(o) - 1)], z["labels"].tolist()


def test_text_caps_keep_a_seeded_subset_and_change_the_stamp(tmp_path):
    src = _fake_spamassassin(tmp_path / "src")
    full = text.prepare_spamassassin(src, tmp_path / "full", seed=0)
    capped = text.prepare_spamassassin(src, tmp_path / "capped", seed=0, num_train=10, num_val=2, num_test=3)
    assert (capped["train_examples"], capped["val_examples"], capped["test_examples"]) == (10, 2, 3)
    assert capped["caps"] == {"train": 10, "val": 2, "test": 3} and "caps" not in full
    assert capped["stamp"] != full["stamp"]
    for split in ("train", "val", "test"):
        sub, _ = _split_texts(tmp_path / "capped", split)
        whole, _ = _split_texts(tmp_path / "full", split)
        assert set(sub) <= set(whole)  # a subset of the full split: no example moves between splits
    # the sources list ham first: a seeded subset, not the first ten in file order, keeps both classes
    assert set(_split_texts(tmp_path / "capped", "train")[1]) == {0, 1}
    again = text.prepare_spamassassin(src, tmp_path / "again", seed=0, num_train=10, num_val=2, num_test=3)
    assert _split_texts(tmp_path / "again", "train") == _split_texts(tmp_path / "capped", "train")
    assert again["stamp"] == capped["stamp"]
    # a capped folder is never taken for the full one (nor for other caps): it is rebuilt
    assert text.prepare_spamassassin(src, tmp_path / "capped", seed=0)["train_examples"] == full["train_examples"]
    # a cap above the split's size keeps the whole split
    big = text.prepare_spamassassin(src, tmp_path / "big", seed=0, num_train=10_000)
    assert big["train_examples"] == full["train_examples"] and big["stamp"] != full["stamp"]


def test_image_caps_on_fashion_mnist_files(tmp_path):
    import gzip

    def idx(path, arr):
        with gzip.open(path, "wb") as f:
            f.write(b"\0\0\x08" + bytes([arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
                    + arr.tobytes())

    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    src.mkdir()
    for stem, n in (("train", 40), ("t10k", 12)):
        idx(src / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28), dtype=np.uint8))
        idx(src / f"{stem}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
    full = image.prepare_fashion_mnist(src, tmp_path / "full")
    assert (full["train_examples"], full["val_examples"], full["test_examples"]) == (36, 4, 12)
    capped = image.prepare_fashion_mnist(src, tmp_path / "capped", num_train=8, num_test=5)
    assert (capped["train_examples"], capped["val_examples"], capped["test_examples"]) == (8, 4, 5)
    assert capped["stamp"] != full["stamp"] and capped["caps"] == {"train": 8, "test": 5}
    a, b = np.load(tmp_path / "full/train.npz"), np.load(tmp_path / "capped/train.npz")
    rows = {x.tobytes() for x in a["images"]}
    assert all(x.tobytes() in rows for x in b["images"])
    dm = LRADataModule("image", tmp_path / "capped", seq_len=1025, batch_size=4, num_workers=0)
    dm.setup()
    assert len(dm.splits["train"]) == 8 and len(dm.splits["test"]) == 5


def test_retrieval_caps_fixture_and_aan(tmp_path):
    m = retrieval.fixture(tmp_path / "fx", n=60, num_train=10, num_val=3)
    assert (m["train_examples"], m["val_examples"], m["test_examples"]) == (10, 3, 6)
    assert m["stamp"] != retrieval.fixture(tmp_path / "fx-full", n=60)["stamp"]
    for f in retrieval.AAN_FILES.values():
        (tmp_path / f).write_bytes(b"".join(b"%d\tP\tQ\tdoc %d\tother %d\n" % (i % 2, i, i) for i in range(9)))
    aan = retrieval.prepare_aan(tmp_path, tmp_path / "aan", num_train=4)
    assert (aan["train_examples"], aan["val_examples"], aan["caps"]) == (4, 9, {"train": 4})
    dm = LRADataModule("retrieval", tmp_path / "aan", seq_len=8, batch_size=2)
    dm.setup()
    assert len(dm.splits["train"]) == 4


def test_text_fixture_caps_through_the_cli(tmp_path, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import prepare_lra

    meta = prepare_lra.main(["text", "--source", "fixture", "--fixture-n", "40", "--num-train", "7",
                             "--num-test", "2", "--out", str(tmp_path / "t")])
    assert (meta["train_examples"], meta["val_examples"], meta["test_examples"]) == (7, 4, 2)
    meta = prepare_lra.main(["image", "--source", "fixture", "--num-val", "3", "--out", str(tmp_path / "i")])
    assert meta["val_examples"] == 3
    for bad in (["text", "--num-train", "0"], ["image", "--num-val", "-5"], ["listops", "--num-test", "x"],
                ["pathfinder", "--num", "0"]):
        with pytest.raises(SystemExit):
            prepare_lra.main([*bad, "--out", str(tmp_path / "bad")])
        assert "positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prepare_lra.main(["pathfinder", "--num-train", "5", "--out", str(tmp_path / "bad")])
    assert "--num sets the images" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_caps_must_be_positive_integers(tmp_path, bad):
    with pytest.raises(ValueError, match="positive integer"):
        text.fixture(tmp_path, num_train=bad)
    with pytest.raises(ValueError, match="num_val must be a positive integer"):
        listops.generate(tmp_path, num_train=4, num_val=bad, num_test=4)
    with pytest.raises(ValueError, match="positive integer"):
        retrieval.fixture(tmp_path, num_test=bad)
    with pytest.raises(ValueError, match="positive integer"):
        image.fixture(tmp_path, num_train=bad)


def test_linux_doc_pairs_index_one_document_table(tmp_path):
    """The stand-in keeps each document once per split and the pairs as row numbers; the datamodule
    resolves them to the same two documents the pairing chose."""
    import gzip

    base = tmp_path / "src" / "usr/share/doc/linux-doc-6.1/Documentation"
    for sec in ("net", "fs", "mm"):
        (base / sec).mkdir(parents=True)
        for k in range(12):
            with gzip.open(base / sec / f"d{k}.rst.gz", "wb") as f:
                f.write(f"{sec} document {k} ".encode() * (k + 1))
    meta = retrieval.prepare_linux_doc(tmp_path / "src", tmp_path / "out", num_train=40, num_val=10, num_test=10)
    assert meta["documents"] == 36 and meta["train_examples"] == 40 and meta["train_documents"] <= 36
    z = np.load(tmp_path / "out" / "train.npz")
    assert len(z["offsets"]) == meta["train_documents"] + 1 and len(z["doc_1"]) == len(z["labels"]) == 40
    dm = LRADataModule("retrieval", tmp_path / "out", seq_len=64, batch_size=4, cls_token=False)
    dm.setup()
    train = dm.splits["train"]
    for i in range(len(train)):
        item = train[i]
        one, two = (bytes((item[k][item[m]] - 1).tolist()).decode() for k, m in
                    (("input_ids", "attention_mask"), ("input_ids_2", "attention_mask_2")))
        assert one != two  # distinct documents
        assert (one.split()[0] == two.split()[0]) == bool(item["labels"])  # label 1: same section
    # val and test documents are never seen in training (documents split before pairing)
    texts = {s: {bytes(np.load(tmp_path / "out" / f"{s}.npz")["tokens"][a:b]) for a, b in
                 zip(np.load(tmp_path / "out" / f"{s}.npz")["offsets"][:-1],
                     np.load(tmp_path / "out" / f"{s}.npz")["offsets"][1:])} for s in ("train", "val", "test")}
    assert not texts["train"] & texts["val"] and not texts["train"] & texts["test"]
    # prepared again: a no-op
    assert retrieval.prepare_linux_doc(tmp_path / "src", tmp_path / "out", num_train=40, num_val=10,
                                       num_test=10)["stamp"] == meta["stamp"]


@pytest.mark.parametrize("task", ["image", "pathfinder"])
def test_pixel_batches_come_whole_from_the_arrays_in_each_passs_order(tmp_path, task):
    """Pixel tasks fetch a batch in one gather (__getitems__); check it against the arrays themselves,
    across the boundary where the training stream's second pass (a new permutation) starts."""
    import torch

    from train.lra.datamodule import PIXEL_CLS, auto_prepare

    auto_prepare(task, tmp_path)
    cls = task == "image"
    dm = LRADataModule(task, tmp_path, seq_len=1025 if cls else 1024, cls_token=cls, batch_size=6, num_workers=0,
                       seed=3, num_samples=10**6)
    dm.setup()
    split, loader = dm.splits["train"], dm.train_dataloader()
    n = len(split.index)
    items = list(range(n - 3, n + 3))
    raw = next(iter(torch.utils.data.DataLoader(loader.dataset, batch_size=6, sampler=items,
                                                collate_fn=loader.collate_fn)))
    assert raw["pixels"].dtype == torch.uint8  # what crosses to the device: 1 byte a pixel
    batch = dm.on_after_batch_transfer(raw, 0)
    perms = [np.random.default_rng([3, epoch]).permutation(n) for epoch in (0, 1)]
    rows = [split.index[perms[i // n][i % n]] for i in items]
    want = np.asarray(split.images)[rows].reshape(6, -1).astype(np.int64)
    if cls:
        want = np.concatenate([np.full((6, 1), PIXEL_CLS), want], axis=1)
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].tolist() == want.tolist()
    assert batch["labels"].tolist() == [int(split.labels[r]) for r in rows]
    one = split[int(np.flatnonzero(split.index == rows[0])[0])]  # a single sample: the same row, unbatched
    assert one["input_ids"].tolist() == want[0].tolist() and one["labels"].shape == ()
