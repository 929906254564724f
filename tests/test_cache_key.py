"""The data cache key names what the data was made from (file names and contents, settings), never where
the checkout lives: a moved or copied checkout finds its tokenized data up to date."""
import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from train.data import file_digest, make_stamp, prepare_embedded

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))


def _files(folder: Path, text="some text\n") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text(text)
    (folder / "vocab.bpe").write_bytes(b"\x00\x01merges")
    return [folder / "corpus.jsonl", folder / "vocab.bpe"]


def test_digest_is_the_same_for_copies_in_different_folders(tmp_path):
    a = _files(tmp_path / "checkout_a" / "data")
    b = _files(tmp_path / "elsewhere" / "deeper" / "copy")
    assert file_digest(a) == file_digest(b)
    assert file_digest(a) == file_digest(list(reversed(b)))  # order of the list does not matter
    assert make_stamp("embedded|" + file_digest(a), 0.02, 2357) == make_stamp("embedded|" + file_digest(b), 0.02, 2357)


def test_digest_changes_with_content_and_names(tmp_path):
    base = file_digest(_files(tmp_path / "a"))
    assert file_digest(_files(tmp_path / "b", text="other text\n")) != base
    renamed = _files(tmp_path / "c")
    renamed[0].rename(renamed[0].with_name("other.jsonl"))
    assert file_digest([renamed[0].with_name("other.jsonl"), renamed[1]]) != base
    assert make_stamp("x|" + base, 0.02, 2357) != make_stamp("x|" + base, 0.05, 2357)  # settings count too


def test_moved_source_is_up_to_date_without_datasets(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    src = tmp_path / "a" / "corpus.jsonl.gz"
    src.parent.mkdir()
    with gzip.open(src, "wt") as f:
        f.write("".join(json.dumps({"text": f"Document {i}, some words."}) + "\n" for i in range(30)))
    out = tmp_path / "cache"
    first = prepare_embedded(out, val_fraction=0.1, source=src)
    before = os.stat(out / "train.bin").st_mtime_ns
    moved = tmp_path / "b" / "c" / "corpus.jsonl.gz"
    moved.parent.mkdir(parents=True)
    shutil.copy(src, moved)
    monkeypatch.setitem(sys.modules, "datasets", None)  # tokenizing again would need it: fail if tried
    assert prepare_embedded(out, val_fraction=0.1, source=moved) == first
    assert os.stat(out / "train.bin").st_mtime_ns == before


def test_local_openwebtext_stand_in_key_ignores_its_folder(tmp_path):
    from prepare_corpus import source_key, write_jsonl

    class Fingerprinted:  # datasets' fingerprint of a local load includes the path: must not be used
        def __init__(self, fp):
            self._fingerprint = fp

    keys = []
    for folder in ("x", "y/z"):
        path = tmp_path / folder / "owt.jsonl.gz"
        write_jsonl([("s", "one document"), ("s", "another one")], path)
        keys.append(source_key("json", {"data_files": str(path)}, Fingerprinted(folder)))
    assert keys[0] == keys[1]
    write_jsonl([("s", "changed")], tmp_path / "x" / "owt.jsonl.gz")
    assert source_key("json", {"data_files": str(tmp_path / "x" / "owt.jsonl.gz")}, Fingerprinted("x")) != keys[0]
