"""BERT pretraining data: the WordPiece vocabulary, MLPerf-style example rules, caching, determinism,
MLPerf HDF5 records, the Wikipedia (HF datasets) path on local stand-in files, the datamodule's batches
and its clear errors."""
import gzip
import hashlib
import json

import numpy as np
import pytest
import torch

from train import bert_data as bd

TEXT = ("The whale rose. It was white! Ahab saw it from the deck, and he cried out loud. The crew ran. "
        "Nobody slept that night? Morning came at last.\n\nA new paragraph starts here. It has two sentences.")
SMALL = bd.Settings(max_seq_len=48, max_predictions=7, dupe_factor=2, val_fraction=0.2, eval_samples=50, seed=3)


def _docs(n=12, seed=0):
    """n documents of varied sentence counts and lengths, from the committed corpus' first chapters."""
    with gzip.open(bd.EMBEDDED, "rt") as f:
        real = [json.loads(line)["text"] for line in f][-n:]  # Moby Dick chapters: short documents
    return real


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("bert") / "small"
    meta = bd.prepare_examples(_docs(), out, SMALL, stamp="s1", num_proc=1)
    return out, meta


def test_vocab_is_bert_base_uncased():
    data = bd.VOCAB.read_bytes()
    assert hashlib.md5(data).hexdigest() == "64800d5d8528ce344256daf115d4965e"
    assert len(data.decode().splitlines()) == 30522
    assert bd.wordpiece().encode("Hello, World!", add_special_tokens=False).ids == [7592, 1010, 2088, 999]


def test_sentence_split():
    s = bd.split_sentences(TEXT)
    assert s[:3] == ["The whale rose.", "It was white!", "Ahab saw it from the deck, and he cried out loud."]
    assert s[-2:] == ["A new paragraph starts here.", "It has two sentences."] and len(s) == 8


def test_examples_follow_the_mlperf_rules(prepared):
    out, meta = prepared
    ds = bd.PreparedExamples(out, "train", vocab_size=30522)
    assert len(ds) == meta["train"]["examples"] > 200
    lengths, n_masked, n_pred, nsp = [], 0, 0, []
    for i in range(len(ds)):
        e = ds[i]
        ids, types, pos, lab = e["input_ids"], e["token_type_ids"], e["mlm_positions"], e["mlm_labels"]
        n = len(ids)
        lengths.append(n)
        assert ids[0] == bd.CLS and ids[-1] == bd.SEP and (ids == bd.SEP).sum() >= 2 and n <= 48
        first_sep = int(np.argmax(types == 1)) - 1  # [CLS] A [SEP] are type 0, B [SEP] type 1
        assert types[0] == 0 and types[-1] == 1 and ids[first_sep] == bd.SEP and (types[:first_sep + 1] == 0).all()
        assert len(pos) == min(7, max(1, round(n * 0.15))) and (np.diff(pos) > 0).all()
        assert not np.isin(pos, [0, first_sep, n - 1]).any()  # specials are never predicted
        assert (lab != bd.MASK).all() and (lab >= 999).mean() > 0.9  # labels are the original words
        n_masked += (ids[pos] == bd.MASK).sum()
        n_pred += len(pos)
        nsp.append(int(e["nsp_labels"]))
    lengths = np.array(lengths)
    assert 0.7 < n_masked / n_pred < 0.9  # 80% [MASK]
    assert 0.4 < np.mean(nsp) < 0.75      # 50% random next sentence (+ forced for one-sentence chunks)
    assert (lengths < 48).mean() > 0.01   # natural lengths (short targets, document ends): real padding
    assert meta["train"]["padding_fraction"] == pytest.approx(1 - lengths.mean() / 48)
    assert meta["val"]["examples"] > 0 and meta["val_documents"] == round(0.2 * meta["documents"])
    assert meta["train"]["truncated_tokens"] > 0  # long sentences at 48 tokens: counted, not silent


def test_cached_idempotent_and_independent_of_process_count(prepared, tmp_path, capsys):
    out, _ = prepared
    before = (out / "train" / "input_ids.npy").stat().st_mtime_ns
    bd.prepare_examples(_docs(), out, SMALL, stamp="s1", num_proc=1)
    assert "up to date" in capsys.readouterr().out
    assert (out / "train" / "input_ids.npy").stat().st_mtime_ns == before
    bd.prepare_examples(_docs(), tmp_path / "two", SMALL, stamp="s2", num_proc=2)
    for split in ("train", "val"):
        for name in bd.ARRAYS:
            a, b = np.load(out / split / f"{name}.npy"), np.load(tmp_path / "two" / split / f"{name}.npy")
            assert np.array_equal(a, b), (split, name)


def test_stamp_names_contents_and_settings_not_paths(tmp_path):
    a, b = tmp_path / "a" / "c.jsonl", tmp_path / "b" / "c.jsonl"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text(json.dumps({"text": TEXT}) + "\n")
    _, ka = bd.read_texts("corpus", text_file=a)
    _, kb = bd.read_texts("corpus", text_file=b)
    assert bd.make_stamp(ka, SMALL) == bd.make_stamp(kb, SMALL)
    assert bd.make_stamp(ka, SMALL) != bd.make_stamp(ka, bd.Settings(max_seq_len=64))
    b.write_text(json.dumps({"text": TEXT + " More."}) + "\n")
    assert bd.make_stamp(ka, SMALL) != bd.make_stamp(bd.read_texts("corpus", text_file=b)[1], SMALL)


def test_capped_training_split_is_a_subset_with_its_own_stamp(prepared, tmp_path):
    out, meta = prepared
    n = meta["train"]["examples"] // 3
    capped = bd.Settings(**{**bd.asdict(SMALL), "max_train_examples": n})
    cmeta = bd.prepare_examples(_docs(), tmp_path / "capped", capped, stamp="s3", num_proc=1)
    assert cmeta["train"]["examples"] == n and cmeta["train"]["examples_before_cap"] == meta["train"]["examples"]
    full = bd.PreparedExamples(out, "train")
    small = bd.PreparedExamples(tmp_path / "capped", "train")
    whole = {tuple(full[i]["input_ids"]) for i in range(len(full))}
    assert all(tuple(small[i]["input_ids"]) in whole for i in range(len(small)))
    for name in bd.ARRAYS:  # the evaluation split is untouched by the cap
        assert np.array_equal(np.load(out / "val" / f"{name}.npy"), np.load(tmp_path / "capped" / "val" / f"{name}.npy"))
    assert bd.make_stamp("x", capped) != bd.make_stamp("x", SMALL)
    with pytest.raises(ValueError, match="max_train_examples"):
        bd.Settings(max_train_examples=0).check()


def test_a_folder_of_another_source_is_not_rebuilt(prepared, tmp_path):
    import shutil

    out, _ = prepared
    other = tmp_path / "other"
    shutil.copytree(out, other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps(dict(meta, source="corpus")))
    before = (other / "train" / "input_ids.npy").read_bytes()
    with pytest.raises(ValueError, match="prepared from source 'corpus', not 'embedded'"):
        bd.prepare_examples(_docs(), other, SMALL, stamp="another", num_proc=1, source="embedded")
    assert (other / "train" / "input_ids.npy").read_bytes() == before


def test_truncation_is_counted_and_printed(tmp_path, capsys):
    long_sentence = " ".join(["word"] * 300) + "."
    texts = [long_sentence + " " + TEXT, TEXT, TEXT.replace("whale", "shark")]
    meta = bd.prepare_examples(texts, tmp_path / "t", bd.Settings(max_seq_len=32, max_predictions=4, dupe_factor=1,
                                                                  val_fraction=0.0001), stamp="t", num_proc=1)
    assert meta["train"]["truncated_tokens"] >= 300 - 29
    assert "trimmed" in capsys.readouterr().out


def test_wikipedia_path_on_a_local_parquet(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    texts = _docs(6)
    pq.write_table(pa.table({"id": list(range(6)), "text": texts}), tmp_path / "wiki.parquet")
    settings = bd.Settings(max_seq_len=64, max_predictions=9, dupe_factor=1, val_fraction=0.2)
    meta = bd.prepare("wikipedia", tmp_path / "out", settings, num_proc=1, hf_path="parquet",
                      hf_data_files=str(tmp_path / "wiki.parquet"))
    assert meta["documents"] == 6 and meta["source"] == "wikipedia" and meta["train"]["examples"] > 10
    # the same text through the committed-corpus path gives the same examples (one pipeline)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    bd.prepare("corpus", tmp_path / "c", settings, num_proc=1, text_file=tmp_path / "c.jsonl")
    assert np.array_equal(np.load(tmp_path / "out/train/input_ids.npy"), np.load(tmp_path / "c/train/input_ids.npy"))


def _dm(folder, **kw):
    args = dict(format="prepared", source="corpus", data_dir=str(folder), seq_len=48, max_predictions=7,
                batch_size=4, num_workers=0, seed=5)
    args.update(kw)
    dm = bd.BertDataModule(**args)
    dm.setup()
    return dm


def test_datamodule_batches_and_resume(prepared):
    out, meta = prepared
    dm = _dm(out, num_samples=40)
    assert dm.padding_fraction == pytest.approx(meta["train"]["padding_fraction"])
    batches = list(dm.train_dataloader())
    b = batches[0]
    assert b["input_ids"].shape == (4, 48) and b["mlm_positions"].shape == b["mlm_labels"].shape == (4, 7)
    lens = b["attention_mask"].sum(1)
    for i in range(4):
        assert b["input_ids"][i, lens[i]:].eq(0).all() and b["input_ids"][i, lens[i] - 1] == bd.SEP
        k = (b["mlm_labels"][i] != bd.IGNORE).sum()
        assert (b["mlm_positions"][i, :k] < lens[i]).all() and b["mlm_labels"][i, :k].ge(0).all()
    assert b["nsp_labels"].dtype == torch.int64 and b["attention_mask"].dtype == torch.bool
    # resume: a datamodule that has seen 20 samples continues with sample 20
    dm2 = _dm(out, num_samples=40)
    dm2.load_state_dict({"samples_seen": 20})
    torch.testing.assert_close(next(iter(dm2.train_dataloader()))["input_ids"], batches[5]["input_ids"])
    # padded to each batch's longest instead
    dm3 = _dm(out, num_samples=8, pad_to_longest=True)
    for b in dm3.train_dataloader():
        assert b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max())
    assert 0 <= dm3.padding_fraction <= 1 - 45 / 48  # an estimate over random batches; few lengths here are short
    val = next(iter(dm.val_dataloader()))
    assert val["input_ids"].shape[1] == 48


def test_clear_errors(prepared, tmp_path):
    out, _ = prepared
    with pytest.raises(FileNotFoundError, match="python scripts/prepare_bert.py --source corpus"):
        _dm(tmp_path / "nothing")
    with pytest.raises(ValueError, match="up to 48 tokens but the model has 32 positions"):
        _dm(out, seq_len=32)
    with pytest.raises(FileNotFoundError, match="data/bert/vocab.txt"):
        bd.check_vocab(tmp_path / "vocab.txt")
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    off = np.load(bad / "train" / "offsets.npy")
    off[3] = off[2]  # an empty record
    np.save(bad / "train" / "offsets.npy", off)
    with pytest.raises(ValueError, match=r"corrupted prepared data .*offsets.*prepare_bert.py --source corpus"):
        _dm(bad)
    (bad / "val" / "mlm_ids.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(bad / "train" / "offsets.npy", np.load(out / "train" / "offsets.npy"))
    with pytest.raises(ValueError, match="corrupted record file .*mlm_ids.npy"):
        _dm(bad)


def _write_h5(path, n=3, width=32, P=5, corrupt=None):
    import h5py

    rng = np.random.default_rng(0)
    lengths = [32, 20, 9][:n]
    ids = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), np.int8)
    seg = np.zeros((n, width), np.int8)
    pos = np.zeros((n, P), np.int32)
    mids = np.zeros((n, P), np.int32)
    for i, L in enumerate(lengths):
        ids[i, :L] = rng.integers(1000, 30000, L)
        ids[i, 0], ids[i, L - 1] = bd.CLS, bd.SEP
        mask[i, :L] = 1
        seg[i, L // 2:L] = 1
        k = min(P, max(1, L // 7))
        pos[i, :k] = np.sort(rng.choice(np.arange(1, L - 1), k, replace=False))
        mids[i, :k] = rng.integers(1000, 30000, k)
    arrays = dict(input_ids=ids, input_mask=mask, segment_ids=seg, masked_lm_positions=pos, masked_lm_ids=mids,
                  next_sentence_labels=np.array([0, 1, 0][:n], np.int8))
    if corrupt == "mask":
        arrays["input_mask"][1, 3] = 0
    if corrupt == "key":
        arrays.pop("segment_ids")
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
    return arrays, lengths


def test_mlperf_hdf5_records(tmp_path):
    pytest.importorskip("h5py")
    (tmp_path / "train").mkdir()
    arrays, lengths = _write_h5(tmp_path / "train" / "part-00000.hdf5")
    _write_h5(tmp_path / "train" / "part-00001.hdf5", n=2)
    _write_h5(tmp_path / "eval.hdf5")
    ds = bd.MLPerfHDF5Examples(tmp_path / "train", vocab_size=30522)
    assert len(ds) == 5 and ds.max_seq_len == 32
    e = ds[1]
    assert len(e["input_ids"]) == 20 and np.array_equal(e["input_ids"], arrays["input_ids"][1, :20])
    k = min(5, max(1, 20 // 7))
    assert np.array_equal(e["mlm_positions"], arrays["masked_lm_positions"][1, :k]) and int(e["nsp_labels"]) == 1
    batch = bd.Collate(32, 5)([ds[i] for i in range(3)])
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["mlm_labels"][2] != bd.IGNORE).sum() == 1  # length 9: one prediction, the rest ignored
    torch.testing.assert_close(batch["token_type_ids"][0], torch.from_numpy(arrays["segment_ids"][0]).long())
    dm = bd.BertDataModule(format="mlperf_hdf5", source="mlperf", train_files=str(tmp_path / "train"),
                           eval_files=str(tmp_path / "eval.hdf5"), seq_len=32, max_predictions=5, batch_size=2,
                           num_workers=0, num_samples=4)
    dm.setup()
    assert next(iter(dm.train_dataloader()))["input_ids"].shape == (2, 32)
    with pytest.raises(ValueError, match="32 tokens but the model has 16 positions"):
        bd.BertDataModule(format="mlperf_hdf5", source="mlperf", train_files=str(tmp_path / "train"),
                          eval_files=str(tmp_path / "eval.hdf5"), seq_len=16).setup()
    _write_h5(tmp_path / "bad.hdf5", corrupt="mask")
    with pytest.raises(ValueError, match="corrupted MLPerf record 1 of .*bad.hdf5: input_mask"):
        bd.MLPerfHDF5Examples(tmp_path / "bad.hdf5")[1]
    _write_h5(tmp_path / "nokey.hdf5", corrupt="key")
    with pytest.raises(ValueError, match=r"nokey.hdf5: missing arrays \['segment_ids'\]"):
        bd.MLPerfHDF5Examples(tmp_path / "nokey.hdf5")
    with pytest.raises(FileNotFoundError, match="no MLPerf HDF5 files"):
        bd.MLPerfHDF5Examples(tmp_path / "nothing*.hdf5")


def test_prepare_script_cli(tmp_path, monkeypatch, capsys):
    """scripts/prepare_bert.py end to end on a local stand-in for Wikipedia (the hub path with local files)."""
    pytest.importorskip("pyarrow")
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, str(bd.REPO / "scripts"))
    import prepare_bert

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    pq.write_table(pa.table({"text": _docs(5)}), tmp_path / "w.parquet")
    argv = ["--source", "wikipedia", "--hf-path", "parquet", "--hf-data-files", str(tmp_path / "w.parquet"),
            "--out", str(tmp_path / "out"), "--max-seq-len", "64", "--dupe-factor", "1", "--num-proc", "1",
            "--val-fraction", "0.2"]
    prepare_bert.main(argv)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["settings"]["max_predictions"] == 9 and meta["settings"]["max_seq_len"] == 64
    capsys.readouterr()
    prepare_bert.main(argv)  # idempotent
    assert "up to date" in capsys.readouterr().out
